"""Data-parallel training plans (planner.parallel, planner/passes/data_parallel.py): one rank's step with its
gradients reduced over the ranks (ZeRO 0), its optimizer state (ZeRO 1), gradients (ZeRO 2) and parameters
(ZeRO 3) sharded; run in 2 and 4 CPU processes over torch.distributed's gloo, the ranks train as one process
on the whole batch."""
import json
import math
import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest

import planner
from executor import Executor
from executor.collectives import Single
from planner.errors import ConfigError, MemplanError, PlanError
from planner.parallel import shard_size
from gloo import spawned
from zoo_cases import input_shapes, small_model

BATCH, STEPS = 8, 3
COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather", "Shard")


def compiled(batch, parallel=None, optimizer="adam", precision="fp32"):
    m = small_model("mlp")
    return planner.compile(m, input_shapes(m, batch), training=True, optimizer=optimizer, parallel=parallel,
                           precision=precision)


def batches(seed=0):
    """STEPS whole batches of the mlp's inputs and labels."""
    rng = np.random.default_rng(seed)
    return [{"input": rng.standard_normal((BATCH, 32), dtype=np.float32), "labels": rng.integers(0, 5, BATCH)}
            for _ in range(STEPS)]


def rank_share(feeds, rank, world):
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    return {name: value[rows] for name, value in feeds.items()}


def test_each_stage_reduces_and_shards_as_it_says():
    plain = compiled(BATCH // 2)
    shapes = {name: tuple(plain.tensors[name].shape) for name in plain.training["params"]}
    for zero in (0, 1, 2):
        plan = compiled(BATCH // 2, planner.Parallel(dp=2, zero=zero))
        ops = [s.op for s in plan.steps if s.op in COLLECTIVES]
        expected = {0: {"AllReduce": 1}, 1: {"AllReduce": 1, "Shard": 2, "AllGather": 1},
                    2: {"ReduceScatter": 1, "Shard": 1, "AllGather": 1}}[zero]
        assert {op: ops.count(op) for op in set(ops)} == {op: n * len(shapes) for op, n in expected.items()}
        states = {t.name: tuple(t.shape) for t in plan.tensors.values() if t.kind == "state"}
        for name, shape in shapes.items():
            for suffix in ("exp_avg", "exp_avg_sq"):
                assert states[f"{name}/{suffix}"] == (shape if zero == 0 else (shard_size(math.prod(shape), 2),))
        assert plan.training["parallel"]["dp"] == 2 and plan.training["parallel"]["collective_bytes"] > 0
        if zero:
            assert plan.breakdown["optimizer"] < plain.breakdown["optimizer"]


def test_zero_3_keeps_a_shard_of_each_param_and_gathers_it_for_each_pass():
    plain = compiled(BATCH // 2)
    plan = compiled(BATCH // 2, planner.Parallel(dp=2, zero=3))
    params = plain.training["params"]
    assert sorted(plan.training["parallel"]["sharded"]) == sorted(params)
    for name in params:
        assert tuple(plan.tensors[name].shape) == (shard_size(math.prod(plain.tensors[name].shape), 2),)
        gathers = [s.phase for s in plan.steps if s.op == "AllGather" and s.inputs[0] == name]
        backward = any(s.phase == "backward" and name in s.inputs for s in plain.steps)
        assert sorted(gathers) == sorted(["", *(["backward"] if backward else [])]), name  # "": the forward pass
    assert not [s for s in plan.steps if s.op == "Shard"]
    assert plan.breakdown["params"] < plain.breakdown["params"]


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_zero_3_gathers_prefetch_params_ahead_of_their_readers(prefetch):
    """Each pass's gathers come in the order their params are first read, param j's before the first reader
    of param j - prefetch (right before its own with none); prefetching holds whole params longer."""
    plan = compiled(BATCH // 2, planner.Parallel(dp=2, zero=3, prefetch=prefetch))
    steps = plan.steps
    for phase in ("", "backward"):
        gathered = {s.outputs[0]: (k, s.inputs[0]) for k, s in enumerate(steps) if s.op == "AllGather"
                    and s.phase == phase}
        first = {}
        for k, s in enumerate(steps):
            for name in s.inputs:
                if name in gathered and s.op != "AllGather":
                    first.setdefault(gathered[name][1], k)
        order = sorted(gathered.values())
        assert [first[p] for _, p in order] == sorted(first.values()), "gathered in the order first read"
        for j, (at, param) in enumerate(order):
            target = first[order[max(0, j - prefetch)][1]]
            assert at < target and all(s.op == "AllGather" for s in steps[at:target]), f"{param}: right before"
    assert compiled(BATCH // 2, planner.Parallel(dp=2, zero=3, prefetch=3)).arena_bytes > \
        compiled(BATCH // 2, planner.Parallel(dp=2, zero=3)).arena_bytes


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_buckets_pack_the_gradients_in_the_order_backward_makes_them(zero):
    """Gradients of one dtype packed in the order the backward pass makes them (the last layer's first), a
    bucket closed once it holds bucket_bytes: each bucket one collective (an all-reduce of the gradients
    flattened side by side; from ZeRO-2 on a reduce-scatter of their shards laid out (world, sum of shards)),
    after its last gradient is made and before any of its params is updated. The same bytes cross the wire;
    the bucket and its pieces are planned tensors, so the arena holds them. (A reduce-scatter's bucket counts
    the padding of its odd-sized gradients, at most a float per rank and gradient.)"""
    reduction = "AllReduce" if zero < 2 else "ReduceScatter"
    plain = compiled(BATCH // 2, planner.Parallel(dp=2, zero=zero))
    whole = compiled(BATCH // 2, planner.Parallel(dp=2, zero=zero, bucket_bytes=1 << 20))
    two = compiled(BATCH // 2, planner.Parallel(dp=2, zero=zero, bucket_bytes=600))
    for plan, buckets, reductions in ((plain, 0, 6), (whole, 1, 1), (two, 2, 3)):
        ops = [s.op for s in plan.steps]
        assert plan.training["parallel"]["buckets"] == buckets and ops.count(reduction) == reductions
        sent = plan.training["parallel"]["collective_bytes"] - plain.training["parallel"]["collective_bytes"]
        assert sent == 0 if zero < 2 else 0 <= sent <= 6 * 4
    made = {o: k for k, s in enumerate(whole.steps) for o in s.outputs}
    concat = next(k for k, s in enumerate(whole.steps) if s.op == "Concat")
    flattened = []
    for name in whole.steps[concat].inputs:  # back through the Reshapes (and Pads) to each gradient
        while whole.steps[made[name]].op in ("Reshape", "Pad"):
            name = whole.steps[made[name]].inputs[0]
        flattened.append(name)
    assert len(flattened) == 6 and flattened == sorted(flattened, key=made.get), "the order they are made"
    updates = [k for k, s in enumerate(whole.steps) if s.op == "Adam"]
    assert min(updates) > concat > max(made[g] for g in flattened)
    assert whole.arena_bytes > plain.arena_bytes


def test_an_uneven_split_pads_the_last_shard_in_planned_scratch():
    plan = compiled(BATCH // 2, planner.Parallel(dp=2, zero=2))
    odd = [s for s in plan.steps if s.op in ("ReduceScatter", "AllGather") and s.workspace]
    assert odd, "the 5-element bias of the last layer splits unevenly over 2 ranks"
    assert all(c.name == "padded" and c.shape == (6,) for s in odd for c in s.scratch)


@pytest.mark.parametrize("zero, bucket_bytes", [(0, 0), (1, 0), (2, 0), (3, 0), (0, 600), (1, 1 << 20), (2, 600),
                                                (3, 1 << 20)])
def test_one_rank_trains_exactly_as_the_plain_plan(zero, bucket_bytes):
    """A plan of one rank in a group of one: the collectives copy, the shard is the whole parameter, a bucket
    gives back the gradients it packed."""
    plain = Executor(compiled(BATCH), backend="numpy")
    alone = Executor(compiled(BATCH, planner.Parallel(dp=1, zero=zero, bucket_bytes=bucket_bytes)), backend="numpy",
                     group=Single())
    for feeds in batches():
        assert alone.train_step(feeds) == plain.train_step(feeds)
    for name, value in plain.parameters().items():
        np.testing.assert_array_equal(alone.parameters()[name].reshape(value.shape), value, err_msg=name)


def test_bad_parallel_options_are_refused():
    for kwargs, message in ((dict(dp=0), "dp must be an int >= 1"), (dict(dp=True), "dp must be an int"),
                            (dict(zero=4), "zero must be one of 0, 1, 2, 3"),
                            (dict(shard="rows"), "shard must be one of flat, dim0"),
                            (dict(prefetch=-1), "prefetch must be an int >= 0"),
                            (dict(zero=2, prefetch=1), "prefetch applies to ZeRO-3"),
                            (dict(dp=2, shard="dim0"), "shard applies from ZeRO-1 on"),
                            (dict(bucket_bytes=-1), "bucket_bytes must be an int >= 0")):
        with pytest.raises(ConfigError, match=message):
            planner.Parallel(**kwargs)
    with pytest.raises(PlanError, match="inference plan takes tensor parallelism alone"):
        planner.compile(small_model("mlp"), parallel=planner.Parallel(dp=2))
    with pytest.raises(MemplanError, match="one of 2 data-parallel ranks"):
        Executor(compiled(BATCH // 2, planner.Parallel(dp=2)), backend="numpy")
    with pytest.raises(MemplanError, match="one of 2 data-parallel ranks, the process group has 1"):
        Executor(compiled(BATCH // 2, planner.Parallel(dp=2)), backend="numpy", group=Single())


def _rank(rank, port, results, world, zero, options):
    """One rank of a gloo group: STEPS training steps on its share of each batch."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        plan = compiled(BATCH // world, planner.Parallel(dp=world, zero=zero, **options))
        ex = Executor(plan, backend="numpy", poison=True)
        losses = [ex.train_step(rank_share(feeds, rank, world)) for feeds in batches()]
        results.put((rank, losses, ex.parameters(), plan.arena_bytes, ex.arena.buffer.nbytes))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.parametrize("world, zero, options", [(2, 0, {}), (2, 1, {}), (2, 2, {}), (2, 3, {}), (4, 2, {}),
                                                 (4, 3, {}), (4, 3, {"shard": "dim0", "prefetch": 2}),
                                                 (2, 0, {"bucket_bytes": 600}), (4, 1, {"bucket_bytes": 1 << 20}),
                                                 (2, 2, {"bucket_bytes": 600}),
                                                 (4, 3, {"bucket_bytes": 1 << 20, "shard": "dim0"})])
def test_ranks_train_as_one_process_on_the_whole_batch(world, zero, options):
    """The ranks' mean loss and their parameters after STEPS adam steps are the single process's on
    the whole batch (each rank's loss is its share's mean; the gradients are averaged)."""
    got = spawned(partial(_rank, world=world, zero=zero, options=options), world)
    single = Executor(compiled(BATCH), backend="numpy")
    losses = [single.train_step(feeds) for feeds in batches()]
    np.testing.assert_allclose(np.mean([g[1] for g in got], axis=0), losses, rtol=1e-5)
    for rank, _, params, planned, held in got:
        assert held == planned, "the rank's arena is the bytes its plan says"
    for name, value in single.parameters().items():
        ranks = [params[name] for _, _, params, _, _ in got]
        if zero == 3:  # each rank holds its shard
            ranks = [np.concatenate(ranks)[:value.size].reshape(value.shape)]
        for rank, param in enumerate(ranks):
            np.testing.assert_allclose(param, value, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}: {name}")


def _amp_rank(rank, port, results):
    """One rank of an amp-fp16 ZeRO-2 pair: a step on its share, then one where rank 1's share overflows
    float16 (inputs 1e4 times larger); the loss scale and params after each."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ex = Executor(compiled(BATCH // 2, planner.Parallel(dp=2, zero=2), "sgd", "amp-fp16"), backend="numpy")
        after = []
        for step, feeds in enumerate(batches()[:2]):
            share = rank_share(feeds, rank, 2)
            if step == 1 and rank == 1:
                share["input"] = share["input"] * 1e4
            ex.train_step(share)
            after.append((ex.loss_scale, ex.parameters()))
        results.put((rank, after))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
def test_amp_fp16_ranks_skip_a_step_together_when_one_overflows():
    """amp-fp16's finite check reads every rank's gradients (their sum all-reduced): when one rank's overflow,
    every rank skips the update and halves its scale, as GradScaler does after DDP's all-reduce."""
    got = dict(spawned(_amp_rank, 2))
    (scale0, first0), (scale1, second0) = got[0]
    (_, first1), (scale2, second1) = got[1]
    assert scale0 == 2.0 ** 16 and scale1 == scale2 == 2.0 ** 15
    for name in first0:
        np.testing.assert_array_equal(second0[name], first0[name], err_msg=f"rank 0 updated {name}")
        np.testing.assert_array_equal(second1[name], first1[name], err_msg=f"rank 1 updated {name}")
        np.testing.assert_array_equal(first0[name], first1[name])


def bn_model():
    """A convolution and a dense layer, each followed by a BatchNormalization (of 4-D and of 2-D input)."""
    from frontends import symbol as S
    rng = np.random.default_rng(0)

    def norm(h, channels, name):
        return S.batch_norm(h, S.param(f"{name}.gamma", rng.uniform(0.5, 1.5, channels).astype(np.float32)),
                            S.param(f"{name}.beta", (rng.normal(size=channels) * 0.1).astype(np.float32)),
                            S.param(f"{name}.mean", np.zeros(channels, np.float32)),
                            S.param(f"{name}.var", np.ones(channels, np.float32)))
    conv = S.conv2d(S.var("input", ("batch", 3, 6, 6)), S.param("conv.w", (rng.normal(size=(4, 3, 3, 3)) * 0.3)
                                                                 .astype(np.float32)), pad=1)
    dense = S.dense(S.flatten(S.relu(norm(conv, 4, "bn"))), S.param("fc.w", (rng.normal(size=(5, 144)) * 0.1)
                                                                    .astype(np.float32)))
    return norm(dense, 5, "bn2")


RUNNING = ("bn.mean", "bn.var", "bn2.mean", "bn2.var")


def bn_batches():
    rng = np.random.default_rng(1)
    return [{"input": rng.standard_normal((BATCH, 3, 6, 6), dtype=np.float32) * 2 + 1,
             "labels": rng.integers(0, 5, BATCH)} for _ in range(STEPS)]


def bn_trained(batch, parallel=None, share=lambda feeds: feeds):
    """The losses, params and running statistics of the BatchNormalization model trained by sgd on `bn_batches`."""
    plan = planner.compile(bn_model(), {"input": (batch, 3, 6, 6)}, training=True, optimizer="sgd",
                           optimizer_args={"lr": 0.5}, parallel=parallel)
    ex = Executor(plan, backend="numpy", poison=True)
    losses = [ex.train_step(share(feeds)) for feeds in bn_batches()]
    return losses, {**ex.parameters(), **{n: ex.arena.view(n).copy() for n in RUNNING}}


def _bn_rank(rank, port, results):
    """One of 2 data ranks trained on its half of each batch, with its BatchNormalizations synchronised and not."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results.put((rank, *(bn_trained(BATCH // 2, planner.Parallel(dp=2, sync_batchnorm=sync),
                                        lambda feeds: rank_share(feeds, rank, 2)) for sync in (True, False))))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
def test_ranks_with_synchronised_batch_statistics_train_as_one_process():
    """With sync_batchnorm each data rank normalises by the whole batch's statistics, all-reduced forward and
    backward (PyTorch's SyncBatchNorm): the ranks' mean loss, params and running statistics are the single
    process's on the whole batch. Without it each rank normalises its own rows (DDP's) and they are not."""
    got = spawned(_bn_rank, 2)
    losses, values = bn_trained(BATCH)
    synced, alone = [g[1] for g in got], [g[2] for g in got]
    np.testing.assert_allclose(np.mean([s[0] for s in synced], axis=0), losses, rtol=1e-5)
    for name, value in values.items():
        for rank, (_, params) in enumerate(synced):
            np.testing.assert_allclose(params[name], value, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}: {name}")
    assert not np.allclose(np.mean([a[0] for a in alone], axis=0), losses, rtol=1e-3)
    assert not np.allclose(alone[0][1]["bn.mean"], values["bn.mean"], rtol=1e-3)


def test_the_report_says_how_data_ranks_normalise(capsys):
    """A data-parallel step of a BatchNormalization model warns that each rank normalises its own rows, and says
    when --sync-batchnorm all-reduces the statistics instead; sync_batchnorm applies to data ranks alone."""
    from planner import cli
    from planner.report import report
    graph = planner.load(bn_model(), {"input": (4, 3, 6, 6)})
    for sync, line in ((False, "warning: BatchNormalization: each of the 2 data-parallel ranks normalises its own "
                               "rows (2 layers, as DDP without SyncBatchNorm)"),
                       (True, "BatchNormalization: 2 layers normalise by the statistics of the whole batch of the 2 "
                              "data-parallel ranks")):
        table = report(graph, strategies=["bestfit"], training=True,
                       parallel=planner.Parallel(dp=2, sync_batchnorm=sync)).table()
        assert line in table
    plan = planner.compile(bn_model(), {"input": (4, 3, 6, 6)}, training=True,
                           parallel=planner.Parallel(dp=2, sync_batchnorm=True))
    assert plan.training["sync_batchnorm"] == {"dp": 2, "layers": 2}
    assert not any(s.op == "BatchNormalization" and s.attrs["training_mode"] for s in plan.steps)
    with pytest.raises(ConfigError, match="sync_batchnorm .* applies with dp > 1"):
        planner.Parallel(sync_batchnorm=True)
    assert cli.main(["report", "zoo:mlp", "--training", "--sync-batchnorm"]) == 2
    assert "--sync-batchnorm say how the ranks of --dp N" in capsys.readouterr().err


def test_the_report_plans_one_rank_from_the_command_line(capsys):
    from planner import cli
    args = ["report", "zoo:mlp", "--batch", "4", "--training", "--optimizer", "adam", "--strategy", "bestfit"]
    assert cli.main([*args, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert cli.main([*args, "--dp", "2", "--zero", "1", "--json"]) == 0
    rank = json.loads(capsys.readouterr().out)
    assert rank["parallel"]["dp"] == 2 and rank["parallel"]["zero"] == 1 and whole["parallel"] is None
    optimizer = [r["update_modes"]["eager"]["breakdown"]["optimizer"] for r in (whole, rank)]
    assert optimizer[1] < optimizer[0]
    ours, paper = rank["parallel"]["model_states"]["plan"], rank["parallel"]["model_states"]["zero_paper"]
    params = rank["trained_params"]
    assert ours["params"] == paper["params"] == 4 * rank["trained_values"]
    assert paper["optimizer"] == 8 * rank["trained_values"] / 2  # Adam's two states, sharded over 2 ranks
    # each of the 2 states of each param: a shard padded by at most one element a rank, 256-byte aligned
    assert paper["optimizer"] <= ours["optimizer"] <= paper["optimizer"] + 2 * params * (256 + 4 * 2)
    assert rank["parallel"]["unsharded"]["arena_bytes"] == whole["rows"][-1]["arena_bytes"]
    assert cli.main([*args, "--dp", "2", "--zero", "2"]) == 0
    assert "one of 2 data-parallel ranks, ZeRO-2" in capsys.readouterr().out
    assert cli.main([*args, "--dp", "2", "--bucket", "1MiB"]) == 0
    assert "gradients reduced in 1 bucket of 1.00 MiB" in capsys.readouterr().out
    assert cli.main(["report", "zoo:mlp", "--dp", "2"]) == 2
    assert "--dp, --zero, --pp, --microbatches, --stage, --shard, --prefetch, --bucket, --sync-batchnorm and " \
        "--sequence-parallel apply with --training (--tp alone" in capsys.readouterr().err


def test_fit_finds_each_layouts_largest_batch(capsys):
    """memplan fit: for each data-parallel layout of --gpus, the largest per-rank batch whose rank plan fits
    --memory (one more does not), largest global batch first."""
    from planner import cli
    assert cli.main(["fit", "zoo:mlp", "--batch", "4", "--gpus", "2", "--memory", "8MiB", "--optimizer", "adam",
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["global_batch"] for r in doc["rows"]] == sorted((r["global_batch"] for r in doc["rows"]), reverse=True)
    rows = [r for r in doc["rows"] if " x " not in r["layout"]]  # the data-parallel ones (test_pipeline: the rest)
    assert len(rows) == 12
    for row in rows:
        zero, remat = int(row["layout"].split("ZeRO-")[1][0]), "sublinear" if "sublinear" in row["layout"] else None
        offload = "optimizer" if row["layout"].endswith("offload") else None

        def arena(batch):
            return planner.compile("zoo:mlp", {"input": (batch, 784)}, training=True, optimizer="adam", remat=remat,
                                   parallel=planner.Parallel(dp=2, zero=zero), offload=offload).arena_bytes
        assert row["global_batch"] == 2 * row["batch_per_rank"]
        assert arena(row["batch_per_rank"]) == row["arena_bytes"] <= 8 << 20 < arena(row["batch_per_rank"] + 1)
    assert cli.main(["fit", "zoo:mlp", "--batch", "4", "--gpus", "2", "--memory", "8MiB", "--optimizer", "adam",
                     "--zero", "3", "--remat", "sublinear", "--json"]) == 0
    pinned = {r["layout"]: r["batch_per_rank"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert pinned == {"dp 2, ZeRO-3, sublinear": next(r["batch_per_rank"] for r in doc["rows"]
                                                       if r["layout"] == "dp 2, ZeRO-3, sublinear")}
    assert cli.main(["fit", "zoo:mlp", "--gpus", "2", "--memory", "8MiB", "--microbatches", "2"]) == 2
    assert "fit plans every stage of a pipeline, with 2 microbatches a stage" in capsys.readouterr().err
    assert cli.main(["fit", "zoo:mlp", "--batch", "4", "--gpus", "2", "--memory", "8MiB", "--dp", "4"]) == 2
    assert "no layout of 2 devices is what was asked for" in capsys.readouterr().err
    assert cli.main(["report", "zoo:mlp", "--training", "--shard", "dim0"]) == 2
    assert "--shard, --prefetch, --bucket and --sync-batchnorm say how the ranks of --dp N --zero Z shard" in \
        capsys.readouterr().err


def test_every_process_plans_the_same_steps_whatever_its_hash_seed():
    """Ranks plan alone and must meet at each collective in one order: the plan may not follow the order of
    a set of strings, which PYTHONHASHSEED changes from one process to the next."""
    script = ("import json, sys; sys.path.insert(0, 'tests'); import planner; from zoo_cases import input_shapes, "
              "small_model; m = small_model('resnet18'); p = planner.compile(m, input_shapes(m, 2), training=True, "
              "optimizer='adam', parallel=planner.Parallel(dp=2, zero=3)); "
              "print(json.dumps([s.name for s in p.steps]))")
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert runs[0] == runs[1]


def test_recomputation_under_a_budget_plans_for_the_rank():
    """remat="budget" scores its candidates as the rank's plans they become: a budget between the rank's
    arena and the one-device arena is met with less recomputation than one device would need."""
    m = small_model("resnet_deep")
    shapes = input_shapes(m, 4)
    options = dict(training=True, optimizer="adam")
    one = planner.compile(m, shapes, **options)
    rank = planner.compile(m, shapes, **options, parallel=planner.Parallel(dp=2, zero=3))
    assert rank.arena_bytes < one.arena_bytes
    budget = (rank.arena_bytes + one.arena_bytes) // 2
    planned = planner.compile(m, shapes, **options, remat="budget", memory_budget=budget,
                              parallel=planner.Parallel(dp=2, zero=3))
    alone = planner.compile(m, shapes, **options, remat="budget", memory_budget=budget)
    assert planned.arena_bytes <= budget and alone.arena_bytes <= budget
    assert planned.stats["recompute_flops"] < alone.stats["recompute_flops"]
