"""A plan does not depend on the machine that made it, nor on the moment: the same plan whatever core count the
machine reports, and the same plan when every search is slow (a clock that jumps a thousand seconds at each look)
as when it is fast."""
import itertools
import json
import multiprocessing
import os
import time
from dataclasses import asdict

import numpy as np
import pytest

import planner
from frontends import zoo
from planner.ops import into
from planner.plan import MEASURED
from zoo_cases import input_shapes, small_model


def fingerprint(plan):
    """Everything a plan decides, as text: its tensors' places, its steps with every attribute and scratch slice,
    its totals, facts and stats (what a compile measured, such as the seconds planning took, aside)."""
    stats = {k: v for k, v in plan.stats.items() if k not in MEASURED}
    steps = [(asdict(s), {k: np.asarray(v).tolist() if isinstance(v, np.ndarray) else v for k, v in s.attrs.items()})
             for s in plan.steps]
    return json.dumps([plan.strategy, plan.schedule, plan.arena_bytes, plan.lower_bound_bytes, plan.breakdown,
                       [asdict(t) for t in plan.tensors.values()], steps, stats, plan.training],
                      sort_keys=True, default=repr)


def test_a_plan_file_is_the_same_bytes_each_time(tmp_path):
    """Two compiles of one model write the same JSON and values: nothing measured (seconds) goes into the file."""
    model = small_model("gpt2_small")
    files = []
    for k in range(2):
        path = planner.compile(model, input_shapes(model, 2)).to_json(tmp_path / f"plan{k}.json")
        files.append((path.read_bytes(), path.with_suffix(".npz").read_bytes()))
    assert files[0] == files[1]


def reporting_cores(monkeypatch, n):
    """Every way a Python process asks how many cores it has answers `n`."""
    monkeypatch.setattr(os, "cpu_count", lambda: n)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    monkeypatch.setattr(os, "process_cpu_count", lambda: n, raising=False)
    monkeypatch.setattr(multiprocessing, "cpu_count", lambda: n)


def slow_clock(monkeypatch):
    """Clocks that run a thousand seconds on at every reading: a deadline anywhere is always past."""
    ticks = itertools.count()
    for name in ("perf_counter", "monotonic", "time", "process_time"):
        monkeypatch.setattr(time, name, lambda: 1000.0 * next(ticks))


@pytest.mark.parametrize("case", ["mobilenet_v2", "resnet18", "bert_base"])
def test_plans_are_the_same_whatever_cores_the_machine_reports(case, monkeypatch):
    model = small_model(case)
    plans = []
    for cores in (2, 64):
        reporting_cores(monkeypatch, cores)
        plans.append(fingerprint(planner.compile(model, input_shapes(model, 3))))
    assert plans[0] == plans[1]


def test_mobilenet_v2_plans_its_blocks_the_same_with_2_and_64_cores(monkeypatch):
    """The fused blocks' lanes (their scratch) come from the op's shape, never from the machine."""
    model = zoo.build("mobilenet_v2")
    plans = []
    for cores in (2, 64):
        reporting_cores(monkeypatch, cores)
        plans.append(planner.compile(model, {"input": (1, 3, 224, 224)}))
    assert plans[0].stats["inverted_residual"] > 0
    assert fingerprint(plans[0]) == fingerprint(plans[1])
    assert {s.attrs["lanes"] for s in plans[0].steps if s.op == "InvertedResidual"} == {2}


def test_budget_recomputation_is_the_same_on_a_slow_machine(monkeypatch):
    """Twice in one process, then with every clock reading a thousand seconds on: the search stops on counts."""
    model = zoo.build("resnet_deep", depth=4, channels=8, resolution=8)
    shapes = {"input": (2, 3, 8, 8)}
    budget = int(planner.compile(model, shapes, training=True).arena_bytes * 0.9)
    plans = [planner.compile(model, shapes, training=True, memory_budget=budget) for _ in range(2)]
    slow_clock(monkeypatch)
    plans.append(planner.compile(model, shapes, training=True, memory_budget=budget))
    assert plans[0].training["remat"]["recomputed"]
    assert fingerprint(plans[0]) == fingerprint(plans[1]) == fingerprint(plans[2])


def test_the_auto_strategy_is_the_same_on_a_slow_machine(monkeypatch):
    """The exact search of the default strategy counts its effort: a clock that jumps changes nothing."""
    model = zoo.build("lenet")
    shapes = {"input": (8, 1, 28, 28)}
    fast = planner.compile(model, shapes, training=True)
    slow_clock(monkeypatch)
    slow = planner.compile(model, shapes, training=True)
    assert fast.stats["allocator_proof"]["by"] == "exact"
    assert fingerprint(fast) == fingerprint(slow)


def test_host_gemms_go_to_the_gemm_the_executor_installs():
    """planner.ops.into binds no BLAS of its own: it hands a product to the GEMM installed for the array module
    first, and runs NumPy's matmul where that declines or none is there."""
    import executor  # noqa: F401  (its NumPy backend installs MKL's GEMM where it runs)
    from executor import mkl
    seen = []
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((3, 2), np.float32)
    try:
        for takes in (True, False):
            into.install(np, lambda x, y, out, takes=takes: seen.append(takes) or (takes and out.fill(7) is None))
            out = np.zeros((2, 2), np.float32)
            into.matmul(np, a, b, out)
            np.testing.assert_array_equal(out, np.full((2, 2), 7.0) if takes else a @ b)
        into.install(np, None)
        out = np.zeros((2, 2), np.float32)
        into.matmul(np, a, b, out)
        np.testing.assert_array_equal(out, a @ b)
    finally:
        into.install(np, mkl.gemm)
    assert seen == [True, False]


def test_parallel_plans_are_the_same_whatever_the_hash_seed(tmp_path):
    """Python's string hashing differs between processes; a pipeline stage's plan (its microbatches' tensors made
    in one order), a sequence-parallel rank's, a ZeRO-3 rank's and a fully recomputed step's do not."""
    import subprocess
    import sys
    script = """if True:
        import sys
        import planner
        sys.path.insert(0, "tests")
        from zoo_cases import input_shapes, small_model
        m = small_model("gpt2_small")
        shapes = input_shapes(m, 2)
        plans = [*planner.compile_stages(m, shapes, training=True, parallel=planner.Parallel(pp=2, microbatches=4)),
                 planner.compile(m, shapes, training=True, parallel=planner.Parallel(tp=2, sequence_parallel=True)),
                 planner.compile(m, shapes, training=True, parallel=planner.Parallel(dp=2, zero=3)),
                 planner.compile(m, shapes, training=True, remat="full")]
        print([plan.to_json(f"{sys.argv[1]}{k}.json").read_text() for k, plan in enumerate(plans)])
        """
    texts = [subprocess.run([sys.executable, "-c", script, str(tmp_path / f"seed{seed}-")], capture_output=True,
                            text=True, check=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
             for seed in (1, 2)]
    assert texts[0] == texts[1] and texts[0].count("memplan-plan") == 5
