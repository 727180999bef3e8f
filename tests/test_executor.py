"""The executor against onnxruntime: every zoo model under every strategy with poison on; the checks
at the door (feeds, memory, one run at a time); random feeds; poison mode exposing a planted planning
mistake; GPU runs allocating nothing."""
import os
import threading
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

import planner
from executor import BusyError, Executor, FeedError, OutOfMemoryError, random_feeds
from executor.backends import cupy_backend, memory, numpy_backend
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


def test_the_executor_keeps_the_plan_without_its_values():
    """The weights live in the arena; the Executor's plan does not hold them again, the caller's keeps its own."""
    model, inputs, expected = reference("resnet18")
    plan = planner.compile(model, input_shapes(model, BATCH))
    ex = Executor(plan, backend="numpy")
    assert plan.data and ex.plan.data == {} and ex.plan.steps == plan.steps
    got = ex.run(inputs)
    assert all(rel_l2(got[name], want) < 1e-5 for name, want in expected.items())
    assert all(rel_l2(value, ex.arena.view(name)) == 0 for name, value in plan.data.items())


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
    plan = planner.compile(model, input_shapes(model, BATCH), strategy="naive", fuse_conv=False)
    assert rel_l2(Executor(plan, backend="numpy", poison=True).run(inputs)["output"], expected["output"]) < 1e-5
    early = next(t for t in plan.tensors.values() if t.kind == "activation" and t.alias_of is None
                 and t.lifetime[1] - t.lifetime[0] > 2)
    bad = replace(plan, tensors={**plan.tensors, early.name: replace(early, lifetime=(early.lifetime[0],
                                                                                      early.lifetime[0]))})
    out = Executor(bad, backend="numpy", poison=True).run(inputs)["output"]
    assert not np.isfinite(out).all() or rel_l2(out, expected["output"]) > 1e-3




def test_unknown_backend():
    with pytest.raises(planner.MemplanError, match="numpy, cupy, auto"):
        Executor(planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH)), backend="tpu")


def _gpu_executor(case):
    model, inputs, expected = reference(case)
    return Executor(planner.compile(model, input_shapes(model, BATCH)), backend="cupy"), inputs, expected


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_matches_onnxruntime(case, cupy):
    ex, inputs, expected = _gpu_executor(case)
    got = ex.run(inputs)
    for name, want in expected.items():
        assert rel_l2(got[name].get(), want) < 1e-4, name


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_run_allocates_nothing(case, cupy):
    ex, inputs, _ = _gpu_executor(case)
    ex.run(inputs)
    assert_program_allocates_nothing(cupy, ex)


def mlp_executor():
    model, inputs, expected = reference("mlp")
    return Executor(planner.compile(model, input_shapes(model, BATCH)), backend="numpy"), inputs, expected


def test_lists_and_numbers_are_fed_when_they_cast_by_kind():
    ex, inputs, expected = mlp_executor()
    (name, x), = inputs.items()
    assert rel_l2(ex.run({name: x.tolist()})["output"], expected["output"]) < 1e-6
    assert rel_l2(ex.run({name: tuple(map(tuple, x.tolist()))})["output"], expected["output"]) < 1e-6
    assert ex.run({name: [[1] * 32] * 2})["output"].shape == expected["output"].shape


@pytest.mark.parametrize("value,message", [
    ([[1.0] * 32] * 3, r"list of shape \(3, 32\) float64"),
    ([[1j] * 32] * 2, r"list of shape \(2, 32\) complex128"),
    ([[1.0] * 32, [1.0]], "a list that is not a rectangular array"),
    ([["a"] * 32] * 2, r"list of shape \(2, 32\) <U1"),
    (1.5, r"float of shape \(\) float64"),
    ({"x": 1}, "dict"),
    ("x", "str"),
    (None, "NoneType"),
])
def test_feeds_that_are_not_arrays_of_the_input(value, message):
    ex, inputs, _ = mlp_executor()
    (name, _), = inputs.items()
    with pytest.raises(FeedError, match=rf"input '{name}': expected shape \(2, 32\) float32, got {message}$"):
        ex.run({name: value})


def test_feeds_must_be_a_dict():
    ex, inputs, _ = mlp_executor()
    with pytest.raises(FeedError, match=r"feeds must be a dict \{input name: array\}, got list"):
        ex.run([inputs])


def test_int_lists_must_cast_by_kind_and_fit():
    # labels of a training step are int64: a list of floats does not cast to them by kind.
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH), training=True)
    ex = Executor(plan, backend="numpy")
    feeds = random_feeds(plan)
    assert np.isfinite(ex.train_step({**feeds, "labels": [1, 2]}))
    with pytest.raises(FeedError, match=r"input 'labels': expected shape \(2,\) int64, got list of shape \(2,\) "
                                        "float64"):
        ex.train_step({**feeds, "labels": [1.0, 2.0]})
    plan = dtypes_plan()
    feeds = random_feeds(plan)
    with pytest.raises(FeedError, match="input 'i': expected shape \\(3, 4\\) int32, got list of values outside "
                                        "the range of int32"):
        Executor(plan, backend="numpy").run({**feeds, "i": [[2**40] * 4] * 3})


def hold_first_kernel(ex):
    """Make the executor's first kernel wait until the returned `release` is set; `started` is set on entry."""
    started, release = threading.Event(), threading.Event()
    k = next(k for k, bound in enumerate(ex.program) if bound is not None)
    fn, *rest = ex.program[k]

    def held(*args):
        started.set()
        release.wait(10)
        fn(*args)

    ex.program[k] = (held, *rest)
    return started, release


@pytest.mark.parametrize("training", [False, True])
def test_a_second_run_at_once_is_refused(training):
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH), training=training)
    feeds = random_feeds(plan)
    want = Executor(plan, backend="numpy")
    want = want.train_step(feeds) if training else want.run(feeds)["output"]
    ex = Executor(plan, backend="numpy")
    go = ex.train_step if training else ex.run
    started, release = hold_first_kernel(ex)
    got = []
    first = threading.Thread(target=lambda: got.append(go(feeds)))
    first.start()
    assert started.wait(10)
    with pytest.raises(BusyError, match="already running .*: make one Executor per thread"):
        go(feeds)
    release.set()
    first.join(10)
    np.testing.assert_array_equal(got[0] if training else got[0]["output"], want)
    with pytest.raises(FeedError):
        go({})
    go(feeds)


def test_one_executor_per_thread_is_right():
    model, inputs, expected = reference("mlp")
    plan = planner.compile(model, input_shapes(model, BATCH))
    errors = []

    def work():
        ex = Executor(plan, backend="numpy")
        errors.extend(rel_l2(ex.run(inputs)["output"], expected["output"]) for _ in range(20))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 40 and max(errors) < 1e-5


def test_host_memory_is_the_tightest_limit_the_system_reports():
    free, where = numpy_backend.room()
    assert 0 < free <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") and where.startswith("available ")


def test_host_memory_falls_back_to_sysconf_then_unknown(monkeypatch):
    monkeypatch.setattr(memory, "_fields", lambda path: {})
    for name in ("_committable", "_cgroup", "_rlimit"):
        monkeypatch.setattr(memory, name, lambda *args: None)
    assert numpy_backend.room() == (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available on the host")

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(memory.os, "sysconf", no_sysconf)
    assert numpy_backend.room() is None
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH))
    Executor(plan, backend="numpy")


def test_an_arena_larger_than_the_host_fails_before_allocating(monkeypatch):
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH))
    huge = replace(plan, arena_bytes=2**60)
    with pytest.raises(OutOfMemoryError, match=r"not enough memory for the arena: 1.00 EiB "
                                               r"\(1,152,921,504,606,846,976 bytes\) needed, .* available .*; use a "
                                               r"smaller batch$"):
        Executor(huge, backend="numpy")
    outputs = sum(plan.tensors[n].nbytes for n in plan.outputs)
    monkeypatch.setattr(numpy_backend, "room", lambda config=None: (plan.arena_bytes - 1, "available on the host"))
    with pytest.raises(OutOfMemoryError, match=rf"\({plan.arena_bytes:,} bytes\) needed, .* "
                                               rf"\({plan.arena_bytes - 1:,} bytes\) available on the host"):
        Executor(plan, backend="numpy")
    monkeypatch.setattr(numpy_backend, "room", lambda config=None: (plan.arena_bytes, "available on the host"))
    with pytest.raises(OutOfMemoryError, match=r"for the arena \(.*\) and the copies of the outputs a run returns "
                                               rf"\(.*\): .* \({plan.arena_bytes + outputs:,} bytes\) needed"):
        Executor(plan, backend="numpy")
    enough = plan.arena_bytes + outputs
    monkeypatch.setattr(numpy_backend, "room", lambda config=None: (enough, "available on the host"))
    Executor(plan, backend="numpy")


def test_the_device_keeps_its_pool_reserve(monkeypatch):
    monkeypatch.setattr(cupy_backend, "free_bytes", lambda: 1000)
    cupy_backend.check_room(950, "the arena", Config())
    with pytest.raises(OutOfMemoryError, match=r"\(951 bytes\) needed, .* \(950 bytes\) usable on the device "
                                               r"\(1,000 free less MXNET_GPU_MEM_POOL_RESERVE=5%\)"):
        cupy_backend.check_room(951, "the arena", Config())


def dtypes_plan():
    """A plan of Identity steps over (3, 4) inputs of float16, bfloat16, float32, float64, bool and int32."""
    from onnx import TensorProto, helper
    kinds = {"h": TensorProto.FLOAT16, "bf": TensorProto.BFLOAT16, "f": TensorProto.FLOAT,
             "d": TensorProto.DOUBLE, "b": TensorProto.BOOL, "i": TensorProto.INT32}
    graph = helper.make_graph(
        [helper.make_node("Identity", [n], [f"out_{n}"]) for n in kinds], "dtypes",
        [helper.make_tensor_value_info(n, k, [3, 4]) for n, k in kinds.items()],
        [helper.make_tensor_value_info(f"out_{n}", k, None) for n, k in kinds.items()])
    return planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_random_feeds_take_each_input_in_its_dtype():
    plan = dtypes_plan()
    feeds = random_feeds(plan, seed=1)
    assert {n: str(v.dtype) for n, v in feeds.items()} == {n: plan.tensors[n].dtype for n in plan.inputs}
    assert all(v.shape == (3, 4) for v in feeds.values())
    assert feeds["f"].std() > 0.1 and not feeds["i"].any()
    np.testing.assert_array_equal(random_feeds(plan, seed=1)["f"], feeds["f"])
    Executor(plan, backend="numpy").run(feeds)


def test_random_feeds_skip_the_training_scalars():
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), BATCH), training=True)
    assert set(random_feeds(plan)) == set(plan.inputs) - {plan.training["lr"], plan.training["step"]}


def test_random_feeds_never_draw_float64_for_float32():
    plan = planner.compile("zoo:mlp", {"input": (2048, 784)})
    nbytes = plan.tensors["input"].nbytes
    tracemalloc.start()
    try:
        feeds = random_feeds(plan)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert feeds["input"].dtype == np.float32 and peak < 1.5 * nbytes


def test_random_feeds_that_cannot_fit_are_refused(monkeypatch):
    plan = planner.compile("zoo:mlp", {"input": (2, 784)})
    monkeypatch.setattr(numpy_backend, "room", lambda config=None: (1000, "available on the host"))
    with pytest.raises(OutOfMemoryError, match=r"not enough memory for random feeds of the inputs input: "
                                                   r".*\(6,272 bytes\) needed, .*\(1,000 bytes\) available on the "
                                                   "host; use a smaller batch"):
        random_feeds(plan)


def test_threads_cap_the_blas_threads_during_a_run_only():
    from threadpoolctl import threadpool_info
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    ex = Executor(plan, backend="numpy", threads=1)
    seen = []
    k, (fn, *rest) = next((k, bound) for k, bound in enumerate(ex.program) if bound is not None)

    def recording(*args):
        seen.append({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
        fn(*args)
    ex.program[k] = (recording, *rest)
    before = threadpool_info()
    got = ex.run(random_feeds(plan))
    assert seen == [{1}] or seen == [set()]  # set(): a NumPy without a BLAS library threadpoolctl knows
    assert threadpool_info() == before
    want = Executor(plan, backend="numpy").run(random_feeds(plan))
    assert all(np.array_equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_threads_must_be_a_positive_int(threads):
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    with pytest.raises(planner.MemplanError, match="threads must be an int >= 1"):
        Executor(plan, backend="numpy", threads=threads)
