"""DepthToSpace, SpaceToDepth, CenterCropPad, Col2Im, LRN, LpPool, GlobalLpPool and MaxUnpool: gradients
against central differences, the forms the node tests leave out against onnxruntime and ONNX's reference,
and their refusals."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import planner
from executor import RunError
from test_autodiff import check, p, weighted
from zoo_cases import run_on

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("op, mode, shape, opset", [
    ("DepthToSpace", "DCR", [2, 8, 2, 3], 13),
    ("DepthToSpace", "CRD", [2, 8, 2, 3], 13),
    ("SpaceToDepth", "DCR", [2, 2, 4, 6], 28),
    ("SpaceToDepth", "CRD", [2, 2, 4, 6], 28),
])
def test_rearrange_gradients(op, mode, shape, opset, backend):
    attrs = dict(blocksize=2, **({"mode": mode} if opset == 28 or op == "DepthToSpace" else {}))
    check(backend, weighted([(op, ["x"], ["a"], attrs)], shape, {}, opset=opset), p(*shape))


def test_center_crop_pad_gradient(backend):
    """One axis cropped (odd count: the extra one at the end), one padded, one kept."""
    m = weighted([("CenterCropPad", ["x", "shape"], ["a"], dict(axes=[0, -1]))], [5, 3, 2],
                 dict(shape=np.array([2, 5], np.int64)), opset=18)
    check(backend, m, p(5, 3, 2))


def test_col2im_gradient(backend):
    """Overlapping blocks (their sums) with strides, dilations and padding on both sides."""
    attrs = dict(strides=[2, 1], dilations=[1, 2], pads=[1, 0, 0, 1])
    params = dict(image=np.array([5, 4], np.int64), block=np.array([2, 2], np.int64))
    m = weighted([("Col2Im", ["x", "image", "block"], ["a"], attrs)], [2, 12, 9], params, opset=18)
    check(backend, m, p(2, 12, 9))


@pytest.mark.parametrize("size", [2, 3])
def test_lrn_gradient(size, backend):
    m = weighted([("LRN", ["x"], ["a"], dict(size=size, alpha=0.5, beta=0.75, bias=2.0))], [2, 4, 3, 2], {}, opset=13)
    check(backend, m, p(2, 4, 3, 2))


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], p=1),
    dict(kernel_shape=[3, 2], p=2, strides=[2, 1], pads=[1, 0, 1, 1]),
    dict(kernel_shape=[2, 3], p=3, strides=[2, 2], ceil_mode=1, dilations=[1, 2]),
    dict(kernel_shape=[3, 3], p=2, strides=[2, 2], auto_pad="SAME_LOWER"),
])
def test_lp_pool_gradients(attrs, backend):
    check(backend, weighted([("LpPool", ["x"], ["a"], attrs)], [2, 2, 5, 6], {}, opset=18), p(2, 2, 5, 6))


@pytest.mark.parametrize("power", [1, 2, 3])
def test_global_lp_pool_gradients(power, backend):
    check(backend, weighted([("GlobalLpPool", ["x"], ["a"], dict(p=power))], [2, 3, 4], {}), p(2, 3, 4))


@pytest.mark.parametrize("output_shape", [None, [1, 2, 5, 6]])
def test_max_unpool_gradient(output_shape, backend):
    indices = np.array([5, 7, 13, 15, 16, 19, 28, 30], np.int64).reshape(1, 2, 2, 2)
    inputs, params = ["x", "i"], dict(i=indices)
    if output_shape:
        inputs, params = [*inputs, "s"], {**params, "s": np.array(output_shape, np.int64)}
    m = weighted([("MaxUnpool", inputs, ["a"], dict(kernel_shape=[2, 2], strides=[2, 2]))], [1, 2, 2, 2], params,
                 opset=11)
    check(backend, m, p(1, 2, 2, 2))


def _float_model(node, x_shape, inits=(), opset=18):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _planned(backend, m, x):
    return run_on(backend, planner.compile(m), {"x": x})["y"]


@pytest.mark.parametrize("op, attrs", [
    ("LpPool", dict(kernel_shape=[3, 2], p=3, strides=[2, 3], ceil_mode=1)),
    ("LpPool", dict(kernel_shape=[3, 3], p=2, strides=[2, 2], pads=[1, 0, 2, 1])),
    ("LpPool", dict(kernel_shape=[2, 3], p=1, strides=[2, 2], dilations=[2, 1], ceil_mode=1)),
    ("LpPool", dict(kernel_shape=[3, 3], p=2, strides=[2, 2], auto_pad="SAME_LOWER")),
    ("GlobalLpPool", dict(p=3)),
    ("LRN", dict(size=5, alpha=0.3, beta=0.6, bias=1.5)),
])
def test_like_onnxruntime(op, attrs, backend):
    """Padding counts as zeros in an LpPool's sums, as in onnxruntime (ONNX's reference averages them
    away); onnxruntime's LRN takes odd sizes only."""
    x = p(2, 3, 7, 8).astype(np.float32)
    m = _float_model(helper.make_node(op, ["x"], ["y"], **attrs), x.shape)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_planned(backend, m, x), want, rtol=1e-5, atol=1e-6)


def test_max_unpool_into_a_larger_output_shape(backend):
    """Indices into the unpooled (2, 3, 4, 4) land at the same places of the (2, 3, 6, 5) output, as in ONNX's
    reference (onnxruntime reads them as positions of the output itself)."""
    x = p(2, 3, 2, 2).astype(np.float32)
    indices = np.random.default_rng(1).permutation(96)[:24].reshape(2, 3, 2, 2).astype(np.int64)
    inits = dict(i=indices, s=np.array([2, 3, 6, 5], np.int64))
    m = _float_model(helper.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
                     x.shape, inits, opset=11)
    np.testing.assert_array_equal(_planned(backend, m, x), ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_max_unpool_checks_its_indices(backend):
    m = _float_model(helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
                     [1, 1, 2, 2], dict(i=np.array([0, 3, 9, 16], np.int64).reshape(1, 1, 2, 2)), opset=11)
    with pytest.raises(RunError, match=r"index 16 is out of bounds for the 16 positions of the unpooled shape "
                                       r"\(1, 1, 4, 4\)"):
        _planned(backend, m, p(1, 1, 2, 2).astype(np.float32))


@pytest.mark.parametrize("node, x_shape, inits, error", [
    (helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2), [1, 6, 2, 2], {},
     r"the 6 channels of \(1, 6, 2, 2\) do not divide into blocks of 2x2"),
    (helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2), [1, 2, 3, 4], {},
     r"height and width of \(1, 2, 3, 4\) do not divide into blocks of 2x2"),
    (helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0]), [3, 4], dict(s=np.array([2, 2], np.int64)),
     r"shape \(2, 2\) must give one size for each of the distinct axes \(0,\)"),
    (helper.make_node("Col2Im", ["x", "i", "b"], ["y"]), [1, 4, 10],
     dict(i=np.array([4, 4], np.int64), b=np.array([2, 2], np.int64)),
     r"input of shape \(1, 4, 10\) is not \(N, C x 4, 9\)"),
    (helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], p=0), [1, 1, 4, 4], {}, "p 0 must be at least 1"),
    (helper.make_node("MaxUnpool", ["x", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), [1, 1, 2, 2],
     dict(i=np.zeros((1, 1, 2, 2), np.int64), s=np.array([1, 1, 3, 4], np.int64)),
     r"output_shape \(1, 1, 3, 4\) must hold the unpooled shape \(1, 1, 4, 4\)"),
])
def test_refusals(node, x_shape, inits, error):
    with pytest.raises(planner.ShapeError, match=error):
        planner.load(_float_model(node, x_shape, inits))
