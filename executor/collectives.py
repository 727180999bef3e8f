"""Process groups a parallel plan's collectives run in (planner.parallel): `rank`, `size`, and
all_reduce (in place, sum), reduce_scatter (sum of `x` over ranks, this rank's shard into `y`) and
all_gather (the ranks' shards `x` into `y`), on the backend's arrays; `subgroup(partition)` is this rank's
group among a partition of the group's ranks.

`Single` is one rank alone. `TorchDistributed` runs them through torch.distributed's default group (or a
group made from it), as `torchrun` or `init_process_group` set it up (gloo on the CPU; NCCL for CuPy arrays,
passed by DLPack)."""
import numpy as np

from planner.errors import MemplanError
from planner.parallel import piece


class Single:
    """A group of one rank: the collectives copy."""

    rank, size = 0, 1

    def all_reduce(self, x):
        pass

    def reduce_scatter(self, x, y):
        y[...] = x[:y.size]

    def all_gather(self, x, y):
        y[:x.size] = x

    def subgroup(self, partition):
        return self


class TorchDistributed:
    """torch.distributed's default process group, initialized by the caller, or the group `handle` made
    from it."""

    def __init__(self, handle=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized (torchrun, or init_process_group)")
        self.dist, self.handle = dist, handle
        self.rank, self.size = dist.get_rank(handle), dist.get_world_size(handle)

    def subgroup(self, partition):
        """This rank's group among `partition` (lists of the default group's ranks): every list is made a
        group on every rank, in one order, as torch.distributed.new_group requires."""
        mine = self
        for ranks in partition:
            handle = self.dist.new_group(ranks)
            if self.dist.get_rank() in ranks:
                mine = TorchDistributed(handle)
        return mine

    @staticmethod
    def _tensor(x):
        """A torch tensor sharing `x`'s bytes."""
        import torch
        return torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.from_dlpack(x)

    def all_reduce(self, x):
        self.dist.all_reduce(self._tensor(x), group=self.handle)

    def reduce_scatter(self, x, y):
        self.dist.reduce_scatter_tensor(self._tensor(y), self._tensor(x), group=self.handle)

    def all_gather(self, x, y):
        self.dist.all_gather_into_tensor(self._tensor(y), self._tensor(x), group=self.handle)


def layout(plan):
    """(dp, tp): the data- and tensor-parallel ranks of the step `plan` is one rank of."""
    facts = plan.training.get("parallel") or {}
    return facts.get("dp", 1), (plan.training.get("tensor_parallel") or {}).get("tp", 1)


def groups_for(plan, group):
    """{"world", "dp", "tp"}: the groups a plan's collectives run in. "world" is `group` when given, else
    one rank alone for a plan of one rank, else torch.distributed's when initialized; a group of another
    size than the plan's ranks is an error. "dp" and "tp" are this rank's subgroups of it (planner.parallel
    numbers the ranks: dp rank * tp + tp rank)."""
    dp, tp = layout(plan)
    world, what = dp * tp, _ranks(dp, tp)
    if group is None and world > 1:
        try:
            group = TorchDistributed()
        except (ImportError, RuntimeError) as e:
            raise MemplanError(f"the plan is one of {what}; run it in a process group of {world} (torchrun, or "
                               f"torch.distributed.init_process_group): {e}") from None
    group = group or Single()
    if group.size != world:
        raise MemplanError(f"the plan is one of {what}, the process group has {group.size}")
    if dp == 1 or tp == 1:
        return {"world": group, "dp": group, "tp": group}
    return {"world": group, "tp": group.subgroup([[d * tp + t for t in range(tp)] for d in range(dp)]),
            "dp": group.subgroup([[d * tp + t for d in range(dp)] for t in range(tp)])}


def _ranks(dp, tp):
    parts = [f"{dp} data-parallel" if dp > 1 else "", f"{tp} tensor-parallel" if tp > 1 else ""]
    return " x ".join(p for p in parts if p) + " ranks"


def shards(plan, values, groups):
    """The values to load into a rank's arena: this rank's piece of each param tensor parallelism splits,
    and under ZeRO-3 its shard of each sharded param (flattened, the last shard zero-padded); the others
    as they are."""
    split = (plan.training.get("tensor_parallel") or {}).get("split", {})
    sharded = set((plan.training.get("parallel") or {}).get("sharded", ()))
    out = dict(values)
    for name, (dim, blocks) in split.items():
        if name in values:
            out[name] = piece(np.asarray(values[name]), dim, blocks, groups["tp"].rank, groups["tp"].size)
    for name in sharded & set(values):
        flat = np.asarray(out[name]).reshape(-1)
        out[name] = cut(flat, groups["dp"].rank, np.empty(plan.tensors[name].shape[0], flat.dtype))
    return out


def cut(flat, rank, shard):
    """`shard` = rank `rank`'s run of the flattened tensor `flat` (shard.size elements a rank), zeros past
    its end; NumPy or CuPy arrays. Returns `shard`."""
    own = flat[rank * shard.size:(rank + 1) * shard.size]
    shard[:own.size] = own
    shard[own.size:] = 0
    return shard
