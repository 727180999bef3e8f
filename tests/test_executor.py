"""The executor against onnxruntime: every zoo model under every strategy with poison on; the checks
at the door; poison mode exposing a planted planning mistake; GPU runs allocating nothing."""
from dataclasses import replace

import numpy as np
import pytest

import planner
from executor import Executor, FeedError, backends
from planner import Config
from planner.compiler import STRATEGIES
from zoo_cases import CASES, assert_program_allocates_nothing, input_shapes, reference, rel_l2, small_model

ort = pytest.importorskip("onnxruntime")
FAST = Config(time_limit=1.0)
BATCH = 2


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES)
def test_zoo_matches_onnxruntime(case, strategy):
    model, inputs, expected = reference(case)
    plan = planner.compile(model, input_shapes(model, BATCH), strategy=strategy, config=FAST,
                           schedule="file" if strategy == "optimal" else "auto")
    got = Executor(plan, backend="numpy", poison=True).run(inputs)
    for name, want in expected.items():
        assert got[name].shape == want.shape
        assert rel_l2(got[name], want) < 1e-5, name


def test_runs_repeat_and_outputs_are_copies():
    model, inputs, expected = reference("resnet18")
    ex = Executor(planner.compile(model, input_shapes(model, BATCH)), backend="numpy")
    first = ex.run(inputs)
    second = ex.run({k: v + 1 if v.dtype.kind == "f" else v for k, v in inputs.items()})
    assert not np.array_equal(first["output"], second["output"])
    assert rel_l2(ex.run(inputs)["output"], expected["output"]) < 1e-5
    assert rel_l2(first["output"], expected["output"]) < 1e-5


def test_feeds_are_checked():
    model, inputs, _ = reference("mlp")
    ex = Executor(planner.compile(model, input_shapes(model, BATCH)), backend="numpy")
    (name, x), = inputs.items()
    with pytest.raises(FeedError, match=rf"missing \['{name}'\]"):
        ex.run({})
    with pytest.raises(FeedError, match="unknown"):
        ex.run({name: x, "extra": x})
    with pytest.raises(FeedError, match=rf"input '{name}': expected shape \(2, 32\) float32, got \(3, 32\)"):
        ex.run({name: np.zeros((3, 32), np.float32)})
    with pytest.raises(FeedError, match="float64"):
        ex.run({name: x.astype(np.float64)})


def test_poison_exposes_a_planted_overlap():
    # Move a tensor that is still needed onto the bytes of one that is written later: without poison
    # the planted plan may still compute the right answer by luck; with poison it cannot.
    model, inputs, expected = reference("resnet18")
    plan = planner.compile(model, input_shapes(model, BATCH), strategy="naive")
    assert rel_l2(Executor(plan, backend="numpy", poison=True).run(inputs)["output"], expected["output"]) < 1e-5
    early = next(t for t in plan.tensors.values() if t.kind == "activation" and t.alias_of is None
                 and t.lifetime[1] - t.lifetime[0] > 2)
    bad = replace(plan, tensors={**plan.tensors, early.name: replace(early, lifetime=(early.lifetime[0],
                                                                                      early.lifetime[0]))})
    out = Executor(bad, backend="numpy", poison=True).run(inputs)["output"]
    assert not np.isfinite(out).all() or rel_l2(out, expected["output"]) > 1e-3


def test_arena_larger_than_the_device_fails_before_allocating(monkeypatch):
    from executor.backends import numpy_backend
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH))
    monkeypatch.setattr(numpy_backend, "free_bytes", lambda: plan.arena_bytes)
    with pytest.raises(planner.MemplanError, match=f"needs {plan.arena_bytes:,} bytes.*RESERVE=5"):
        Executor(plan, backend="numpy")


def test_unknown_backend():
    with pytest.raises(planner.MemplanError, match="numpy, cupy, auto"):
        Executor(planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH)), backend="tpu")


def _cupy():
    try:
        return backends.get("cupy").xp
    except planner.MemplanError:
        pytest.skip("needs CuPy and a CUDA GPU")


def _gpu_executor(case):
    _cupy()
    model, inputs, expected = reference(case)
    return Executor(planner.compile(model, input_shapes(model, BATCH)), backend="cupy"), inputs, expected


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_matches_onnxruntime(case):
    ex, inputs, expected = _gpu_executor(case)
    got = ex.run(inputs)
    for name, want in expected.items():
        assert rel_l2(got[name].get(), want) < 1e-4, name


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_run_allocates_nothing(case):
    cupy = _cupy()
    ex, inputs, _ = _gpu_executor(case)
    ex.run(inputs)
    assert_program_allocates_nothing(cupy, ex)
