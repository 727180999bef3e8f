"""memplan.ScaledDotProductAttention and its gradient op (planner/ops/fused_attention.py,
fused_attention_grad.py): outputs against a plain NumPy softmax(Q K^T scale + bias) V with tiles forced
small, gradients against finite differences, the workspace at long sequences, and no hidden allocations."""
import math

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
from test_no_hidden_allocations import BOUND, allocations
from zoo_cases import run_on

RNG = np.random.default_rng(19)
SDPA = ops.get("ScaledDotProductAttention", "memplan")
SMALL = Config.from_env(workspace_limit=2000)
"""A workspace limit that forces tiles of a few rows and keys."""


def sdpa_model(q, k, v, bias=None, lse=False, **attrs):
    """A model of one memplan.ScaledDotProductAttention node reading graph inputs of the given shapes
    and dtype ((shape, dtype) pairs; bias None for none), with outputs y (and lse)."""
    shapes = {"q": q, "k": k, "v": v, **({"bias": bias} if bias is not None else {})}
    node = helper.make_node("ScaledDotProductAttention", list(shapes), ["y", "lse"] if lse else ["y"],
                            domain="memplan", **attrs)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), s)
              for n, (s, t) in shapes.items()]
    outputs = [helper.make_tensor_value_info(n, 0, None) for n in node.output]
    graph = helper.make_graph([node], "sdpa", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("memplan", 1)])


def reference(q, k, v, bias=None, scale=0.0, causal=0):
    """(Y, LSE) in float64 by the plain formula; a row that sees no key gives zeros and LSE -inf."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    heads, s, t = q.shape[1], q.shape[2], k.shape[2]
    k, v = (np.repeat(x, heads // x.shape[1], axis=1) for x in (k, v))
    scores = q @ k.swapaxes(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if bias is not None:
        scores = scores + bias.astype(np.float64)
    if causal:
        scores = np.where(np.arange(t)[None, :] > np.arange(s)[:, None] + t - s, -np.inf, scores)
    top = scores.max(-1, keepdims=True)
    dead = np.isneginf(top)
    e = np.exp(scores - np.where(dead, 0, top))
    total = e.sum(-1, keepdims=True)
    y = (e @ v) / np.where(dead, 1, total)
    with np.errstate(divide="ignore"):
        lse = (np.where(dead, 0, top) + np.log(total))[..., 0]
    return y, np.where(dead[..., 0], -np.inf, lse)


def run(feeds, config=None, backend="numpy", **attrs):
    """(Y, LSE) by memplan on `backend`, poison on."""
    m = sdpa_model(*[(x.shape, x.dtype) for x in feeds], lse=True, **attrs)
    plan = planner.compile(m, config=config)
    got = run_on(backend, plan, dict(zip(["q", "k", "v", "bias"], feeds)))
    return got["y"], got["lse"], plan


def qkv(b=2, h=4, hkv=2, s=9, t=13, d=5, dv=3, dtype=np.float64):
    return [RNG.standard_normal(shape).astype(dtype) for shape in ((b, h, s, d), (b, hkv, t, d), (b, hkv, t, dv))]


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("h, hkv, s, t", [(4, 4, 9, 9), (4, 2, 9, 13), (6, 2, 13, 9), (3, 1, 1, 17)])
def test_matches_the_plain_formula(config, causal, h, hkv, s, t, backend):
    feeds = qkv(h=h, hkv=hkv, s=s, t=t)
    y, lse, plan = run(feeds, config, backend, causal=causal)
    want_y, want_lse = reference(*feeds, causal=causal)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)
    if config is SMALL:
        layout = next(iter(plan.steps)).scratch
        rows = next(c for c in layout if c.name == "rows").shape[0]
        assert rows < s or s == 1, "the small limit should split the queries into several tiles"


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
def test_masks_with_infinities_and_fully_masked_rows(config, backend):
    """A (1, H, S, T) bias with -inf, rows masked whole by it (zeros, LSE -inf, no NaN), a scale, and
    causal rows with no key (S > T)."""
    feeds = qkv(h=4, hkv=2, s=11, t=7)
    bias = RNG.standard_normal((1, 4, 11, 7))
    bias[RNG.random(bias.shape) < 0.3] = -np.inf
    bias[0, 1, 3] = bias[0, :, 8] = -np.inf
    for causal in (0, 1):
        y, lse, _ = run([*feeds, bias], config, backend, causal=causal, scale=0.625)
        want_y, want_lse = reference(*feeds, bias, scale=0.625, causal=causal)
        assert not np.isnan(y).any() and not np.isnan(lse).any()
        assert (y[:, 1, 3] == 0).all() and np.isneginf(lse[:, :, 8]).all()
        np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
        np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)
    bias = RNG.standard_normal((11, 1))  # broadcast over keys, batch and heads
    y, _, _ = run([*feeds, bias], config, backend)
    np.testing.assert_allclose(y, reference(*feeds, bias)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_narrow_floats_accumulate_in_float32(config, dtype, backend):
    feeds = qkv(s=33, t=40, d=16, dv=8, dtype=dtype)
    bias = np.where(RNG.random((33, 40)) < 0.2, -np.inf, 0).astype(dtype)
    y, lse, _ = run([*feeds, bias], config, backend, causal=1)
    assert y.dtype == dtype and lse.dtype == np.float32
    want_y, want_lse = reference(*feeds, bias, causal=1)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(y, want_y, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


def grad_model(lse, bias, causal):
    """y = sum(k_y * Y) of SDPA over the input x (Q) and params K, V (and a bias), float64."""
    b, h, hkv, s, t, d, dv = 1, 4, 2, 5, 7, 3, 2
    node = helper.make_node("ScaledDotProductAttention", ["x", "k", "v", *(["bias"] if bias else [])],
                            ["a", "lse"] if lse else ["a"], domain="memplan", causal=causal, scale=0.6)
    weight = helper.make_node("Mul", ["a", "w"], ["y"])
    params = {"k": RNG.standard_normal((b, hkv, t, d)), "v": RNG.standard_normal((b, hkv, t, dv)),
              "w": RNG.standard_normal((b, h, s, dv))}
    if bias:
        mask = np.where(RNG.random((s, t)) < 0.3, -np.inf, 0.0)
        mask[2] = -np.inf  # a row that sees nothing: zero gradients, no NaN
        params["bias"] = mask
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, (b, h, s, d))
    graph = helper.make_graph([node, weight], "grad", [x],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    return m, RNG.standard_normal((b, h, s, d))


@pytest.mark.parametrize("lse, bias, causal", [(True, False, 0), (False, False, 1), (True, True, 1), (False, True, 0)])
@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
def test_gradients_match_finite_differences(lse, bias, causal, config, backend):
    """dQ, dK and dV against central differences, with the saved LSE or recomputing it."""
    m, x = grad_model(lse, bias, causal)
    graph = planner.load(m)
    trained, grads = backward(graph, "y", wrt=["x", "k", "v"])
    assert any(n.op == "ScaledDotProductAttentionGrad" for n in trained.nodes)
    got = run_on(backend, planner.compile(trained, schedule="file", config=config), {"x": x})
    params = {i.name: numpy_helper.to_array(i).copy() for i in m.graph.initializer}
    for name in ("x", "k", "v"):
        assert not np.isnan(got[grads[name]]).any()
        np.testing.assert_allclose(got[grads[name]], numeric_gradient(m, x, params, name, 1e-6), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


def test_grad_of_16_bit_inputs_sums_dq_in_float32():
    """The gradient op on float16 inputs against float64's, by the same op."""
    feeds = qkv(s=40, t=40, d=8, dv=8, dtype=np.float16)
    dy = RNG.standard_normal((2, 4, 40, 8))
    grad = ops.get("ScaledDotProductAttentionGrad", "memplan")
    results = {}
    for dtype in (np.float16, np.float64):
        q, k, v = (f.astype(dtype) for f in feeds)
        step = type("Step", (), {"attrs": {"scale": 0.0, "causal": 1}})()
        y, lse = (np.empty(s, t) for s, t in SDPA.infer(step, [Info(q.shape, q.dtype), Info(k.shape, k.dtype),
                                                             Info(v.shape, v.dtype)]))
        ws = cut(SDPA.workspace(step, [Info(x.shape, x.dtype) for x in (q, k, v)], None, 8192))
        SDPA.kernel(np, step, [q, k, v], [y, lse], ws)
        outs = [np.empty(x.shape, x.dtype) for x in (q, k, v)]
        infos = [Info(x.shape, x.dtype) for x in (q, k, v)] + [None] * 4
        ws = cut(grad.workspace(step, infos, None, 8192))
        grad.kernel(np, step, [q, k, v, None, y, lse, dy.astype(dtype)], outs, ws)
        results[dtype] = outs
    for half, wide in zip(results[np.float16], results[np.float64]):
        assert half.dtype == np.float16
        np.testing.assert_allclose(half, wide, rtol=2e-2, atol=2e-2)


def cut(layout):
    """{slice name: view} of a fresh buffer, as the executor cuts a step's workspace."""
    raw = np.empty(layout.nbytes, np.uint8)
    return {c.name: raw[c.offset:c.offset + c.nbytes].view(c.dtype).reshape(c.shape) for c in layout.slices}


def test_workspace_is_one_tile_at_long_sequences():
    """At S = T = 4096 the planned scratch is far below one head's (S, T) float32 scores, forward and
    backward, and within the limit it is given."""
    s = t = 4096
    infos = [Info((1, 12, s, 64), np.dtype(np.float32)), Info((1, 12, t, 64), np.dtype(np.float32)),
             Info((1, 12, t, 64), np.dtype(np.float32))]
    node = type("Node", (), {"attrs": {"causal": 1}})()
    forward = SDPA.workspace(node, infos, None, 64 << 20).nbytes
    backward_ = ops.get("ScaledDotProductAttentionGrad", "memplan").workspace(node, infos + [None] * 4, None,
                                                                               64 << 20).nbytes
    assert forward * 64 < s * t * 4 and backward_ * 32 < s * t * 4, (forward, backward_)
    for limit in (1 << 16, 1 << 20):
        assert SDPA.workspace(node, infos, None, limit).nbytes <= limit
    m = sdpa_model(((1, 12, s, 64), np.float32), ((1, 12, t, 64), np.float32), ((1, 12, t, 64), np.float32), causal=1)
    plan = planner.compile(m)
    assert plan.steps[0].workspace and plan.tensors[plan.steps[0].workspace].nbytes == forward


def test_no_hidden_allocations_at_1024():
    feeds = qkv(b=1, h=4, hkv=2, s=1024, t=1024, d=64, dv=64, dtype=np.float32)
    for causal, bias in ((0, None), (1, np.zeros((1024, 1024), np.float32))):
        m = sdpa_model(*[(x.shape, x.dtype) for x in feeds], bias=None if bias is None else (bias.shape, bias.dtype),
                       lse=bias is not None, causal=causal)
        ex = Executor(planner.compile(m), backend="numpy")
        data = dict(zip(["q", "k", "v", "bias"], [*feeds, bias]))
        data = {k: v for k, v in data.items() if v is not None}
        seen, _ = allocations(ex, lambda: ex.run(data))
        assert all(n <= BOUND for _, n in seen), seen


def test_training_graph_allocates_nothing_hidden():
    """The gradient op at S = 512 too."""
    feeds = qkv(b=1, h=2, hkv=1, s=512, t=512, d=32, dv=32, dtype=np.float32)
    m = sdpa_model(*[(x.shape, x.dtype) for x in feeds], causal=1)
    graph = planner.load(m)
    trained, grads = backward(graph, "y", wrt=["q", "k", "v"])
    ex = Executor(planner.compile(trained), backend="numpy")
    seen, _ = allocations(ex, lambda: ex.run(dict(zip(["q", "k", "v"], feeds))))
    assert all(n <= BOUND for _, n in seen), [(s.op, n) for s, n in seen if n > BOUND]


@pytest.mark.parametrize("shapes, bias, attrs, error", [
    (((2, 4, 5, 3), (2, 4, 6), (2, 4, 6, 3)), None, {}, "must be 4-D"),
    (((2, 4, 5, 3), (1, 4, 6, 3), (1, 4, 6, 3)), None, {}, "one batch size"),
    (((2, 4, 5, 3), (2, 4, 6, 3), (2, 4, 7, 3)), None, {}, "same heads and sequence length"),
    (((2, 4, 5, 3), (2, 4, 6, 2), (2, 4, 6, 3)), None, {}, "one head size"),
    (((2, 4, 5, 3), (2, 3, 6, 3), (2, 3, 6, 3)), None, {}, "multiple of the 3 key"),
    (((2, 4, 5, 3), (2, 2, 6, 3), (2, 2, 6, 3)), (5, 5), {}, "does not broadcast"),
    (((2, 4, 5, 3), (2, 2, 6, 3), (2, 2, 6, 3)), None, {"causal": 2}, "causal must be 0 or 1"),
])
def test_bad_shapes_and_attributes_are_shape_errors(shapes, bias, attrs, error):
    args = [(s, np.float32) for s in shapes]
    with pytest.raises(planner.ShapeError, match=error):
        planner.load(sdpa_model(*args, bias=None if bias is None else (bias, np.float32), **attrs))


def test_flops():
    infos = [Info((2, 4, 8, 16), np.float32), Info((2, 2, 8, 16), np.float32), Info((2, 2, 8, 16), np.float32)]
    node = type("Node", (), {"attrs": {}})()
    assert SDPA.flops(node, infos, None) == 4 * 2 * 4 * 8 * 8 * 16
    node.attrs = {"causal": 1}
    assert SDPA.flops(node, infos, None) == 4 * 2 * 4 * (8 * 9 // 2) * 16


@pytest.mark.torch
@pytest.mark.parametrize("causal", [0, 1])
def test_torch_form_matches(causal):
    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch
    feeds = qkv(h=4, hkv=2, s=6, t=9)
    bias = np.where(RNG.random((6, 9)) < 0.2, -np.inf, 0.0)
    bias[1] = -np.inf
    m = sdpa_model(*[(x.shape, x.dtype) for x in [*feeds, bias]], lse=True, causal=causal)
    with torch.no_grad():
        got = to_torch(m)(**{n: torch.tensor(x) for n, x in zip(["q", "k", "v", "bias"], [*feeds, bias])})
    want_y, want_lse = reference(*feeds, bias, causal=causal)
    np.testing.assert_allclose(got["y"].numpy(), want_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["lse"].numpy(), want_lse, rtol=1e-10, atol=1e-12)


def test_trains_in_a_compiled_step():
    """A training plan (mse, adam) holds the forward and gradient ops and lowers the loss."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("ScaledDotProductAttention", ["q", "k", "v"], ["y"], domain="memplan", causal=1)]
    inits = [numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w", (4, 4)), ("k", (1, 1, 8, 4)), ("v", (1, 1, 8, 4)))]
    graph = helper.make_graph(nodes, "train", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 8, 4))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    plan = planner.compile(m, training=True, loss="mse", optimizer="adam")
    ops_run = [s.op for s in plan.steps if "Scaled" in s.op]
    assert ops_run == ["ScaledDotProductAttention", "ScaledDotProductAttentionGrad"]
    ex = Executor(plan, backend="numpy")
    data = {"x": RNG.standard_normal((1, 2, 8, 4)).astype(np.float32),
            "targets": RNG.standard_normal(plan.tensors["targets"].shape).astype(np.float32)}
    losses = [float(ex.train_step(data)) for _ in range(5)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
