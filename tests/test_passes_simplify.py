"""The simplify pass: Identity and same-dtype Casts are dropped unless the caller can see their output,
and the plan computes the same outputs as onnxruntime with fewer bytes."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner.passes.simplify import simplified


def _model():
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["r"]),
             helper.make_node("Cast", ["r"], ["c"], to=TensorProto.FLOAT), helper.make_node("Mul", ["c", "w"], ["m"]),
             helper.make_node("Cast", ["m"], ["h"], to=TensorProto.DOUBLE), helper.make_node("Identity", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "noops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4, 64])],
                              [numpy_helper.from_array(np.full((64,), 0.5, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_noops_go_and_the_outputs_stay():
    m = _model()
    assert [n.op for n in planner.load(m).nodes] == ["Relu", "Mul", "Cast", "Identity"]  # y is a graph output
    x = np.random.default_rng(0).standard_normal((4, 64), dtype=np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    plan = planner.compile(m)
    np.testing.assert_array_equal(Executor(plan, backend="numpy", poison=True).run({"x": x})["y"], want)
    kept = planner.compile(m, fetch=("c",))
    assert "c" in kept.tensors and "i" not in kept.tensors
    assert plan.arena_bytes <= kept.arena_bytes


def test_a_graph_without_noops_is_kept():
    graph = planner.load(_model())
    assert simplified(graph) is graph
