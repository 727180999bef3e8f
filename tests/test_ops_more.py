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
from zoo_cases import run_on

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore", [None, 1])
@pytest.mark.parametrize("weights", [False, True])
def test_nll_gradients(reduction, ignore, weights, backend):
    """(N, C, d1) log-probabilities: the label's, weighted, at each position; an ignored label gets none.
    The class weights are a constant, as in PyTorch they get no gradient."""
    labels = np.array([[0, 1, 2], [1, 2, 1]], np.int64)
    attrs = dict(reduction=reduction, **({} if ignore is None else dict(ignore_index=ignore)))
    w = ("Constant", [], ["w"], dict(value=numpy_helper.from_array(np.array([0.5, 2.0, 1.5]))))
    nodes = [w, ("NegativeLogLikelihoodLoss", ["x", "labels", "w"], ["a"], attrs)] if weights else \
        [("NegativeLogLikelihoodLoss", ["x", "labels"], ["a"], attrs)]
    m = weighted(nodes, [2, 3, 3], dict(labels=labels))
    check(backend, m, p(2, 3, 3))


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
def test_swiglu_gradients(alpha, backend):
    """Through the gate's Swish and the value, each a float64 input of the model (x, and a param)."""
    m = weighted([("SwiGLU", ["x", "v"], ["a"], dict(alpha=alpha))], [2, 5], dict(v=p(2, 5)), opset=28)
    check(backend, m, p(2, 5))


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


def run_like_onnxruntime(backend, op, inputs, attrs, opset, inits=(), rtol=1e-5, atol=1e-6):
    """The node planned and run with poison on, against onnxruntime's; memplan's output."""
    ort = pytest.importorskip("onnxruntime")
    model = one_node(op, inputs, attrs, opset, inits)
    plan = planner.compile(model, {n: v.shape for n, v in inputs})
    got = run_on(backend, plan, dict(inputs))["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, dict(inputs))[0], rtol=rtol, atol=atol)
    return got


ROIS = np.array([[0, 0, 0, 9, 7], [1, 2.4, 1.6, 5.5, 8.5], [0, 6, 6, 3, 2],  # a reversed roi: one pixel
                 [1, -3, -2, 30, 30], [0, 11.2, 3, 14, 5], [1, 1, 1, 1, 1]], np.float32)  # clipped; off the image


@pytest.mark.parametrize("pooled, scale", [((2, 2), 1.0), ((3, 4), 0.5), ((7, 5), 0.8), ((1, 1), 1.0)])
def test_maxroipool_against_onnxruntime(pooled, scale, backend):
    """Positive data: onnxruntime starts each bin's max at FLT_MIN, torchvision (and memplan) at -FLT_MAX."""
    x = RNG.uniform(0.1, 1, (2, 3, 9, 10)).astype(np.float32)
    run_like_onnxruntime(backend, "MaxRoiPool", [("x", x), ("rois", ROIS)], dict(pooled_shape=list(pooled),
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
    from executor.torch_module import to_torch
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


def deform_inputs(n=2, c=4, m=6, spatial=(6, 7), kernel=(3, 2), groups=2, offset_group=2, strides=(1, 2),
                  dilations=(2, 1), pads=(1, 0, 2, 1), mask=True, bias=True, dtype=np.float32, scale=1.5):
    """(inputs, attributes) of a DeformConv whose offsets reach past the image's borders."""
    r = len(spatial)
    out = [(i + b + e - (k - 1) * d - 1) // s + 1
           for i, b, e, k, d, s in zip(spatial, pads, pads[r:], kernel, dilations, strides)]
    taps = offset_group * int(np.prod(kernel))
    inputs = [("x", RNG.standard_normal((n, c, *spatial))), ("w", RNG.standard_normal((m, c // groups, *kernel))),
              ("offset", RNG.uniform(-scale, scale, (n, taps * r, *out)))]
    inputs += [("b", RNG.standard_normal(m))] if bias else [("", None)] if mask else []
    inputs += [("mask", RNG.uniform(0, 1, (n, taps, *out)))] if mask else []
    attrs = dict(group=groups, offset_group=offset_group, strides=list(strides), dilations=list(dilations),
                 pads=list(pads), kernel_shape=list(kernel))
    return [(k, None if v is None else v.astype(dtype)) for k, v in inputs], attrs


@pytest.mark.parametrize("form", [
    {}, dict(mask=False), dict(bias=False), dict(mask=False, bias=False), dict(groups=1, offset_group=4),
    dict(groups=2, offset_group=1, strides=(2, 2), dilations=(1, 1), pads=(0, 0, 0, 0)), dict(scale=6.0),
])
def test_deformconv_against_onnxruntime(form):
    inputs, attrs = deform_inputs(**form)
    fed = [(k, v) for k, v in inputs if k]
    model = one_node("DeformConv", fed, attrs, 22, inits=[(k, v) for k, v in inputs if not k])
    if any(not k for k, _ in inputs):  # an omitted B before the mask: the node's inputs as the file has them
        model.graph.node[0].input[:] = [k for k, _ in inputs]
    ort = pytest.importorskip("onnxruntime")
    plan = planner.compile(model, {k: v.shape for k, v in fed})
    got = Executor(plan, backend="numpy", poison=True).run(dict(fed))["y"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, dict(fed))[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def run_deformconv(inputs, attrs, opset=22, limit=None, parts=False):
    """The node planned (its workspace under `limit` bytes) and run with poison on; with `parts`, its
    decomposition (the gradient's form) instead."""
    from planner.config import Config
    from planner.decomposition import decomposed
    fed = [(k, v) for k, v in inputs if k]
    model = one_node("DeformConv", fed, attrs, opset)
    model.graph.node[0].input[:] = [k for k, _ in inputs]
    graph = planner.load(model, {k: v.shape for k, v in fed})
    if parts:
        graph = decomposed(graph, lambda node, schema: True)
        assert "DeformConv" not in {node.op for node in graph.nodes}
    plan = planner.compile(graph, config=Config(workspace_limit=limit) if limit else None)
    return plan, Executor(plan, backend="numpy", poison=True).run(dict(fed))["y"]


@pytest.mark.parametrize("spatial, kernel, strides, dilations, pads", [
    ((9,), (3,), (2,), (1,), (1, 2)), ((6, 7), (3, 2), (1, 2), (2, 1), (1, 0, 2, 1)),
    ((1, 5), (1, 2), (1, 1), (1, 1), (0, 0, 0, 0)),  # an axis of one pixel
    ((4, 5, 3), (2, 3, 2), (1, 2, 1), (1, 1, 2), (0, 1, 1, 1, 0, 1))])
def test_deformconv_in_chunks_and_in_parts(spatial, kernel, strides, dilations, pads):
    """1-, 2- and 3-D, the workspace cut into chunks of a few positions, against the decomposition."""
    inputs, attrs = deform_inputs(spatial=spatial, kernel=kernel, strides=strides, dilations=dilations, pads=pads,
                                  dtype=np.float64)
    plan, got = run_deformconv(inputs, attrs, limit=6000)
    step = next(s for s in plan.steps if s.op == "DeformConv")
    assert 0 < plan.tensors[step.workspace].nbytes <= 6000
    np.testing.assert_allclose(got, run_deformconv(inputs, attrs, parts=True)[1], rtol=1e-10, atol=1e-10)


def test_deformconv_float16_and_opset_19():
    """Half floats sampled and summed in float32; opset 19's parts name GridSample's mode bilinear."""
    inputs, attrs = deform_inputs(dtype=np.float16)
    got = run_deformconv(inputs, attrs, opset=19)[1]
    wide = [(k, None if v is None else v.astype(np.float32)) for k, v in inputs]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, run_deformconv(wide, attrs, opset=19, parts=True)[1], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("form", [{}, dict(mask=False, bias=False, groups=1, offset_group=1)])
def test_deformconv_gradients(form, backend):
    """For X, W, the offsets, B and the mask, through the parts (GridSample's gradient)."""
    inputs, attrs = deform_inputs(n=1, c=2, m=2, spatial=(4, 5), kernel=(2, 2), strides=(1, 1), dilations=(1, 2),
                                  pads=(1, 0, 0, 1), dtype=np.float64, **form)
    x, *params = inputs
    names = ["x", *(k for k, _ in params)]
    m = weighted([("DeformConv", names, ["a"], attrs)], list(x[1].shape), {k: v for k, v in params if k}, opset=22)
    check(backend, m, x[1])


def test_deformconv_refusals():
    inputs, attrs = deform_inputs(mask=False, bias=False)
    with pytest.raises(ShapeError, match=r"offset \(2, 24, 5, 4\) must be \(2, 12, 5, 4\)"):
        planner.compile(one_node("DeformConv", list(inputs), {**attrs, "offset_group": 1}, 22))
    with pytest.raises(ShapeError, match="X's 4 channels must be W's 2 per group times group 1"):
        planner.compile(one_node("DeformConv", list(inputs), {**attrs, "group": 1}, 22))
    with pytest.raises(ShapeError, match=r"kernel_shape \(3, 3\)"):
        planner.compile(one_node("DeformConv", list(inputs), {**attrs, "kernel_shape": [3, 3]}, 22))


def test_no_temporaries():
    """MaxRoiPool and DeformConv (its sampling and products) on inputs large enough to show a temporary."""
    from test_no_hidden_allocations import allocations, assert_bounded
    x = RNG.standard_normal((2, 16, 64, 64)).astype(np.float32)
    rois = np.array([[0, 0, 0, 63, 63], [1, 5, 3, 40, 60]], np.float32)
    plan = planner.compile(one_node("MaxRoiPool", [("x", x), ("rois", rois)], dict(pooled_shape=[7, 7]), 22))
    ex = Executor(plan, backend="numpy")
    assert_bounded(allocations(ex, lambda: ex.run({"x": x, "rois": rois})), exempt=set())
    inputs, attrs = deform_inputs(n=1, c=8, m=8, spatial=(40, 40), strides=(1, 1), dilations=(1, 1))
    plan = planner.compile(one_node("DeformConv", inputs, attrs, 22))
    ex = Executor(plan, backend="numpy")
    assert_bounded(allocations(ex, lambda: ex.run(dict(inputs))), exempt=set())
