"""Weights read when needed (planner.deferred): planning reads none of a model's large float initializers,
a folded weight is computed when read, the executor copies them into its arena one at a time, and the
results stay onnxruntime's."""
import copy
import pickle
import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from frontends import onnx_frontend
from planner.deferred import Deferred

RNG = np.random.default_rng(5)
SIDE, LAYERS = 512, 6
"""A chain of LAYERS MatMuls by SIDE x SIDE float32 weights (1 MiB each)."""


def chain():
    weights = [(RNG.standard_normal((SIDE, SIDE)) / np.sqrt(SIDE)).astype(np.float32) for _ in range(LAYERS)]
    nodes = [helper.make_node("MatMul", [f"h{k}", f"w{k}"], [f"h{k + 1}" if k < LAYERS - 1 else "y"])
             for k in range(LAYERS)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [4, SIDE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def onnxruntime(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_planning_an_export_with_external_data_reads_none_of_its_weights(tmp_path, monkeypatch):
    model = chain()
    (tmp_path / "data").mkdir()
    onnx.save(copy.deepcopy(model), tmp_path / "chain.onnx", save_as_external_data=True, location="data/chain.bin",
              size_threshold=0)
    reads = []
    read = onnx_frontend._read_file
    monkeypatch.setattr(onnx_frontend, "_read_file", lambda *args: reads.append(args) or read(*args))
    plan = planner.compile(str(tmp_path / "chain.onnx"))
    assert not reads and all(isinstance(plan.data[f"w{k}"], Deferred) for k in range(LAYERS))
    x = RNG.standard_normal((4, SIDE)).astype(np.float32)
    got = Executor(plan, backend="numpy").run({"h0": x})["y"]
    assert len(reads) == LAYERS
    np.testing.assert_allclose(got, onnxruntime(model, {"h0": x}), rtol=1e-4, atol=1e-5)


def test_the_executor_holds_the_weights_once():
    """Planning allocates none of the 6 MiB of weights; loading them allocates the arena and about one
    weight more, not every weight a second time."""
    model = chain()
    tracemalloc.start()
    try:
        plan = planner.compile(model)
        planned = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        ex = Executor(plan, backend="numpy")
        loaded = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    weight = SIDE * SIDE * 4
    assert planned < weight and loaded < plan.arena_bytes + 2.5 * weight
    x = RNG.standard_normal((4, SIDE)).astype(np.float32)
    np.testing.assert_allclose(ex.run({"h0": x})["y"], onnxruntime(model, {"h0": x}), rtol=1e-4, atol=1e-5)


def test_a_folded_batchnorm_is_computed_when_read():
    w = (RNG.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
    stats = {k: RNG.uniform(0.5, 1.5, 64).astype(np.float32) for k in ("scale", "beta", "mean", "var")}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["y"])], "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in {"w": w, **stats}.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = planner.compile(model)
    assert "BatchNormalization" not in {s.op for s in plan.steps}
    assert any(name.endswith("/folded_bn") and isinstance(v, Deferred) for name, v in plan.data.items())
    x = RNG.standard_normal((2, 64, 6, 6)).astype(np.float32)
    got = Executor(plan, backend="numpy").run({"x": x})["y"]
    np.testing.assert_allclose(got, onnxruntime(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_a_plan_of_deferred_weights_saves_and_loads_them(tmp_path):
    plan = planner.compile(chain())
    plan.to_json(tmp_path / "plan.json")
    loaded = planner.Plan.from_json(tmp_path / "plan.json")
    for k in range(LAYERS):
        np.testing.assert_array_equal(loaded.data[f"w{k}"], np.asarray(plan.data[f"w{k}"]))


def test_a_deferred_acts_as_its_array():
    value = np.arange(12, dtype=np.float32).reshape(3, 4)
    lazy = Deferred(value.copy, value.shape, value.dtype)
    assert (lazy.shape, lazy.dtype, lazy.ndim, lazy.size, lazy.nbytes, len(lazy)) == \
        (value.shape, value.dtype, 2, 12, 48, 3)
    for got, want in [(lazy * 2 + 1, value * 2 + 1), (np.sqrt(lazy), np.sqrt(value)),
                      (lazy[1:, ::2], value[1:, ::2]), (lazy.T.reshape(-1), value.T.reshape(-1)),
                      (np.concatenate([lazy, value]), np.concatenate([value] * 2)),
                      (np.asarray(lazy, np.float64), value.astype(np.float64)), (list(lazy)[2], value[2])]:
        np.testing.assert_array_equal(got, want)
    assert np.array(lazy).flags.writeable and lazy.tolist() == value.tolist()
    assert copy.deepcopy(lazy) is lazy
    assert isinstance(pickle.loads(pickle.dumps(lazy)), np.ndarray)
    with pytest.raises(AttributeError):
        lazy.__no_such_attribute__
