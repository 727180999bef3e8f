"""Op entries (planner/ops/elementwise.py, math_ops.py, composite.py): each entry's gradient against
finite differences and PyTorch, composites decomposed without infinities, the registry's versions and
domains, and a new op added as one entry that plans, runs, differentiates and runs in PyTorch."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor, RunError
from planner import ops
from planner.autodiff import backward
from planner.ops.elementwise import unary
from planner.decomposition import decomposed
from test_autodiff import check, model, p, weighted

SELU_ALPHA, SELU_GAMMA = float(np.float32(1.6732632423543772)), float(np.float32(1.0507009873554805))
INSIDE_ONE = ("Asin", "Acos", "Atanh")
UNARY = ["Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh", "Softplus", "Softsign", "Mish", "Sigmoid",
         "Tanh", "Erf", *INSIDE_ONE, "Acosh"]


def _x(op):
    """A point inside the op's domain, away from kinks."""
    x = p(3, 4) * 0.5
    if op in INSIDE_ONE:
        return np.tanh(x) * 0.9
    if op == "Acosh":
        return np.abs(x) + 1.5
    return x


@pytest.mark.parametrize("op", UNARY)
def test_unary_gradients_match_finite_differences(op, backend):
    check(backend, weighted([(op, ["x"], ["a"], {})], [3, 4], {}, opset=20), _x(op))


@pytest.mark.parametrize("op, attrs", [("Elu", dict(alpha=0.7)), ("Selu", {}), ("Celu", dict(alpha=1.3)),
                                       ("ThresholdedRelu", dict(alpha=0.2)), ("Shrink", dict(bias=0.1, lambd=0.3)),
                                       ("LeakyRelu", dict(alpha=-0.5)), ("HardSwish", {}),
                                       ("Gelu", dict(approximate="tanh"))])
def test_piecewise_gradients_match_finite_differences(op, attrs, backend):
    x = p(3, 4)
    x[np.abs(x) < 0.05] = 0.5  # away from the kinks at 0 and at the thresholds
    x[np.abs(np.abs(x) - 0.3) < 0.05] = 0.8
    check(backend, weighted([(op, ["x"], ["a"], attrs)], [3, 4], {}, opset=28), x)  # 28: Celu of doubles


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic_gradients_broadcast(op, backend):
    m = weighted([(op, ["x", "u", "v"], ["a"], {})], [2, 3, 4], dict(u=p(3, 1), v=p(4)))
    check(backend, m, p(2, 3, 4))


def test_prelu_trains_its_slope(backend):
    check(backend, weighted([("PRelu", ["x", "slope"], ["a"], {})], [2, 3, 4], dict(slope=p(3, 1))), p(2, 3, 4))


def _grad(nodes, x):
    """(output, dy/dx of sum(y)) computed by memplan."""
    graph = planner.load(model(nodes, list(x.shape), {}, opset=28))
    trained, grads = backward(graph, "y", wrt=["x"])
    got = Executor(planner.compile(trained), backend="numpy").run({"x": x})
    return got["y"], got[grads["x"]]


@pytest.mark.torch
@pytest.mark.parametrize("op, attrs, fn", [
    ("Elu", dict(alpha=0.75), lambda F, x: F.elu(x, 0.75)),
    ("Selu", {}, lambda F, x: SELU_GAMMA * F.elu(x, SELU_ALPHA)),  # F.selu's constants, rounded as ONNX stores them
    ("Celu", dict(alpha=1.25), lambda F, x: F.celu(x, 1.25)),
    ("Softplus", {}, lambda F, x: F.softplus(x)),
    ("Mish", {}, lambda F, x: F.mish(x)),
    ("Softsign", {}, lambda F, x: F.softsign(x)),
])
def test_composites_like_pytorch_at_kinks_and_far_out(op, attrs, fn):
    """Values and gradients as PyTorch's at 0 and at +-100, where an exponential of the branch not taken
    would overflow: no infinity or NaN reaches either."""
    torch = pytest.importorskip("torch")
    x = np.array([-100.0, -2.0, -1e-3, 0.0, 1e-3, 2.0, 100.0])
    y, dx = _grad([(op, ["x"], ["y"], attrs)], x)
    t = torch.tensor(x, requires_grad=True)
    want = fn(torch.nn.functional, t)
    want.sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.torch
@pytest.mark.parametrize("op, torch_name", [("Max", "maximum"), ("Min", "minimum")])
def test_extremes_split_ties_like_pytorch(op, torch_name):
    torch = pytest.importorskip("torch")
    x = np.array([1.0, -2.0, 3.0, 0.5])
    y, dx = _grad([("Neg", ["x"], ["n"], {}), ("Abs", ["n"], ["a"], {}), (op, ["x", "a"], ["y"], {})], x)
    t = torch.tensor(x, requires_grad=True)
    getattr(torch, torch_name)(t, torch.abs(-t)).sum().backward()
    np.testing.assert_allclose(dx, t.grad.numpy())


def test_narrow_floats_decompose_in_float32():
    """A composite of float16 computes in float32 and rounds once, as onnxruntime does."""
    graph = planner.load(model([("Mish", ["x"], ["y"], {})], [5], {}, opset=22))
    x = np.linspace(-3, 3, 5)
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Mish", ["x"], ["y"])], "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [5])]), opset_imports=[helper.make_opsetid("", 22)])
    half = planner.load(m)
    assert [n.op for n in half.nodes] == ["Cast", *(n.op for n in graph.nodes), "Cast"]
    got = Executor(planner.compile(m), backend="numpy").run({"x": x.astype(np.float16)})["y"]
    wide = x.astype(np.float16).astype(np.float32)
    want = (wide * np.tanh(np.logaddexp(wide, 0))).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_decompose_keeps_a_graph_without_composites():
    graph = planner.load(model([("Sin", ["x"], ["y"], {})], [3], {}))
    assert decomposed(graph) is graph


def test_accumulation_dtype():
    import ml_dtypes
    schema = ops.get("MatMul")
    for narrow in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
        assert schema.accumulation(narrow) == np.float32
    for dtype in (np.float32, np.float64, np.int8, np.int64):
        assert schema.accumulation(dtype) == np.dtype(dtype)


def test_versions_and_domains():
    assert ops.get("Swish", version=24).op == "Swish"
    with pytest.raises(planner.UnsupportedOpError, match="Swish"):
        ops.get("Swish", version=23)
    assert ops.get("Dropout", "memplan") is not ops.get("Dropout")
    from frontends import symbol as S
    with pytest.raises(planner.UnsupportedOpError, match=r"Swish \(x1\)"):
        planner.load(S.swish(S.var("x", (3,))))  # opset 17
    swish = S.swish(S.var("x", (3,))).to_graph(opset=24)
    assert [n.op for n in planner.load(swish).nodes] == ["Mul", "Sigmoid", "Mul"]  # its parts, as the model reads
    assert [s.op for s in planner.compile(swish).steps] == ["BiasActivation"]  # which fuse_activation joins
    with pytest.raises(ValueError, match="registered twice"):
        unary("Sin", "sin")


@pytest.fixture
def cube():
    """A new op, Cube of domain "test.memplan", added as one entry for the length of a test."""
    unary("Cube", lambda xp, x, out=None: xp.power(x, 3, out=out),
          lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Mul", b.op("Mul", x, x), b.const(3, x))),
          torch=lambda torch, x: x ** 3, domain="test.memplan")
    yield
    del ops.SCHEMAS["test.memplan", "Cube"]


def test_an_op_is_one_entry(cube, backend):
    """The entry alone makes the op plan, run, fold, differentiate, run in PyTorch and in the symbol API's op()."""
    m = model([("MatMul", ["x", "w"], ["h"], {}), ("Cube", ["h"], ["y"], {})], [2, 3], dict(w=p(3, 4)))
    m.graph.node[1].domain = "test.memplan"
    m.opset_import.append(helper.make_opsetid("test.memplan", 1))
    x = p(2, 3)
    plan = planner.compile(m)
    assert [(s.domain, s.op) for s in plan.steps] == [("", "MatMul"), ("test.memplan", "Cube")]
    w = next(i for i in m.graph.initializer if i.name == "w")
    want = (x @ numpy_helper.to_array(w)) ** 3
    np.testing.assert_allclose(Executor(plan, backend="numpy").run({"x": x})["y"], want)
    check(backend, m, x)
    trained = planner.compile(m, training=True, loss="mse", optimizer="sgd")
    assert any(s.op == "Mul" and s.phase == "backward" for s in trained.steps)
    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch
    with torch.no_grad():
        got = to_torch(m)(x=torch.tensor(x))["y"].numpy()
    np.testing.assert_allclose(got, want)


def test_entries_derive_kernels_torch_forms_and_symbol_functions():
    from executor.kernels import KERNELS, find
    from frontends import symbol as S
    from planner.plan import Step
    for op in ("Sin", "IsNaN", "Max", "Softplus", "BitShift"):
        schema = ops.get(op)
        assert ("", op) not in KERNELS and find(KERNELS, Step("s", op, (), (), {})) == schema.kernel
        assert schema.torch is not None
    assert S.is_nan(S.var("x", (2, 3))).dtype == np.bool_
    assert (S.var("a", (2, 1, 3)) + S.var("b", (4, 3))).ndim == 3
    assert callable(S.softsign) and callable(S.logical_not)


def test_ops_outside_onnx_declare_their_types():
    """memplan's own ops check their inputs' types as ONNX ops do, from their schemas' `types`."""
    from planner import shapes
    from planner.ir import Graph, Node, Tensor
    for dtype, error in ((np.float32, None), (np.int64, "Assign takes")):
        tensors = {"x": Tensor("x", (3,), np.dtype(dtype), "input"), "y": Tensor("y", None, None, "output")}
        graph = Graph((Node("Assign", ("x",), ("y",), {}, "copy", {}, "memplan"),), tensors, ("x",), ("y",))
        if error is None:
            assert shapes.infer(graph).tensors["y"].dtype == dtype
        else:
            with pytest.raises(planner.ShapeError, match=error):
                shapes.infer(graph)


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                "ReduceLogSumExp"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduction_gradients(op, keepdims, backend):
    x = np.abs(p(2, 3, 4)) + 0.5  # positive, away from |x|'s kink and log's pole
    check(backend, weighted([(op, ["x", "axes"], ["a"], dict(keepdims=keepdims))], [2, 3, 4],
                   dict(axes=np.array([0, 2], np.int64)), opset=18), x)


@pytest.mark.parametrize("op, inputs, attrs, opset", [
    ("InstanceNormalization", dict(scale=(3,), bias=(3,)), {}, 22),
    ("GroupNormalization", dict(scale=(4,), bias=(4,)), dict(num_groups=2), 21),
    ("RMSNormalization", dict(scale=(5,)), dict(axis=-1), 23),
    ("MeanVarianceNormalization", {}, dict(axes=[0, 2]), 17),
    ("LpNormalization", {}, dict(axis=1, p=2), 22),
    ("LpNormalization", {}, dict(axis=-1, p=1), 22),
])
def test_normalisation_gradients(op, inputs, attrs, opset, backend):
    channels = 4 if op == "GroupNormalization" else 3
    params = {name: p(*shape) + 1.5 for name, shape in inputs.items()}
    m = weighted([(op, ["x", *params], ["a"], attrs)], [2, channels, 5], params, opset=opset)
    check(backend, m, p(2, channels, 5) + 0.5)


def test_normalisations_refuse_bad_weights():
    m = model([("InstanceNormalization", ["x", "s", "b"], ["y"], {})], [2, 3, 4], dict(s=p(4), b=p(3)), opset=22)
    with pytest.raises(planner.ShapeError, match=r"one value per channel, shape \(3,\); got \(4,\)"):
        planner.load(m)
    m = model([("GroupNormalization", ["x", "s", "b"], ["y"], dict(num_groups=2))], [2, 3, 4],
              dict(s=p(3), b=p(3)), opset=21)
    with pytest.raises(planner.ShapeError, match="num_groups 2 must divide the 3 channels"):
        planner.load(m)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum_gradients(exclusive, reverse, backend):
    m = weighted([("CumSum", ["x", "axis"], ["a"], dict(exclusive=exclusive, reverse=reverse))], [3, 4],
                 dict(axis=np.array(1, np.int64)))
    check(backend, m, p(3, 4))


def test_argmax_in_a_trained_graph_passes_no_gradient(backend):
    """ArgMax's int64 indices select values (GatherElements) whose gradient flows to x; none to the indices."""
    m = weighted([("ArgMax", ["x"], ["i"], dict(axis=1)), ("GatherElements", ["x", "i"], ["a"], dict(axis=1))],
                 [3, 4], {})
    check(backend, m, p(3, 4))


def test_gathernd_gradient_and_bounds(backend):
    m = weighted([("GatherND", ["x", "idx"], ["a"], {})], [3, 4, 2],
                 dict(idx=np.array([[0, 1], [2, -1], [0, 1]], np.int64)))  # a repeated tuple accumulates
    check(backend, m, p(3, 4, 2))
    bad = model([("GatherND", ["x", "idx"], ["y"], {})], [3, 4], dict(idx=np.array([[0, 4]], np.int64)))
    plan = planner.compile(bad)
    with pytest.raises(RunError, match="index 4 is out of bounds for a dimension of size 4"):
        Executor(plan, backend="numpy").run({"x": p(3, 4)})
