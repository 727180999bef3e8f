"""Fusing a convolution with the residual Add and the activation after it (com.microsoft FusedConv): in
inference plans the steps go and the results stay (with and without the pass, and onnxruntime's, which
runs FusedConv itself); training plans keep the graph."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from pass_properties import JITS, assert_same, onnxruntime
from zoo_cases import reference

RNG = np.random.default_rng(5)
X = (2, 4, 9, 9)


def model(nodes, inits, outputs=("y",), opsets=(("", 17),)):
    inits = [numpy_helper.from_array(v.astype(np.float32) if v.dtype.kind == "f" else v, k) for k, v in inits.items()]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(X))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def conv_then(*after, bias=True):
    """x -> Conv (3x3, pad 1, 4 -> 4 channels) -> `after` nodes reading "c", ending in "y"."""
    inits = {"w": RNG.standard_normal((4, 4, 3, 3)) * 0.3, "low": np.array(-0.5), "high": np.array(0.7),
             "per_channel": RNG.standard_normal((4, 1, 1))}
    if bias:
        inits["b"] = RNG.standard_normal(4)
    conv = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], pads=[1, 1, 1, 1])
    return model([conv, *after], inits)


FORMS = {
    "relu": [helper.make_node("Relu", ["c"], ["y"])],
    "residual relu": [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
    "clip": [helper.make_node("Clip", ["c", "low", "high"], ["y"])],
    "residual": [helper.make_node("Add", ["c", "x"], ["y"])],
    "sigmoid": [helper.make_node("Sigmoid", ["c"], ["y"])],
    "tanh": [helper.make_node("Tanh", ["c"], ["y"])],
    "hard sigmoid": [helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)],
}


def run(m, **options):
    plan = planner.compile(m, {"x": X}, **options)
    x = np.random.default_rng(0).standard_normal(X, dtype=np.float32)
    return plan, Executor(plan, backend="numpy", poison=True).run({"x": x})["y"], x


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("bias", [True, False])
def test_each_form_fuses_and_changes_no_result(form, bias):
    import onnxruntime as ort
    m = conv_then(*FORMS[form], bias=bias)
    fused, got, x = run(m)
    plain, want, _ = run(m, fuse_conv=False)
    assert [s.op for s in fused.steps] == ["FusedConv"] and fused.stats["fused_conv"] == 1
    assert len(plain.steps) > 1
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_convolution_read_elsewhere_or_a_broadcast_addend_is_left_alone():
    shared = conv_then(helper.make_node("Relu", ["c"], ["y"]), helper.make_node("Neg", ["c"], ["n"]))
    shared.graph.output.append(helper.make_tensor_value_info("n", TensorProto.FLOAT, None))
    assert "FusedConv" not in {s.op for s in run(shared)[0].steps}
    broadcast = conv_then(helper.make_node("Add", ["c", "per_channel"], ["y"]))  # a bias, not Z
    assert "FusedConv" not in {s.op for s in run(broadcast)[0].steps}


def test_training_keeps_the_graph():
    plan = planner.compile(conv_then(*FORMS["residual relu"]), {"x": X}, training=True, loss="mse")
    assert "FusedConv" not in {s.op for s in plan.steps}


def test_a_fused_conv_of_onnxruntimes_optimizer_runs_like_onnxruntime():
    """FusedConv as ORT writes it (Z and a Clip activation), read from a file."""
    import onnxruntime as ort
    node = helper.make_node("FusedConv", ["x", "w", "b", "x"], ["y"], domain="com.microsoft", pads=[1, 1, 1, 1],
                            activation="Clip", activation_params=[-0.5, 0.5])
    m = model([node], {"w": RNG.standard_normal((4, 4, 3, 3)), "b": RNG.standard_normal(4)},
              opsets=(("", 17), ("com.microsoft", 1)))
    _, got, x = run(m)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_an_activation_it_cannot_apply_in_place_is_a_shape_error():
    node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", activation="LeakyRelu",
                            activation_params=[0.1])
    m = model([node], {"w": RNG.standard_normal((4, 4, 3, 3))}, opsets=(("", 17), ("com.microsoft", 1)))
    with pytest.raises(planner.ShapeError, match="activation 'LeakyRelu' is not one memplan applies in place"):
        planner.compile(m, {"x": X})


@pytest.mark.parametrize("case", ["resnet18", "mobilenet_v2"])
def test_zoo_networks_fuse_with_onnxruntimes_outputs(case):
    m, inputs, want = reference(case, 2)
    shapes = {k: v.shape for k, v in inputs.items()}
    plan = planner.compile(m, shapes)
    assert plan.stats["fused_conv"] > 0
    got = Executor(plan, backend="numpy", poison=True).run(inputs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def salted():
    """x with NaN, both infinities and a huge value, for the outputs whose windows hold them."""
    x = np.random.default_rng(0).standard_normal(X, dtype=np.float32)
    x[0, 1, 2, 3], x[0, 3, 7, 7], x[1, 0, 4, 4], x[1, 2, 0, 8] = np.nan, np.inf, -np.inf, 1e30
    return x


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("form", FORMS)
def test_nan_and_infinities_reach_the_outputs_they_reach_unfused(form, jit):
    """NaN, inf and huge values in X: the FusedConv's epilogue, NumPy's and the compiled one (whose arithmetic
    may not take NaN or inf for anything: Sigmoid(NaN) was 0 there), gives onnxruntime's results."""
    m, x = conv_then(*FORMS[form]), salted()
    plans = [planner.compile(m, {"x": X}, fuse_conv=f) for f in (True, False)]
    assert [s.op for s in plans[0].steps] == ["FusedConv"]
    want = onnxruntime(m, {"x": x})["y"]
    for plan in plans:
        assert_same(Executor(plan, backend="numpy", jit=jit).run({"x": x})["y"], want, scaled=True)


@pytest.mark.parametrize("after, inits", [
    ([helper.make_node("Add", ["c", "c"], ["y"])], {}),
    ([helper.make_node("Add", ["c", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], {}),
    ([helper.make_node("Clip", ["c", "nan", "high"], ["y"])], {"nan": np.array(np.nan)}),
    ([helper.make_node("HardSigmoid", ["c"], ["y"], alpha=float("nan"))], {})])
def test_what_the_fused_conv_cannot_compute_stays(after, inits):
    """An Add of the convolution to itself (Z would be the output the FusedConv drops), a Clip of a NaN bound
    (which onnxruntime's ignores), a HardSigmoid of a NaN alpha: no FusedConv, the results as unfused."""
    m = conv_then(*after)
    m.graph.initializer.extend(numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items())
    x = salted()
    plans = [planner.compile(m, {"x": X}, fuse_conv=f) for f in (True, False)]
    assert "FusedConv" not in {s.op for s in plans[0].steps}
    got, want = (Executor(p, backend="numpy").run({"x": x})["y"] for p in plans)
    assert_same(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("kernel, pads", [(3, 1), (5, 2), (5, 1)])
def test_a_depthwise_conv_keeps_nan_and_infinities_in_their_rows(kernel, pads, jit):
    """A stride-1 depthwise FusedConv as wide as its input, NaN and infinities at the rows' ends: the compiled
    kernel's flat loop over the plane reads the next row's values for the edge columns, and its outputs there
    are those of their own windows, as onnxruntime's."""
    x = np.random.default_rng(1).standard_normal((2, 6, 7, 13), dtype=np.float32)
    x[0, 1, 3, 0], x[0, 2, 4, 12], x[1, 4, 2, 12], x[1, 5, 5, 0] = np.inf, np.nan, -np.inf, 1e30
    w = RNG.standard_normal((6, 1, kernel, kernel)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=6, pads=[pads] * 4), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "depthwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = planner.compile(m, {"x": x.shape})
    assert [s.op for s in plan.steps] == ["FusedConv"]
    assert_same(Executor(plan, backend="numpy", jit=jit).run({"x": x})["y"], onnxruntime(m, {"x": x})["y"],
                scaled=True)
