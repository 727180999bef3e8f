"""transpose_view: a Transpose that moves only axes of size 1 becomes a Reshape, a view, and results do not change;
one that moves values stays."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import planner
from executor import Executor


def model():
    nodes = [helper.make_node("Transpose", ["x"], ["heads"], perm=[0, 2, 1, 3]),  # (2, 1, 4, 3) -> (2, 4, 1, 3)
             helper.make_node("Relu", ["heads"], ["a"]),
             helper.make_node("Transpose", ["a"], ["y"], perm=[0, 3, 2, 1])]  # moves values
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_transpose_of_size_one_axes_is_a_view_and_changes_nothing():
    m = model()
    plan = planner.compile(m, {"x": (2, 1, 4, 3)})
    ops = [s.op for s in plan.steps]
    assert ops == ["Reshape", "Relu", "Transpose"]
    assert plan.tensors["heads"].view and plan.tensors["heads"].alias_of == "x"
    x = np.random.default_rng(0).standard_normal((2, 1, 4, 3)).astype(np.float32)
    got = Executor(plan, "numpy", poison=True).run({"x": x})["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
