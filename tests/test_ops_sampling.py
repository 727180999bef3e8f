"""Sampling and signal ops (planner/ops/grid_sample.py, sampling.py, signal.py) against ONNX's reference
implementation beyond the backend node tests' cases: every mode and padding of GridSample in 1-, 2- and
3-D with its workspace cut into many chunks, RoiAlign's adaptive sampling, DFT's and STFT's forms, Det's
pivoting; the gradients by finite differences; no temporaries on inputs large enough to show them."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import planner
from executor import Executor, RunError
from planner.config import Config
from planner.errors import ShapeError
from test_autodiff import check, p, weighted
from zoo_cases import run_on

RNG = np.random.default_rng(0)


def one_node(op, inputs, attrs, opset, inits=()):
    """A model of one `op` node on the (name, array) `inputs`, the `inits` as initializers (("", None): an
    omitted input)."""
    fed = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs]
    node = helper.make_node(op, [n for n, _ in (*inputs, *inits)], ["y"], **attrs)
    graph = helper.make_graph([node], op, fed, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits if n])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_like_reference(backend, op, inputs, attrs, opset, inits=(), limit=None, rtol=1e-5, atol=1e-6, reference=None):
    """The node planned (its workspace under `limit` bytes) and run with poison on, against the reference
    (of the `reference` (model, inputs) where given)."""
    model = one_node(op, inputs, attrs, opset, inits)
    config = Config(workspace_limit=limit) if limit else None
    plan = planner.compile(model, {n: v.shape for n, v in inputs}, config=config)
    got = run_on(backend, plan, dict(inputs))["y"]
    model, fed = reference or (model, inputs)
    want = ReferenceEvaluator(model).run(None, dict(fed))[0]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return plan


def edge_padded(x, grid, align):
    """(X, grid) for a zero-padded reference of cubic sampling with border padding: X edge-padded by its
    own size, beyond the reach of any tap of the test's points, and the grid moved onto it. Border
    clamps each cubic tap (PyTorch, onnxruntime), which is sampling that padded image."""
    spatial = x.shape[2:]
    padded = np.pad(x, [(0, 0), (0, 0), *((s, s) for s in spatial)], mode="edge")
    sizes = np.array(spatial[::-1], np.float64)
    at = (grid + 1) * (sizes - 1) / 2 if align else ((grid + 1) * sizes - 1) / 2
    moved = 2 * (at + sizes) / (3 * sizes - 1) - 1 if align else (2 * (at + sizes) + 1) / (3 * sizes) - 1
    return padded, moved.astype(grid.dtype)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("spatial, out", [((7,), (5,)), ((4, 5), (3, 6)), ((3, 4, 5), (2, 3, 2))])
def test_gridsample_in_chunks(mode, padding, align, spatial, out, backend):
    """Points beyond the borders (the grid spans [-1.7, 1.7]), a workspace of a few points per chunk."""
    x = RNG.standard_normal((2, 3, *spatial)).astype(np.float32)
    grid = RNG.uniform(-1.7, 1.7, (2, *out, len(spatial))).astype(np.float32)
    attrs = dict(mode=mode, padding_mode=padding, align_corners=align)
    reference, atol = None, 1e-6
    if (mode, padding) == ("cubic", "border"):  # the reference's float32 coordinates, three times as large
        padded = list(zip(("x", "grid"), edge_padded(x, grid, align)))
        reference, atol = (one_node("GridSample", padded, dict(attrs, padding_mode="zeros"), 20), padded), 1e-5
    plan = run_like_reference(backend, "GridSample", [("x", x), ("grid", grid)], attrs, 20, limit=2000,
                              atol=atol, reference=reference)
    step = next(s for s in plan.steps if s.op == "GridSample")
    assert 0 < plan.tensors[step.workspace].nbytes <= 2000


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_gridsample_float64_opset16_like_onnxruntime(padding, align):
    """Opset 16's bicubic in float64, to the last bits of onnxruntime's opset 20 cubic (the reference
    works in float32); with border padding each tap is clamped, as onnxruntime and PyTorch do."""
    rng = np.random.default_rng(16)
    inputs = [("x", rng.standard_normal((2, 2, 4, 5))), ("grid", rng.uniform(-1.4, 1.4, (2, 3, 3, 2)))]
    attrs = dict(padding_mode=padding, align_corners=align)
    model = one_node("GridSample", inputs, dict(attrs, mode="bicubic"), 16)
    got = Executor(planner.compile(model), backend="numpy", poison=True).run(dict(inputs))["y"]
    theirs = one_node("GridSample", inputs, dict(attrs, mode="cubic"), 20)
    theirs.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    session = ort.InferenceSession(theirs.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, dict(inputs))[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attrs, shapes, message", [
    (dict(mode="bilinear"), ((1, 1, 3, 3), (1, 2, 2, 2)), "mode 'bilinear' is not one of linear, nearest, cubic"),
    (dict(padding_mode="wrap"), ((1, 1, 3, 3), (1, 2, 2, 2)), "padding_mode 'wrap'"),
    ({}, ((1, 1, 3, 3), (1, 2, 2, 3)), r"grid \(1, 2, 2, 3\) must be \(N, out..., 2\)"),
])
def test_gridsample_refusals(attrs, shapes, message):
    x, grid = (np.zeros(s, np.float32) for s in shapes)
    with pytest.raises(ShapeError, match=message):
        planner.compile(one_node("GridSample", [("x", x), ("grid", grid)], attrs, 20))


def test_gridsample_before_opset_20_is_4d():
    x, grid = np.zeros((1, 1, 3, 3, 3), np.float32), np.zeros((1, 2, 2, 2, 3), np.float32)
    with pytest.raises(ShapeError, match="before opset 20 takes 4-D X"):
        planner.compile(one_node("GridSample", [("x", x), ("grid", grid)], {}, 16))


def test_affine_grid_trains_theta_and_refuses_bad_sizes(backend):
    """AffineGrid is a MatMul of constant coordinates by theta: its gradient is MatMul's."""
    size = dict(size=np.array([2, 1, 3, 4], np.int64))
    check(backend, weighted([("AffineGrid", ["x", "size"], ["a"], dict(align_corners=1))], [2, 2, 3], size, opset=20),
          p(2, 2, 3))
    with pytest.raises(ShapeError, match=r"theta must be \(2, 2, 3\) for size \(2, 1, 3, 4\)"):
        planner.compile(one_node("AffineGrid", [("theta", np.zeros((2, 3, 4), np.float32))], {}, 20,
                                 [("size", size["size"])]))


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform, ratio, opset", [("half_pixel", 0, 16), ("output_half_pixel", 2, 16),
                                                     (None, 0, 11)])
def test_roialign_like_reference(mode, transform, ratio, opset, backend):
    """Regions inside, across the border and outside the image, of every size (adaptive sampling counts
    differ per roi), a float64 image, channels in chunks of 2. Opset 10's form is opset 16's
    output_half_pixel, as the spec says (the reference takes it for half_pixel)."""
    x = RNG.standard_normal((2, 5, 6, 7))
    rois = np.array([[0.5, 1, 4, 5], [-3, -2, 2.5, 1], [5, 4, 12, 11], [1, 1, 1.2, 1.1], [9, 9, 12, 12]], np.float32)
    attrs = dict(mode=mode, output_height=3, output_width=2, sampling_ratio=ratio, spatial_scale=0.75)
    if transform:
        attrs["coordinate_transformation_mode"] = transform
    inits = [("batch_indices", np.array([0, 1, 1, 0, 1], np.int64))]
    inputs = [("x", x), ("rois", rois.astype(np.float64))]
    reference = None if transform else (one_node("RoiAlign", inputs, {**attrs, "coordinate_transformation_mode":
                                                                      "output_half_pixel"}, 16, inits), inputs)
    run_like_reference(backend, "RoiAlign", inputs, attrs, opset, inits, limit=2 * 6 * 8, rtol=1e-6, atol=1e-9,
                       reference=reference)


def test_roialign_batch_index_out_of_range():
    model = one_node("RoiAlign", [("x", np.zeros((1, 1, 4, 4), np.float32)), ("rois", np.zeros((1, 4), np.float32))],
                     {}, 16, [("batch_indices", np.array([1], np.int64))])
    with pytest.raises(RunError, match="batch index 1 is out of range for 1 images"):
        Executor(planner.compile(model), backend="numpy").run({"x": np.zeros((1, 1, 4, 4), np.float32),
                                                               "rois": np.zeros((1, 4), np.float32)})


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("inverse, onesided", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("length", [None, 5, 12])
def test_dft_like_reference(channels, inverse, onesided, length, backend):
    """Along a middle axis, the signal truncated (5) or zero-padded (12) to dft_length, at opset 17 (axis
    an attribute) and 20 (an input)."""
    x = RNG.standard_normal((2, 8, 3, channels)).astype(np.float32)
    attrs = dict(inverse=inverse, onesided=onesided)
    sized = [("dft_length", np.array(length, np.int64)) if length else ("", None)]
    run_like_reference(backend, "DFT", [("x", x)], {**attrs, "axis": 1}, 17, sized[:bool(length)], rtol=1e-5, atol=1e-5)
    run_like_reference(backend, "DFT", [("x", x)], attrs, 20, [*sized, ("axis", np.array(-3, np.int64))], rtol=1e-5,
                       atol=1e-5)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_like_reference_and_trains(onesided, backend):
    signal = RNG.standard_normal((2, 20, 1)).astype(np.float32)
    inits = [("frame_step", np.array(3, np.int64)), ("window", np.hanning(6).astype(np.float32))]
    run_like_reference(backend, "STFT", [("x", signal)], dict(onesided=onesided), 17, inits, rtol=1e-5, atol=1e-5)
    params = dict(step=np.array(3, np.int64), window=p(6))
    check(backend, weighted([("STFT", ["x", "step", "window"], ["a"], dict(onesided=onesided))], [1, 14, 2], params,
                   opset=17), p(1, 14, 2))


def test_dft_trains(backend):
    check(backend, weighted([("DFT", ["x", "n"], ["a"], dict(onesided=1, axis=1))], [2, 6, 1],
                   dict(n=np.array(5, np.int64)), opset=17), p(2, 6, 1))


def test_det_pivots_and_singular_matrices():
    """Batches needing row swaps (a zero first pivot), singular matrices (a zero column, equal rows),
    1 x 1 and 0 x 0 ones."""
    x = RNG.standard_normal((3, 2, 5, 5))
    x[0, 0, :, 0] = 0
    x[0, 1, 0, 0] = 0
    x[1, 1, 3] = x[1, 1, 1]
    for value in (x, x[..., :1, :1], x[..., :0, :0], x.astype(np.float32)):
        plan = planner.compile(one_node("Det", [("x", value)], {}, 22))
        got = Executor(plan, backend="numpy", poison=True).run({"x": value})["y"]
        np.testing.assert_allclose(got, np.linalg.det(value.astype(np.float64)), rtol=1e-5, atol=1e-6)
        assert got.dtype == value.dtype


@pytest.mark.parametrize("op, inputs, attrs, opset, inits", [
    ("GridSample", [("x", np.ones((2, 8, 32, 32), np.float32)), ("grid", np.zeros((2, 32, 32, 2), np.float32))],
     dict(mode="cubic", padding_mode="reflection"), 20, []),
    ("RoiAlign", [("x", np.ones((1, 64, 32, 32), np.float32)), ("rois", np.array([[0, 0, 20, 30]] * 8, np.float32))],
     dict(output_height=7, output_width=7), 16, [("batch_indices", np.zeros(8, np.int64))]),
    ("Det", [("x", np.ones((512, 6, 6), np.float32))], {}, 22, []),
])
def test_kernels_allocate_nothing_on_large_inputs(op, inputs, attrs, opset, inits):
    """Inputs large enough that a temporary of the data's or the output's size would show."""
    from test_no_hidden_allocations import allocations, assert_bounded
    ex = Executor(planner.compile(one_node(op, inputs, attrs, opset, inits)), backend="numpy")
    assert_bounded(allocations(ex, lambda: ex.run(dict(inputs))), exempt=set())


@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("mode, spatial", [("linear", (4, 5)), ("linear", (3, 4, 3)), ("cubic", (4, 5)),
                                           ("nearest", (4, 5))])
def test_gridsample_gradients(mode, padding, align, spatial, backend):
    """Sampling trains X and the grid (nearest: X only), in 2-D and 3-D, points inside and beyond the
    borders (reflected up to three times)."""
    far = 3.5 if padding == "reflection" else 1.3
    grid = RNG.uniform(-far, far, (2, *(3, 2, 2)[:len(spatial)], len(spatial)))
    attrs = dict(mode=mode, padding_mode=padding, align_corners=align)
    check(backend, weighted([("GridSample", ["x", "grid"], ["a"], attrs)], [2, 2, *spatial], dict(grid=grid), opset=20),
          p(2, 2, *spatial))


@pytest.mark.parametrize("m", [1, 2, 4])
def test_det_gradient_is_the_cofactors(m, backend):
    check(backend, weighted([("Det", ["x"], ["a"], {})], [3, m, m], {}, opset=22), p(3, m, m))


@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
def test_roialign_trains_x(transform, backend):
    """Regions across the border and outside the image, each sample's corners added back. The rois
    (tenths, cast) are no float param: they get no gradient."""
    tenths = np.array([[5, 10, 40, 50], [-30, -20, 25, 10], [50, 40, 120, 110], [10, 10, 12, 11]], np.int64)
    params = dict(tenths=tenths, batch=np.array([0, 1, 1, 0], np.int64))
    attrs = dict(output_height=3, output_width=2, sampling_ratio=2, spatial_scale=0.075,
                 coordinate_transformation_mode=transform)
    nodes = [("Cast", ["tenths"], ["rois"], dict(to=TensorProto.DOUBLE)),
             ("RoiAlign", ["x", "rois", "batch"], ["a"], attrs)]
    check(backend, weighted(nodes, [2, 2, 6, 7], params, opset=16), p(2, 2, 6, 7))
