"""The model states a ZeRO-3 rank plan holds under FSDP2's sharding (Parallel(shard="dim0")) against PyTorch's
FSDP2 itself: `fully_shard` on each Linear and the root, Adam, one step, in 2 CPU processes over gloo; each
rank's bytes of parameters, gradients and optimizer state read from its tensors' local shards. The plan is
every rank's, so it holds what the largest rank (the first, whose shards have the most rows) holds."""
import numpy as np
import pytest

import planner
from gloo import spawned

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

IN, HIDDEN, OUT, BATCH, WORLD = 32, 51, 5, 4, 2
"""51 and 5 rows do not split over 2 ranks: the first rank's shards have a row more than the second's."""


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))


def _fsdp2_rank(rank, port, results):
    """One FSDP2 rank: one Adam step on its share of a batch, then the bytes it holds."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        net = model()
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        adam = torch.optim.Adam(net.parameters())
        x, y = torch.randn(BATCH // WORLD, IN), torch.randint(0, OUT, (BATCH // WORLD,))
        torch.nn.functional.cross_entropy(net(x), y).backward()
        adam.step()

        def local(t):
            return t.to_local() if hasattr(t, "to_local") else t
        params = [local(p) for p in net.parameters()]
        results.put((rank, {
            "params": sum(p.untyped_storage().nbytes() for p in params),  # each padded to the largest shard
            "gradients": sum(local(p.grad).nbytes for p in net.parameters()),
            "optimizer": sum(local(v).nbytes for state in adam.state.values() for name, v in state.items()
                             if name != "step"),  # Adam's step counts, a scalar a param, are memplan's one step
            "rows": [p.shape[0] for p in params]}))
    finally:
        dist.destroy_process_group()


def rank_plan(tmp_path, shard):
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(model(), (torch.randn(BATCH // WORLD, IN),), str(path), input_names=["x"], dynamo=False)
    return planner.compile(str(path), {"x": (BATCH // WORLD, IN)}, training=True, optimizer="adam",
                           parallel=planner.Parallel(dp=WORLD, zero=3, shard=shard))


def held(plan):
    """{"params", "gradients", "optimizer"}: the bytes of each one rank of `plan` holds: its param shards, the
    reduce-scattered gradient shards, the optimizer state of its shards."""
    trained = plan.training["params"]
    scattered = [s.outputs[0] for s in plan.steps if s.op == "ReduceScatter"]
    return {"params": sum(plan.tensors[n].nbytes for n in trained),
            "gradients": sum(plan.tensors[n].nbytes for n in scattered),
            "optimizer": sum(t.nbytes for t in plan.tensors.values() if t.kind == "state")}


def test_a_zero_3_rank_plan_holds_what_fsdp2s_largest_rank_holds(tmp_path):
    ranks = [result for _, result in spawned(_fsdp2_rank, WORLD)]
    assert ranks[0]["rows"] == [26, 26, 3, 3] and ranks[1]["rows"] == [25, 25, 2, 2]
    ours = held(rank_plan(tmp_path, "dim0"))
    assert ours == {part: ranks[0][part] for part in ours}
    for rank in ranks[1:]:
        assert all(rank[part] <= ours[part] for part in ours)
    flat = held(rank_plan(tmp_path, "flat"))  # DeepSpeed's even split holds less where rows do not split
    assert flat["params"] < ours["params"] and np.isclose(flat["params"], ours["params"], rtol=0.05)
