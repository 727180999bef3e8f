"""The selection and scatter ops (planner/ops/selection.py, scatter.py) and CumProd: gradients against
finite differences, the forms the ONNX node tests leave out, and errors."""
import numpy as np
import pytest

onnxruntime = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor, RunError
from test_autodiff import check, model, p, weighted
from zoo_cases import run_on


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, 1])
def test_cumprod_gradients_with_zeros(exclusive, reverse, axis, backend):
    x = p(3, 4)
    x[1, 1] = x[2, 0] = x[2, 3] = 0.0  # products through a zero (and two zeros in one row)
    m = weighted([("CumProd", ["x", "axis"], ["a"], dict(exclusive=exclusive, reverse=reverse))], [3, 4],
                 dict(axis=np.array(axis, np.int64)), opset=26)
    check(backend, m, x)


def test_topk_gradient(backend):
    m = weighted([("TopK", ["x", "count"], ["v", "i"], dict(axis=1))], [3, 5], dict(count=np.array([2], np.int64)))
    check(backend, m, p(3, 5))


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_gradients(reduction, backend):
    idx = np.array([[1, -1], [0, 2], [3, 3]], np.int64)  # repeats accumulate under add
    m = weighted([("ScatterElements", ["x", "idx", "u"], ["a"], dict(axis=1, reduction=reduction))], [3, 4],
                 dict(idx=idx if reduction == "add" else idx[:, :1], u=p(3, 2) if reduction == "add" else p(3, 1)),
                 opset=18)
    check(backend, m, p(3, 4))


def test_reverse_sequence_gradient(backend):
    m = weighted([("ReverseSequence", ["x", "lens"], ["a"], dict(time_axis=1, batch_axis=0))], [3, 4],
                 dict(lens=np.array([4, 1, 2], np.int64)))
    check(backend, m, p(3, 4))


def one_node(backend, op, inputs, consts=None, opset=18, outputs=("y",), **attrs):
    """(plan's outputs, onnxruntime's) of one node on the given inputs (and constants)."""
    consts = consts or {}
    graph = helper.make_graph(
        [helper.make_node(op, [*inputs, *consts], list(outputs), **attrs)], op,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    plan = planner.compile(m)
    got = run_on(backend, plan, inputs)
    for o in m.graph.output:
        dtype = helper.np_dtype_to_tensor_dtype(np.dtype(plan.tensors[o.name].dtype))
        o.CopyFrom(helper.make_tensor_value_info(o.name, dtype, None))
    session = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [got[o] for o in outputs], session.run(None, inputs)


def assert_like_reference(backend, *args, **kwargs):
    got, want = one_node(backend, *args, **kwargs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_ties_with_the_sentinel_value_come_lowest_index_first(largest, backend):
    """Values equal to the kernel's sentinel (-inf for the largest, +inf for the smallest) and all-equal
    rows: the picks still follow the indices, as ONNX says."""
    inf = np.inf if largest else -np.inf
    x = np.array([[[2, -inf], [-inf, 1], [-inf, -inf], [5, 5]],
                  [[-inf, 0], [3, -inf], [-inf, 7], [-inf, -inf]]], np.float32)
    assert_like_reference(backend, "TopK", {"x": x}, {"k": np.array([4], np.int64)}, outputs=("v", "i"), axis=1,
                          largest=largest)


def test_topk_integers_at_their_extremes(backend):
    x = np.array([[0, np.iinfo(np.int32).min, 3, np.iinfo(np.int32).min, 3]], np.int32)
    assert_like_reference(backend, "TopK", {"x": x}, {"k": np.array([5], np.int64)}, outputs=("v", "i"))
    assert_like_reference(backend, "TopK", {"x": x}, {"k": np.array([3], np.int64)}, outputs=("v", "i"), largest=0)


def test_hardmax_before_opset_13_marks_one_per_flattened_row(backend):
    x = np.array([[[1, 3], [3, 0]], [[0, 0], [0, 0]]], np.float32)
    assert_like_reference(backend, "Hardmax", {"x": x}, opset=11)
    assert_like_reference(backend, "Hardmax", {"x": x}, opset=11, axis=0)
    assert_like_reference(backend, "Hardmax", {"x": x}, opset=13, axis=1)


def test_onehot_float_indices_and_a_middle_axis(backend):
    indices = np.array([[0.0, 2.9], [-1.0, 7.0]], np.float32)
    assert_like_reference(backend, "OneHot", {"i": indices}, {"depth": np.array(3.0, np.float32),
                                                     "values": np.array([-1, 5], np.float32)}, axis=1, opset=11)


@pytest.mark.parametrize("k", [-2, -1, 0, 2, 9])
def test_eyelike_diagonals_of_a_wide_matrix(k, backend):
    assert_like_reference(backend, "EyeLike", {"x": np.zeros((3, 5), np.float32)}, k=k, dtype=TensorProto.INT32)


def test_scatter_elements_reductions_on_a_middle_axis(backend):
    """Float64 data; CuPy has no multiplying scatter and rounds float64 max and min to float32: refused."""
    data = p(2, 3, 4)
    idx = np.array([[[0, 2, -1, 0]], [[1, 1, 1, -3]]], np.int64)
    for reduction in ("none", "add", "mul", "max", "min"):
        args = ("ScatterElements", {"d": data}, {"i": idx, "u": p(2, 1, 4)})
        if backend == "cupy" and reduction in ("mul", "max", "min"):
            with pytest.raises(planner.MemplanError, match=f"reduction '{reduction}'"):
                one_node(backend, *args, axis=1, reduction=reduction, opset=18)
            continue
        got, want = one_node(backend, *args, axis=1, reduction=reduction, opset=18)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_tensor_scatter_wraps_around_in_circular_mode(backend):
    cache, update = p(3, 2, 5, 2), p(3, 2, 3, 2)
    write = np.array([4, 0, 2], np.int64)
    got, ort = one_node(backend, "TensorScatter", {"c": cache, "u": update, "w": write}, opset=24, mode="circular")
    want = cache.copy()
    for b, start in enumerate(write):
        for s in range(3):
            want[b, :, (start + s) % 5] = update[b, :, s]
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(ort[0], want)


def runs(op, inputs, consts, opset=18, **attrs):
    """Plans one node and runs it on the inputs."""
    graph = helper.make_graph(
        [helper.make_node(op, [*inputs, *consts], ["y", "i"] if op == "TopK" else ["y"], **attrs)], op,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    plan = planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    return Executor(plan, backend="numpy").run(inputs)["y"]


@pytest.mark.parametrize("op, inputs, consts, opset, attrs, message", [
    ("ScatterElements", {"d": p(2, 3), "i": np.array([[0, 3]], np.int64)}, {"u": p(1, 2)}, 18, dict(axis=1),
     "index 3 is out of bounds for axis 1 with size 3"),
    ("TensorScatter", {"c": p(2, 4, 1), "u": p(2, 2, 1), "w": np.array([0, 3], np.int64)}, {}, 24, {},
     "write index 3 of sample 1 leaves no room for 2 positions of 4"),
    ("ReverseSequence", {"x": p(3, 2), "n": np.array([1, 4], np.int64)}, {}, 18, {},
     r"sequence length 4 of sample 1 is outside \[0, 3\]"),
])
def test_indices_out_of_range_stop_the_run(op, inputs, consts, opset, attrs, message):
    with pytest.raises(RunError, match=message):
        runs(op, inputs, consts, opset, **attrs)


@pytest.mark.parametrize("op, consts, attrs, message", [
    ("TopK", {"k": np.array([5], np.int64)}, {}, "k 5 must be from 0 to the size 4 of axis 1"),
    ("OneHot", {"depth": np.array(0, np.int64), "values": np.array([0, 1], np.float32)}, {},
     "depth 0 must be at least 1"),
    ("ReverseSequence", {"n": np.array([1, 1, 1], np.int64)}, dict(time_axis=1, batch_axis=1),
     "time_axis 1 and batch_axis 1 must be 0 and 1, one each"),
    ("ScatterElements", {"i": np.zeros((3, 1), np.int64), "u": np.zeros((3, 2), np.float32)}, {},
     r"indices \(3, 1\) and updates \(3, 2\) must have one shape"),
])
def test_bad_attributes_and_shapes_are_refused_when_planning(op, consts, attrs, message):
    with pytest.raises(planner.ShapeError, match=message):
        runs(op, {"x": np.zeros((3, 4), np.float32)}, consts, **attrs)


def test_castlike_plans_as_cast_and_size_folds():
    x = p(2, 3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("CastLike", ["x", "like"], ["c"]), helper.make_node("Size", ["x"], ["n"]),
         helper.make_node("CastLike", ["n", "like"], ["m"]), helper.make_node("Mul", ["c", "m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.zeros(1, np.float16), "like")])
    plan = planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert [s.op for s in plan.steps] == ["Cast", "Mul"]
    y = Executor(plan, backend="numpy").run({"x": x})["y"]
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, x.astype(np.float16) * np.float16(6))


@pytest.mark.parametrize("mode, write", [("linear", None), ("linear", [2, 0]), ("circular", [3, 1])])
def test_tensor_scatter_gradients(mode, write, backend):
    consts = {"u": p(2, 3, 2, 2)}
    if write is not None:
        consts["w"] = np.array(write, np.int64)
    m = weighted([("TensorScatter", ["x", *consts], ["a"], dict(mode=mode, axis=2))], [2, 3, 4, 2], consts, opset=24)
    check(backend, m, p(2, 3, 4, 2))


@pytest.mark.parametrize("k", [-300, -1, 0, 5, 600])
def test_eyelike_too_large_to_fold_runs_its_kernel(k):
    plan = planner.compile(model([("EyeLike", ["x"], ["y"], dict(k=k))], [300, 400], {}))
    assert [s.op for s in plan.steps] == ["EyeLike"]
    y = Executor(plan, backend="numpy", poison=True).run({"x": np.zeros((300, 400))})["y"]
    np.testing.assert_array_equal(y, np.eye(300, 400, k))


def test_scatter_elements_constant_indices_are_checked_when_planning():
    with pytest.raises(planner.ShapeError, match="index -4 is out of range for axis 1 of size 3"):
        runs("ScatterElements", {"x": np.zeros((2, 3), np.float32)},
             {"i": np.array([[0, -4]], np.int64), "u": np.zeros((1, 2), np.float32)}, axis=1)


def test_the_cupy_scatter_refuses_float64_max_and_min():
    """The CuPy branch refuses float64 max and min before it reaches cupyx, which rounds them to float32
    (checked without a GPU through a stand-in array module)."""
    from types import SimpleNamespace
    from planner.ops.shape_ops import scatter_nd
    stand_in = SimpleNamespace(moveaxis=np.moveaxis, add=np.add, multiply=np.multiply, maximum=np.maximum,
                               minimum=np.minimum)
    for reduction in ("max", "min"):
        with pytest.raises(planner.MemplanError, match=f"reduction '{reduction}' of float64 .* round to float32"):
            scatter_nd(stand_in, np.zeros(4), np.zeros((2, 1), np.int64), np.ones(2), reduction)
