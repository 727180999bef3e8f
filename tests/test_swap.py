"""Swapping saved values to the host arena (planner/remat/swap.py): the plans verify and fit their budget, the
steps train exactly as the plan that keeps everything (the copies are real copies between two arenas), the time
model places the copies and charges what does not overlap, and hybrid is never slower than swapping or
recomputing alone."""
import json
from dataclasses import replace

import numpy as np
import pytest

import planner
from executor import Executor
from planner import Config, timing
from planner.errors import ConfigError, InfeasibleBudgetError, PlanError
from planner.remat import swap
from zoo_cases import feeds, input_shapes, small_model

BATCH = 4


def budgeted(m, remat, share=0.8, **kw):
    """The plan of `remat` at `share` of the arena of the plan that recomputes nothing, and that plan."""
    shapes = input_shapes(m, BATCH)
    base = planner.compile(m, shapes, training=True, optimizer="adam", **kw)
    plan = planner.compile(m, shapes, training=True, optimizer="adam", remat=remat,
                           memory_budget=int(base.arena_bytes * share), **kw)
    return base, plan


def trained(plan, m, steps=2):
    ex = Executor(plan, backend="numpy", poison=True)
    data = dict(feeds(m, BATCH))
    labels = plan.tensors[plan.training["labels"]]
    data[plan.training["labels"]] = np.random.default_rng(0).integers(0, 4, labels.shape)
    return [ex.train_step(data) for _ in range(steps)], ex.parameters(), ex


@pytest.mark.parametrize("case", ["mobilenet_v2", "resnet_deep"])
def test_a_swapped_step_trains_exactly_like_keeping_everything(case):
    m = small_model(case)
    base, plan = budgeted(m, "swap", 0.9)
    assert plan.arena_bytes <= plan.training["remat"]["budget"] < base.arena_bytes
    assert plan.training["remat"]["swapped"] and plan.host_arena_bytes > 0
    copies = [s for s in plan.steps if s.op in ("SwapOut", "SwapIn")]
    assert {s.op for s in copies} == {"SwapOut", "SwapIn"}
    assert all(plan.tensors[s.outputs[0]].host == (s.op == "SwapOut") for s in copies)
    losses, params, ex = trained(plan, m)
    base_losses, base_params, _ = trained(base, m)
    assert losses == base_losses
    assert all(np.array_equal(params[k], base_params[k]) for k in params)
    assert ex.arena.host.size == plan.host_arena_bytes and ex.arena.buffer.size == plan.arena_bytes


def test_the_host_arena_is_left_out_of_the_device_breakdown_and_kept_in_plan_files(tmp_path):
    _, plan = budgeted(small_model("resnet_deep"), "swap")
    assert sum(plan.breakdown.values()) == plan.arena_bytes
    read = planner.Plan.from_json(plan.to_json(tmp_path / "plan.json"))
    assert read.host_arena_bytes == plan.host_arena_bytes
    assert {n for n, t in read.tensors.items() if t.host} == {n for n, t in plan.tensors.items() if t.host}
    host = [t for t in plan.tensors.values() if t.host]
    moved = replace(plan, tensors={**plan.tensors, host[0].name: replace(host[0], offset=plan.host_arena_bytes)})
    with pytest.raises(PlanError, match="outside the host arena"):
        moved.verify()


def test_hybrid_is_never_slower_than_swapping_or_recomputing_alone():
    m = small_model("resnet_deep")
    for name in ("cpu", "h100"):
        config = Config(device_model=name)
        _, plan = budgeted(m, "hybrid", 0.7, config=config)
        decided = plan.training["remat"]
        assert plan.arena_bytes <= decided["budget"]
        assert decided["time"]["seconds"] == min(decided["candidates"].values())
        assert {"swap", "recompute"} <= set(decided["candidates"]) or decided["chosen"] in decided["candidates"]


def test_swapping_everything_cannot_fit_a_budget_below_the_params():
    m = small_model("lenet")
    base = planner.compile(m, input_shapes(m, BATCH), training=True)
    with pytest.raises(InfeasibleBudgetError) as error:
        planner.compile(m, input_shapes(m, BATCH), training=True, remat="swap", memory_budget=base.arena_bytes // 10)
    assert base.arena_bytes // 10 < error.value.minimum <= base.arena_bytes
    assert planner.compile(m, input_shapes(m, BATCH), training=True, remat="swap",
                           memory_budget=error.value.minimum).arena_bytes <= error.value.minimum


def test_copies_that_overlap_cost_no_time_and_a_slow_link_stalls():
    m = small_model("resnet_deep")
    _, plan = budgeted(m, "swap", 0.8)
    decided = plan.training["remat"]
    assert decided["time"]["seconds"] == pytest.approx(decided["time"]["compute_seconds"])
    graph = _swapped_graph(m)
    fast = timing.device_model("cpu")
    slow = replace(fast, link=1e6)
    seconds, compute = swap.simulate(graph, fast)
    assert seconds == pytest.approx(compute)
    seconds, compute = swap.simulate(graph, slow)
    moved = sum(graph.tensors[n.outputs[0]].nbytes for n in graph.nodes if n.op == "SwapIn")
    assert seconds >= compute + moved / slow.link  # the last copy back cannot overlap what reads it


def _swapped_graph(m):
    """The typed training graph of `m` with every saved value swapped in the order the planner chose."""
    from frontends import read
    from planner import passes
    from planner.compiler import _configured, _context
    from planner.options import CompileOptions
    options = _configured(CompileOptions(training=True))
    pipeline = passes.pipeline(options)
    context = _context(options, input_shapes(m, BATCH), pipeline)
    graph, facts = passes.run(pipeline, read(m, True, True), context)
    steps = context.measure(graph, facts).chosen().steps
    model = timing.device_model("cpu")
    return swap.place(graph, steps, {w.name for w in swap.windows(graph, steps, model)}, model)


def test_device_models_by_name_file_and_their_errors(tmp_path):
    assert timing.device_model("auto", "cuda:0").name == "h100"
    assert timing.device_model("auto").name == "cpu"
    assert timing.device_model("a100", link=12e9).link == 12e9
    path = tmp_path / "mine.json"
    replace(timing.PROFILES["v100"], name="mine").to_json(path)
    assert timing.device_model(str(path)).name == "mine"
    with pytest.raises(ConfigError, match="neither one of"):
        timing.device_model("tpu")
    path.write_text(json.dumps({"name": "x", "flops": -1}))
    with pytest.raises(ConfigError, match="not one `memplan calibrate` wrote"):
        timing.device_model(str(path))
    with pytest.raises(ConfigError, match="flops must be a positive number"):
        timing.DeviceModel("x", 0, 1, 1, 0, 1)


def test_calibrate_measures_numpy():
    model = timing.calibrate(np, lambda: None, "here", size=256, repeat=2)
    assert model.flops > 1e8 and model.bandwidth > 1e8 and model.launch < 1e-3


def test_megengine_enable_swap_makes_a_budget_swap(monkeypatch):
    monkeypatch.setenv("MEGENGINE_ENABLE_SWAP", "1")
    m = small_model("resnet_deep")
    base = planner.compile(m, input_shapes(m, BATCH), training=True)
    plan = planner.compile(m, input_shapes(m, BATCH), training=True, memory_budget=int(base.arena_bytes * 0.8))
    assert plan.training["remat"]["remat"] == "swap"


def test_swap_needs_a_budget():
    m = small_model("lenet")
    with pytest.raises(PlanError, match="memory_budget= goes with"):
        planner.compile(m, input_shapes(m, BATCH), training=True, remat="swap")


@pytest.mark.gpu
def test_a_swapped_step_on_cupy_trains_like_numpy():
    m = small_model("resnet_deep")
    _, plan = budgeted(m, "swap")
    ex = Executor(plan, backend="cupy")
    data = dict(feeds(m, BATCH))
    labels = plan.tensors[plan.training["labels"]]
    data[plan.training["labels"]] = np.random.default_rng(0).integers(0, 4, labels.shape)
    losses = [ex.train_step(data) for _ in range(2)]
    np.testing.assert_allclose(losses, trained(plan, m)[0], rtol=1e-5)


def test_cli_report_swap_puts_swapping_recomputing_and_offloading_side_by_side(capsys):
    from planner import cli
    assert cli.main(["report", "zoo:resnet18", "--batch", "2", "--training", "--swap", "--budget", "100MiB",
                     "--device-model", "a100", "--link", "12GB"]) == 0
    out = capsys.readouterr().out
    assert "time model a100, host link 12 GB/s" in out
    assert all(line.split()[0] in out for line in ("none", "recompute", "swap", "hybrid"))
    assert cli.main(["report", "zoo:resnet18", "--batch", "2", "--training", "--swap", "--budget", "85MiB",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["rows"]
    assert [r["remat"].split(" (")[0] for r in rows] == ["none", "recompute", "swap", "hybrid", "offload",
                                                          "offload + hybrid"]
    budgeted = rows[1:4] + rows[5:]
    assert all(r["arena_bytes"] <= result["budget_bytes"] < rows[0]["arena_bytes"] for r in budgeted)
    assert rows[2]["swapped"] and rows[2]["host_arena_bytes"]
    assert rows[4]["arena_bytes"] < rows[0]["arena_bytes"] and rows[4]["host_arena_bytes"] and rows[4]["step_seconds"]
    assert cli.main(["report", "zoo:lenet", "--swap"]) == 2
    assert "give --training too" in capsys.readouterr().err


def test_cli_calibrate_writes_a_model_report_reads(tmp_path, capsys):
    from planner import cli
    path = tmp_path / "here.json"
    assert cli.main(["calibrate", "--backend", "numpy", "-o", str(path)]) == 0
    assert timing.device_model(str(path)).name == "numpy"
