"""NegativeLogLikelihoodLoss, SwiGLU, MaxRoiPool and DeformConv beyond the backend node tests' cases:
gradients by finite differences, MaxRoiPool (which onnx ships no node case for) and DeformConv's forms
against onnxruntime, refusals."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor, RunError
from planner.errors import ShapeError
from test_autodiff import check, p, weighted

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore", [None, 1])
@pytest.mark.parametrize("weights", [False, True])
def test_nll_gradients(reduction, ignore, weights):
    """(N, C, d1) log-probabilities: the label's, weighted, at each position; an ignored label gets none.
    The class weights are a constant, as in PyTorch they get no gradient."""
    labels = np.array([[0, 1, 2], [1, 2, 1]], np.int64)
    attrs = dict(reduction=reduction, **({} if ignore is None else dict(ignore_index=ignore)))
    w = ("Constant", [], ["w"], dict(value=numpy_helper.from_array(np.array([0.5, 2.0, 1.5]))))
    nodes = [w, ("NegativeLogLikelihoodLoss", ["x", "labels", "w"], ["a"], attrs)] if weights else \
        [("NegativeLogLikelihoodLoss", ["x", "labels"], ["a"], attrs)]
    m = weighted(nodes, [2, 3, 3], dict(labels=labels))
    check(m, p(2, 3, 3))


def test_nll_refusals():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    for labels, attrs, message in (([2, 3], {}, r"labels of shape \(2, 3\) do not index input of shape \(2, 3\)"),
                                   ([2], dict(reduction="max"), "reduction 'max' is not one of none, sum, mean")):
        node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], **attrs)
        graph = helper.make_graph([node], "nll", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(np.zeros(labels, np.int64), "t")])
        with pytest.raises(ShapeError, match=message):
            planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu_gradients(alpha):
    """Through the gate's Swish and the value, each a float64 input of the model (x, and a param)."""
    m = weighted([("SwiGLU", ["x", "v"], ["a"], dict(alpha=alpha))], [2, 5], dict(v=p(2, 5)), opset=28)
    check(m, p(2, 5))


def test_swiglu_refuses_broadcasting():
    fed = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("a", [2, 4]), ("b", [1, 4]))]
    graph = helper.make_graph([helper.make_node("SwiGLU", ["a", "b"], ["y"])], "swiglu", fed,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ShapeError, match=r"gate A \(2, 4\) float32 and value B \(1, 4\) float32 must have one shape"):
        planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)]))


def one_node(op, inputs, attrs, opset, inits=()):
    """A model of one `op` node on the (name, array) `inputs` and the `inits` as initializers (("", None): an
    omitted input); its output of input 0's type."""
    fed = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs]
    node = helper.make_node(op, [n for n, _ in (*inputs, *inits)], ["y"], **attrs)
    out = helper.make_tensor_value_info("y", fed[0].type.tensor_type.elem_type, None)
    graph = helper.make_graph([node], op, fed, [out], [numpy_helper.from_array(v, n) for n, v in inits if n])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_like_onnxruntime(op, inputs, attrs, opset, inits=(), rtol=1e-5, atol=1e-6):
    """The node planned and run with poison on, against onnxruntime's; memplan's output."""
    ort = pytest.importorskip("onnxruntime")
    model = one_node(op, inputs, attrs, opset, inits)
    plan = planner.compile(model, {n: v.shape for n, v in inputs})
    got = Executor(plan, backend="numpy", poison=True).run(dict(inputs))["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, dict(inputs))[0], rtol=rtol, atol=atol)
    return got


ROIS = np.array([[0, 0, 0, 9, 7], [1, 2.4, 1.6, 5.5, 8.5], [0, 6, 6, 3, 2],  # a reversed roi: one pixel
                 [1, -3, -2, 30, 30], [0, 11.2, 3, 14, 5], [1, 1, 1, 1, 1]], np.float32)  # clipped; off the image


@pytest.mark.parametrize("pooled, scale", [((2, 2), 1.0), ((3, 4), 0.5), ((7, 5), 0.8), ((1, 1), 1.0)])
def test_maxroipool_against_onnxruntime(pooled, scale):
    """Positive data: onnxruntime starts each bin's max at FLT_MIN, torchvision (and memplan) at -FLT_MAX."""
    x = RNG.uniform(0.1, 1, (2, 3, 9, 10)).astype(np.float32)
    run_like_onnxruntime("MaxRoiPool", [("x", x), ("rois", ROIS)], dict(pooled_shape=list(pooled),
                                                                       spatial_scale=scale), 13)


@pytest.mark.parametrize("pooled, scale", [((2, 2), 1.0), ((3, 4), 0.5), ((7, 5), 0.8)])
def test_maxroipool_like_torchvision(pooled, scale):
    """Any sign: memplan, its PyTorch form (torchvision's roi_pool) and torchvision's outputs agree."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    x = RNG.standard_normal((2, 3, 9, 10)).astype(np.float32)
    model = one_node("MaxRoiPool", [("x", x), ("rois", ROIS)], dict(pooled_shape=list(pooled), spatial_scale=scale), 22)
    got = Executor(planner.compile(model), backend="numpy", poison=True).run({"x": x, "rois": ROIS})["y"]
    want = torchvision.ops.roi_pool(torch.from_numpy(x), torch.from_numpy(ROIS), list(pooled), scale).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    from frontends.torch_module import to_torch
    module = to_torch(planner.load(model))
    np.testing.assert_allclose(module(x=torch.from_numpy(x), rois=torch.from_numpy(ROIS))["y"].numpy(), want, rtol=1e-6)


def test_maxroipool_refusals_and_bounds():
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(ShapeError, match=r"rois \(3, 4\) \(R, 5\)"):
        planner.compile(one_node("MaxRoiPool", [("x", x), ("rois", np.zeros((3, 4), np.float32))],
                                 dict(pooled_shape=[2, 2]), 22))
    with pytest.raises(ShapeError, match=r"pooled_shape \(2, 0\) must be two positive sizes"):
        planner.compile(one_node("MaxRoiPool", [("x", x), ("rois", ROIS)], dict(pooled_shape=[2, 0]), 22))
    plan = planner.compile(one_node("MaxRoiPool", [("x", x), ("rois", ROIS)], dict(pooled_shape=[2, 2]), 22))
    with pytest.raises(RunError, match="batch index 1 of roi 1 is out of range for 1 images"):
        Executor(plan, backend="numpy").run({"x": x, "rois": ROIS})
