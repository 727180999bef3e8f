"""The norm fusion pass and its ops: memplan.AddLayerNormalization and memplan.LayerNormalizationGrad against
finite differences and PyTorch, in chunks, without hidden allocations; norms in pieces and residual Adds fused,
results unchanged (with and without the pass, and against onnxruntime), training unchanged."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner import ops
from planner.autodiff import backward
from planner.config import Config
from planner.ops import Info
from test_autodiff import numeric_gradient
from test_fused_attention import cut
from test_no_hidden_allocations import BOUND, allocations
from zoo_cases import input_shapes, reference, rel_l2, small_model

RNG = np.random.default_rng(4)
SMALL = Config.from_env(workspace_limit=100)
"""A workspace limit that makes chunks of one row."""
GRAD = ops.get("LayerNormalizationGrad", "memplan")


def fused_model(shape=(2, 3, 5), axis=-1, rms=0, skip=True, bias=True, total=False, plain=False):
    """y = k * Y (+ k2 * Sum) of one memplan.AddLayerNormalization (or, `plain`, one LayerNormalization)
    over input x, float64, and a point x."""
    dims = shape[axis % len(shape):]
    params = {"w": RNG.standard_normal(dims), "b": RNG.standard_normal(dims), "s": RNG.standard_normal(shape),
              "k": RNG.standard_normal(shape), "k2": RNG.standard_normal(shape)}
    if plain:
        norm = helper.make_node("LayerNormalization", ["x", "w", *(["b"] if bias else [])], ["a"], axis=axis,
                                epsilon=1e-3, stash_type=11)
    else:
        norm = helper.make_node("AddLayerNormalization", ["x", "s" if skip else "", "w", "b" if bias else ""],
                                ["a", "t"] if total else ["a"], domain="memplan", axis=axis, epsilon=1e-3, rms=rms)
    nodes = [norm, helper.make_node("Mul", ["a", "k"], ["ya" if total else "y"])]
    if total:
        nodes += [helper.make_node("Mul", ["t", "k2"], ["yt"]), helper.make_node("Add", ["ya", "yt"], ["y"])]
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(v, k) for k, v in params.items() if k in used])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    return m, RNG.standard_normal(shape)


GRADIENT_CASES = [dict(plain=True), dict(plain=True, bias=False), dict(plain=True, shape=(2, 3, 4), axis=1),
                  dict(rms=0), dict(rms=1), dict(rms=1, skip=False), dict(rms=0, total=True),
                  dict(rms=1, bias=False, total=True), dict(rms=0, skip=False, bias=False, shape=(3, 2, 4), axis=1)]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("config", [None, SMALL], ids=["default chunks", "one-row chunks"])
def test_gradients_match_finite_differences(case, config):
    """dX, dskip, dscale and dbias of LayerNormalization and of the fused op (with its Sum read too) against
    central differences, the gradient one memplan.LayerNormalizationGrad."""
    m, x = fused_model(**case)
    names = ["x", *(i.name for i in m.graph.initializer if i.name in ("w", "b", "s"))]
    trained, grads = backward(planner.load(m), "y", wrt=names)
    assert [n.op for n in trained.nodes].count("LayerNormalizationGrad") == 1
    got = Executor(planner.compile(trained, schedule="file", config=config), backend="numpy", poison=True).run({"x": x})
    params = {i.name: numpy_helper.to_array(i).copy() for i in m.graph.initializer}
    for name in names:
        np.testing.assert_allclose(got[grads[name]], numeric_gradient(m, x, params, name, 1e-6), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


def _step(**attrs):
    return type("Step", (), {"attrs": {"axis": -1, "epsilon": 1e-5, "rms": 0, **attrs}})()


def _grad(dy, x, scale, limit=1 << 20, **attrs):
    """(dX, dscale, dbias) by the gradient op's kernel, its workspace cut from `limit`."""
    step = _step(**attrs)
    infos = [Info(a.shape, a.dtype) for a in (dy, x, scale)]
    outs = GRAD.infer(type("Node", (), {"attrs": step.attrs, "outputs": ("dx", "ds", "db")})(), infos)
    arrays = [np.empty(s, d) for s, d in outs]
    GRAD.kernel(np, step, [dy, x, scale], arrays, cut(GRAD.workspace(step, infos, outs, limit)))
    return arrays


@pytest.mark.torch
@pytest.mark.parametrize("rms", [0, 1])
def test_grad_op_matches_pytorch(rms):
    torch = pytest.importorskip("torch")
    x, dy, w = RNG.standard_normal((6, 7)), RNG.standard_normal((6, 7)), RNG.standard_normal(7)
    dx, dscale, dbias = _grad(dy, x, w, limit=200, rms=rms)
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, np.zeros(7)))
    if rms:
        y = xt * torch.rsqrt(xt.pow(2).mean(-1, keepdim=True) + 1e-5) * wt + bt
    else:
        y = torch.nn.functional.layer_norm(xt, (7,), wt, bt, 1e-5)
    y.backward(torch.tensor(dy))
    for got, want in ((dx, xt), (dscale, wt), (dbias, bt)):
        np.testing.assert_allclose(got, want.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_16_bit_inputs_take_their_statistics_in_float32():
    """The forward and gradient ops on float16 rows of a large mean against float64's, by the same ops."""
    x, skip = (RNG.standard_normal((8, 64)) + 30).astype(np.float16), RNG.standard_normal((8, 64)).astype(np.float16)
    dy, w = RNG.standard_normal((8, 64)), RNG.standard_normal(64)
    fwd = ops.get("AddLayerNormalization", "memplan")
    results = {}
    for dtype in (np.float16, np.float64):
        ins = [a.astype(dtype) for a in (x, skip, w)]
        step, infos = _step(), [Info(a.shape, a.dtype) for a in ins]
        outs = [np.empty(x.shape, dtype), np.empty(x.shape, dtype)]
        fwd.kernel(np, step, ins[:2] + [ins[2]], outs, cut(fwd.workspace(step, infos, None, 512)))
        results[dtype] = [*outs, *_grad(dy.astype(dtype), outs[1], ins[2], limit=512)]
    for half, wide in zip(results[np.float16], results[np.float64]):
        assert half.dtype == np.float16
        np.testing.assert_allclose(half, wide, rtol=2e-2, atol=2e-2 * np.abs(wide).max())


def test_no_hidden_allocations():
    """Forward and backward of a (4, 256, 768) norm allocate nothing hidden, and the planned scratch stays far
    below one full-size temporary."""
    m, _ = fused_model(shape=(4, 256, 768), rms=0, total=True)
    x = RNG.standard_normal((4, 256, 768))
    trained, _ = backward(planner.load(m), "y", wrt=["x", "w"])
    plan = planner.compile(trained)
    ex = Executor(plan, backend="numpy")
    seen, _ = allocations(ex, lambda: ex.run({"x": x}))
    assert all(n <= BOUND for _, n in seen), [(s.op, n) for s, n in seen if n > BOUND]
    scratch = [plan.tensors[s.workspace].nbytes for s in plan.steps if "LayerNormalization" in s.op and s.workspace]
    assert scratch and max(scratch) * 8 <= 4 * 256 * 768 * 8


@pytest.mark.parametrize("shapes, attrs, error", [
    (((2, 5), (2, 5), (4,)), {}, "does not broadcast to the normalised dims"),
    (((2, 5), (2, 4), (5,)), {}, "skip of shape"),
    (((2, 5), (2, 5), (5,)), {"rms": 2}, "rms must be 0"),
    (((2, 5), (2, 5), (5,)), {"epsilon": -1.0}, "epsilon must be"),
    (((2, 5), None, (5,)), {"total": True}, "the Sum output needs a skip input"),
    (((2, 5), (2, 5), (5,)), {"axis": 2}, "out of range"),
])
def test_bad_shapes_and_attributes_are_shape_errors(shapes, attrs, error):
    attrs = dict(attrs)
    total = attrs.pop("total", False)
    x, skip, scale = shapes
    node = helper.make_node("AddLayerNormalization", ["x", "s" if skip else "", "w"], ["y", "t"] if total else ["y"],
                            domain="memplan", **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("x", x), ("s", skip), ("w", scale))
              if s is not None]
    graph = helper.make_graph([node], "bad", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    with pytest.raises(planner.ShapeError, match=error):
        planner.load(m)
