"""Pipeline-parallel training plans (planner/pipeline.py, planner/passes/pipeline_stage.py): the step cut into
stages that balance their FLOPs where few activations cross, each stage's microbatches in 1F1B order with their
saved activations in flight, values and gradients sent between stages; run in 2 and 4 CPU processes over
torch.distributed's gloo, the stages train as one process, which also accumulates microbatches alike."""
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner import pipeline
from planner.errors import ConfigError
from gloo import spawned
from parallel_cases import BATCH, STEPS, batches, compiled, export_rank, exported, trained_alone
from zoo_cases import input_shapes, small_model


def test_1f1b_keeps_at_most_the_stages_after_it_in_flight():
    for stages, microbatches in ((4, 8), (4, 2), (1, 3)):
        for stage in range(stages):
            steps = pipeline.order(stage, stages, microbatches)
            assert sorted(steps) == sorted([("F", j) for j in range(microbatches)] +
                                           [("B", j) for j in range(microbatches)])
            held, most = 0, 0
            for kind, j in steps:
                held += 1 if kind == "F" else -1
                most = max(most, held)
                assert kind == "F" or ("F", j) in steps[:steps.index((kind, j))]
            assert most == pipeline.in_flight(stage, stages, microbatches) == min(stages - stage, microbatches)


def test_stages_split_the_step_and_hold_their_microbatches_in_flight():
    plain = compiled("gpt2_small", 2)
    plans = [compiled("gpt2_small", 2, planner.Parallel(pp=2, microbatches=4, stage=s)) for s in range(2)]
    params = [set(p.training["params"]) for p in plans]
    assert params[0].isdisjoint(params[1]) and params[0] | params[1] == set(plain.training["params"])
    assert "transformer.wte.weight" in params[0] and "lm_head.weight" in params[1]
    facts = [p.training["pipeline"] for p in plans]
    assert [f["in_flight"] for f in facts] == [2, 1]
    flops = [s["flops"] for s in facts[0]["stages"]]
    assert max(flops) < 0.6 * sum(flops), "the cut balances the stages' work"
    sends = [[(s.op, s.attrs["tag"]) for s in p.steps if s.op in ("Send", "Recv")] for p in plans]
    assert sorted(t for op, t in sends[0] if op == "Send") == sorted(t for op, t in sends[1] if op == "Recv")
    assert sorted(t for op, t in sends[1] if op == "Send") == sorted(t for op, t in sends[0] if op == "Recv")
    assert plans[1].outputs == ("loss",) and plans[0].outputs == () and plans[0].training["loss"] is None
    assert all(f"input_ids@{j}" in plans[0].inputs for j in range(4))
    assert all(p.arena_bytes < plain.arena_bytes * 1.5 for p in plans)
    one = compiled("gpt2_small", 2, planner.Parallel(pp=2, microbatches=1, stage=0))
    assert one.breakdown["saved"] < plans[0].breakdown["saved"], "two microbatches in flight hold more"


def test_compile_stages_plans_each_stage_as_compile_does():
    """planner.compile_stages runs the passes before the cut once and each stage's after it: the same plans."""
    m = small_model("gpt2_small")
    parallel = planner.Parallel(pp=2, microbatches=2)
    staged = list(planner.compile_stages(m, input_shapes(m, 2), training=True, parallel=parallel))
    for stage, plan in enumerate(staged):
        alone = compiled("gpt2_small", 2, replace(parallel, stage=stage), "sgd")
        assert plan.arena_bytes == alone.arena_bytes and [s.name for s in plan.steps] == [s.name for s in alone.steps]
        assert plan.training["pipeline"]["stage"] == stage
    forked = list(planner.compile_stages(m, input_shapes(m, 2), training=True, parallel=parallel, stages=[1, 0],
                                         workers=2))  # in forked processes, in the order asked
    assert [p.training["pipeline"]["stage"] for p in forked] == [1, 0]
    for plan, alone in zip(forked, staged[::-1]):
        assert plan.arena_bytes == alone.arena_bytes and plan.tensors == alone.tensors and plan.steps == alone.steps


def test_bad_pipelines_are_refused():
    with pytest.raises(ConfigError, match="parallel stage must be an int from 0 to pp - 1 = 1"):
        planner.Parallel(pp=2, stage=2)
    with pytest.raises(ConfigError, match="ZeRO-2 shards the gradients"):
        planner.Parallel(pp=2, zero=2, dp=2)
    with pytest.raises(ConfigError, match="places to cut"):
        compiled("gpt2_small", 2, planner.Parallel(pp=64))


def test_microbatches_on_one_stage_accumulate_as_the_whole_batch():
    """pp 1 with microbatches: gradient accumulation; its steps train as the plain plan on the whole batch."""
    single = Executor(compiled("gpt2_small", BATCH), backend="numpy")
    accumulated = Executor(compiled("gpt2_small", BATCH // 2, planner.Parallel(microbatches=2)), backend="numpy",
                           poison=True)
    for feeds in batches("gpt2_small"):
        np.testing.assert_allclose(accumulated.train_step(feeds), single.train_step(feeds), rtol=1e-5)
    for name, value in single.parameters().items():
        np.testing.assert_allclose(accumulated.parameters()[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def _rank(rank, port, results, model, pp, microbatches, dp, tp):
    """One rank of a gloo group of pp stages x dp x tp: STEPS training steps on its data rank's share."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=pp * dp * tp)
    try:
        stage, data = rank // (dp * tp), rank // tp % dp
        plan = compiled(model, BATCH // dp // microbatches,
                        planner.Parallel(pp=pp, microbatches=microbatches, stage=stage, dp=dp, tp=tp))
        ex = Executor(plan, backend="numpy", poison=True)
        share = slice(data * BATCH // dp, (data + 1) * BATCH // dp)
        losses = [ex.train_step({k: v[share] for k, v in feeds.items()}) for feeds in batches(model)]
        results.put((rank, losses, ex.parameters(), plan.training, plan.arena_bytes, ex.arena.buffer.nbytes))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.parametrize("model, pp, microbatches, dp, tp", [("gpt2_small", 2, 1, 1, 1), ("gpt2_small", 2, 4, 1, 1),
                                                             ("bert_base", 4, 4, 1, 1), ("gpt2_small", 2, 2, 2, 1),
                                                             ("gpt2_small", 2, 2, 1, 2)])
def test_stages_train_as_one_process(model, pp, microbatches, dp, tp):
    """After STEPS momentum steps each stage's params are the single process's, and the last stage's loss
    (the mean of the data ranks') is its loss."""
    from planner.parallel import joined
    got = spawned(partial(_rank, model=model, pp=pp, microbatches=microbatches, dp=dp, tp=tp), pp * dp * tp)
    single = Executor(compiled(model, BATCH), backend="numpy")
    losses = [single.train_step(feeds) for feeds in batches(model)]
    last = [g for g in got if g[3]["loss"] is not None]
    assert len(last) == dp * tp and all(g[1] == [None] * STEPS for g in got if g[3]["loss"] is None)
    np.testing.assert_allclose(np.mean([g[1] for g in last], axis=0), losses, rtol=1e-5)
    for _, _, _, _, planned, held in got:
        assert held == planned, "the rank's arena is the bytes its plan says"
    values = single.parameters()
    for rank, _, params, training, _, _ in got:
        if rank % tp:
            continue
        split = (training.get("tensor_parallel") or {}).get("split", {})
        for name in training["params"]:
            ranks = [g[2][name] for g in got[rank:rank + tp]]
            param = joined(ranks, *split[name]) if name in split else ranks[0]
            np.testing.assert_allclose(param, values[name], rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}: {name}")


def test_the_report_lists_every_stage_and_fit_tries_pipelines(tmp_path, capsys):
    """`report --pp --microbatches` plans the stage asked for and lists every stage's arena; `fit` tries
    pipelines of 2 stages (2 microbatches a stage) whose fullest stage fits, the microbatch being the batch per
    rank."""
    import json

    import onnx

    from planner import cli
    path = tmp_path / "gpt2.onnx"
    onnx.save(small_model("gpt2_small"), path)
    common = [str(path), "--input", "input_ids:2x16", "--training", "--optimizer", "adam"]
    assert cli.main(["report", *common, "--pp", "2", "--microbatches", "4", "--stage", "1", "--strategy",
                     "bestfit", "--json"]) == 0
    pipe = json.loads(capsys.readouterr().out)["parallel"]["pipeline"]
    arenas = [compiled("gpt2_small", 2, planner.Parallel(pp=2, microbatches=4, stage=s), "adam").arena_bytes
              for s in range(2)]
    assert pipe["stage"] == 1 and pipe["in_flight"] == 1 and pipe["arena_bytes"] == arenas
    assert cli.main(["report", *common, "--pp", "2", "--microbatches", "4", "--strategy", "bestfit"]) == 0
    assert "pipeline stage 0 of 2, 4 microbatches a step in 1F1B order, 2 in flight here" in capsys.readouterr().out
    assert cli.main(["fit", *common[:3], "--optimizer", "adam", "--gpus", "2", "--memory", "2MiB", "--json"]) == 0
    row = {r["layout"]: r for r in json.loads(capsys.readouterr().out)["rows"]}["dp 1 x pp 2, ZeRO-0, 4 microbatches"]
    assert row["global_batch"] == 4 * row["batch_per_rank"]

    def fullest(batch):
        return max(planner.compile(str(path), {"input_ids": (batch, 16)}, training=True, optimizer="adam",
                                   parallel=planner.Parallel(pp=2, microbatches=4, stage=s)).arena_bytes
                   for s in range(2))
    assert fullest(row["batch_per_rank"]) == row["arena_bytes"] <= 2 << 20 < fullest(row["batch_per_rank"] + 1)


@pytest.mark.torch
def test_a_gpt2_export_with_tied_embeddings_trains_in_two_stages_as_one_process(tmp_path):
    """transformers' GPT-2 ties its LM head to its token embedding (and a fresh export shares one initializer
    among equal norms): the stage that sums such a param's gradient updates it and sends the new value to the
    other stages reading it, whose copy then trains like the single process's."""
    path, feeds = exported("gpt2", tmp_path)
    got = spawned(partial(export_rank, path=path, feeds=feeds, parallel=planner.Parallel(pp=2)), 2)
    losses, values = trained_alone(path, feeds)
    np.testing.assert_allclose(got[1][1], losses, rtol=1e-5)
    assert set(got[0][3]["params"]) & set(got[1][2]), "a param both stages hold, stage 0 updates"
    for _, _, params, _ in got:
        for name, value in params.items():
            np.testing.assert_allclose(value, values[name], rtol=1e-4, atol=1e-6, err_msg=name)
    zero1 = planner.compile(path, {"input_ids": feeds[0]["input_ids"].shape}, training=True, optimizer="momentum",
                            parallel=planner.Parallel(pp=2, dp=2, zero=1))
    made = {o: step for step in zero1.steps for o in step.outputs}
    sent = [made[step.inputs[0]].op for step in zero1.steps if step.op == "Send" and step.phase == "optimizer"]
    assert sent and set(sent) == {"AllGather"}, "under ZeRO-1 a stage sends the new value all-gathered, whole"



def int_boundary_model(layers=6, width=8):
    """x -> layers of Relu(x W) -> y = h * Cast(ArgMax(x)): the int64 ArgMax, made first and read last, crosses every
    cut, as Mixtral's exported routing indices do."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=1)]
    inits, h = [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32) / 3, f"w{k}"))
        nodes += [helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"]), helper.make_node("Relu", [f"m{k}"], [f"h{k}"])]
        h = f"h{k}"
    nodes += [helper.make_node("Cast", ["idx"], ["scale"], to=TensorProto.FLOAT),
              helper.make_node("Mul", [h, "scale"], ["y"])]
    graph = helper.make_graph(nodes, "int_boundary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _int_rank(rank, port, results, feeds):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        plan = planner.compile(int_boundary_model(), training=True, optimizer="momentum",
                               parallel=planner.Parallel(pp=2, stage=rank))
        ex = Executor(plan, backend="numpy", poison=True)
        sent = [plan.tensors[s.inputs[0]].dtype for s in plan.steps if s.op == "Send"]
        results.put((rank, [ex.train_step({k: v for k, v in f.items() if k in plan.inputs}) for f in feeds], sent))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
def test_an_integer_tensor_crossing_a_cut_is_sent_between_stages():
    """A stage's boundary may carry integers (Mixtral's exported routing indices): Send takes them, and the
    stages train as one process."""
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((4, 8), dtype=np.float32), "labels": rng.integers(0, 8, 4)} for _ in range(3)]
    got = spawned(partial(_int_rank, feeds=feeds), 2)
    assert "int64" in got[0][2]
    single = Executor(planner.compile(int_boundary_model(), training=True, optimizer="momentum"), backend="numpy")
    np.testing.assert_allclose(got[1][1], [single.train_step(f) for f in feeds], rtol=1e-5)


def test_stages_of_a_model_with_batch_statistics_plan_under_recomputation():
    """BatchNormalization's running statistics are made once a microbatch, under each microbatch's names: a stage's
    graph updates only what its nodes make, so that recomputation (which replays the updates' makers) plans it."""
    m = small_model("resnet18")
    for remat in (None, "sublinear"):
        for plan in planner.compile_stages(m, input_shapes(m, 2), training=True, remat=remat,
                                           parallel=planner.Parallel(pp=2, microbatches=2)):
            assert plan.verify() is plan and plan.training["pipeline"]["microbatches"] == 2
