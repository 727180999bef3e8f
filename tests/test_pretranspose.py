"""The pretranspose pass: an inference Gemm's constant B read with transB=1 is stored transposed, once, and
the results stay onnxruntime's; what it does not take keeps transB."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner.deferred import Deferred

RNG = np.random.default_rng(3)


def linear(extra=(), outputs=("y",), b_input=False):
    """x (8, 64) -> Gemm(x, W (100, 64), c, transB=1) -> y, with `extra` nodes; W an initializer, or an input
    with `b_input`."""
    w = (RNG.standard_normal((100, 64)) / 8).astype(np.float32)
    c = RNG.standard_normal(100).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])]
    inits = [numpy_helper.from_array(c, "c")]
    if b_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [100, 64]))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5), *extra]
    graph = helper.make_graph(nodes, "linear", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                        for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def run(model, feeds, **options):
    plan = planner.compile(model, {k: v.shape for k, v in feeds.items()}, **options)
    return plan, Executor(plan, backend="numpy", poison=True).run(feeds)


def test_a_linear_layer_reads_its_weight_transposed_once():
    model, _ = linear()
    feeds = {"x": RNG.standard_normal((8, 64)).astype(np.float32)}
    plan, got = run(model, feeds)
    plain, want = run(model, feeds, pretranspose=False)
    step = next(s for s in plan.steps if s.op == "Gemm")
    assert plan.stats["pretransposed"] == 1 and step.attrs["transB"] == 0 and step.inputs[1] == "w/transposed"
    assert "w" not in plan.tensors and plan.arena_bytes <= plain.arena_bytes
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=1e-6)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got["y"], session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_deferred_weight_stays_deferred():
    w = (RNG.standard_normal((1000, 64)) / 8).astype(np.float32)  # 256 KiB: read when needed
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = planner.compile(model)
    assert isinstance(plan.data["w/transposed"], Deferred) and plan.data["w/transposed"].shape == (64, 1000)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(Executor(plan, backend="numpy").run({"x": x})["y"], x @ w.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("why, extra, outputs, b_input, options", [
    ("read elsewhere", [helper.make_node("ReduceSum", ["w"], ["s"])], ("y", "s"), False, {}),
    ("an input", [], ("y",), True, {}),
    ("training", [], ("y",), False, {"training": True, "loss": "mse"}),
    ("turned off", [], ("y",), False, {"pretranspose": False}),
])
def test_what_pretranspose_does_not_take_keeps_transb(why, extra, outputs, b_input, options):
    model, _ = linear(extra, outputs, b_input)
    shapes = {"x": (8, 64), **({"w": (100, 64)} if b_input else {})}
    plan = planner.compile(model, shapes, **options)
    gemms = [s for s in plan.steps if s.op == "Gemm" and s.outputs == ("y",)]
    assert plan.stats["pretransposed"] == 0 and len(gemms) == 1 and gemms[0].attrs["transB"] == 1
