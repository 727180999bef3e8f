"""memplan.ScaledDotProductAttention's forms beyond softmax(scale Q K^T + bias) V (attention_tiles.Form): a
softcap, a sliding window, hidden keys filled with a finite value set or added before or after the bias, rows
that see nothing as NaN, and dropout: outputs against the float64 formula with tiles forced small (the
compiled float32 kernel too), gradients against finite differences, the PyTorch form, and the dropout mask
that memplan.Dropout draws."""
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from planner.autodiff import backward
from planner.ops.misc import dropout_keep
from test_autodiff import numeric_gradient
from test_fused_attention import SMALL, qkv, sdpa_model
from zoo_cases import run_on

RNG = np.random.default_rng(44)
FORMS = {
    "softcap": dict(softcap=1.5, scale=0.875),
    "window": dict(causal=1, window=3),
    "window, finite fill": dict(causal=1, window=4, fill=-7.0),
    "finite fill set": dict(causal=1, fill=5.0),
    "finite fill added": dict(causal=1, fill=-2.5, fill_mode="add"),
    "fill set after the bias": dict(causal=1, fill=3.0, fill_mode="set_after_bias"),
    "softcap, window and fill": dict(causal=1, window=2, softcap=2.0, fill=-1.0),
}


def reference(q, k, v, bias=None, step=0.0, **attrs):
    """(Y, LSE) in float64 by the plain formula of the op's form."""
    a = {"scale": 0.0, "causal": 0, "window": 0, "softcap": 0.0, "fill": -math.inf, "fill_mode": "set",
         "empty_rows": "zero", "dropout": 0.0, "seed": 0, **attrs}
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    heads, s, t = q.shape[1], q.shape[2], k.shape[2]
    k, v = (np.repeat(x, heads // x.shape[1], axis=1) for x in (k, v))
    scores = q @ k.swapaxes(-1, -2) * (a["scale"] or 1 / math.sqrt(q.shape[-1]))
    if a["softcap"]:
        scores = a["softcap"] * np.tanh(scores / a["softcap"])
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    hidden = ((j > i + t - s) | ((j <= i + t - s - a["window"]) if a["window"] else False)) if a["causal"] else None
    fill = lambda x: np.where(hidden, x + a["fill"] if a["fill_mode"] == "add" else a["fill"], x)  # noqa: E731
    if hidden is not None and a["fill_mode"] != "set_after_bias":
        scores = fill(scores)
    if bias is not None:
        scores = scores + bias.astype(np.float64)
    if hidden is not None and a["fill_mode"] == "set_after_bias":
        scores = fill(scores)
    top = scores.max(-1, keepdims=True)
    dead = np.isneginf(top)
    e = np.exp(scores - np.where(dead, 0, top))
    total = e.sum(-1, keepdims=True)
    p = e / np.where(dead, np.nan if a["empty_rows"] == "nan" else 1, total)
    with np.errstate(divide="ignore"):
        lse = (np.where(dead, 0, top) + np.log(total))[..., 0]
    if a["dropout"]:
        keep = dropout_keep(np, p.size, a["seed"], step, a["dropout"]).reshape(p.shape)
        p = p * keep / (1 - a["dropout"])
    return p @ v, np.where(dead[..., 0], -np.inf, lse)


def run(feeds, config=None, backend="numpy", step=None, **attrs):
    """(Y, LSE) by memplan on `backend`, poison on; `step` feeds dropout's step input."""
    names = ["q", "k", "v", "bias"][:len(feeds)]
    shapes = dict(zip(names, [(x.shape, x.dtype) for x in feeds]))
    if step is not None:
        shapes.setdefault("bias", None)
    m = sdpa_model(shapes["q"], shapes["k"], shapes["v"], shapes.get("bias"), lse=True, **attrs)
    if step is not None:
        node = m.graph.node[0]
        node.input[:] = [*node.input[:3], node.input[3] if shapes.get("bias") else "", "", "step"]
        m.graph.input.append(helper.make_tensor_value_info("step", TensorProto.DOUBLE, ()))
    got = run_on(backend, planner.compile(m, config=config),
                 {**dict(zip(names, feeds)), **({"step": np.array(step)} if step is not None else {})})
    return got["y"], got["lse"]


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("biased", [False, True], ids=["", "bias"])
def test_forms_match_the_formula(form, biased, config, backend):
    feeds = qkv(h=4, hkv=2, s=9, t=13)
    if biased:
        feeds.append(RNG.standard_normal((1, 4, 9, 13)))
    y, lse = run(feeds, config, backend, **FORMS[form])
    want_y, want_lse = reference(*feeds, **FORMS[form])
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", list(FORMS))
def test_the_compiled_float32_kernel_computes_the_same(form):
    """float32 (the numba kernel where numba is installed) against float64's formula."""
    feeds = qkv(h=4, hkv=2, s=33, t=40, d=16, dv=8, dtype=np.float32)
    feeds.append(RNG.standard_normal((33, 40)).astype(np.float32))
    y, lse = run(feeds, SMALL, **FORMS[form])
    want_y, want_lse = reference(*feeds, **FORMS[form])
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("empty_rows", ["zero", "nan"])
def test_rows_that_see_nothing_give_zeros_or_nan(empty_rows, dtype, backend):
    """S > T under causal: the first rows see no key; with empty_rows="nan" they are NaN as Softmax makes them."""
    feeds = qkv(h=2, hkv=2, s=7, t=4, dtype=dtype)
    y, lse = run(feeds, None, backend, causal=1, empty_rows=empty_rows)
    want_y, want_lse = reference(*feeds, causal=1, empty_rows=empty_rows)
    assert np.isnan(y[:, :, :3]).all() == (empty_rows == "nan") and not np.isnan(y[:, :, 3:]).any()
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
def test_dropout_draws_memplan_dropouts_mask(config, backend):
    """Each step its own mask, the one memplan.Dropout draws over the (B, H, S, T) probabilities."""
    feeds = qkv(h=4, hkv=2, s=9, t=13)
    attrs = dict(causal=1, dropout=0.25, seed=7)
    ys = []
    for step in (0.0, 1.0):
        y, lse = run(feeds, config, backend, step=step, **attrs)
        want_y, want_lse = reference(*feeds, step=step, **attrs)
        np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)
        ys.append(y)
    assert not np.allclose(ys[0], ys[1])


def test_dropout_without_its_step_is_a_shape_error():
    m = sdpa_model(((1, 2, 4, 3), np.float32), ((1, 2, 4, 3), np.float32), ((1, 2, 4, 3), np.float32), dropout=0.1)
    with pytest.raises(planner.ShapeError, match="dropout needs input 5, the step"):
        planner.load(m)


@pytest.mark.parametrize("attrs, error", [
    ({"window": 2}, "a window needs causal=1"), ({"causal": 1, "window": -1}, "window must be an int"),
    ({"softcap": -1.0}, "softcap must be a finite float"), ({"fill_mode": "replace"}, "fill_mode must be one of"),
    ({"empty_rows": "inf"}, "empty_rows one of"), ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
])
def test_bad_form_attributes_are_shape_errors(attrs, error):
    args = [((1, 2, 4, 3), np.float32)] * 3
    with pytest.raises(planner.ShapeError, match=error):
        planner.load(sdpa_model(*args, **attrs))


GRAD_FORMS = {**FORMS, "dropout": dict(causal=1, dropout=0.25, seed=3)}


def grad_model(attrs, biased):
    """y = sum(w * SDPA(x, k, v[, bias][, step])) over the input x (Q) and params K, V, bias, float64."""
    b, h, hkv, s, t, d, dv = 1, 4, 2, 5, 7, 3, 2
    inputs = ["x", "k", "v", "bias" if biased else ""] + (["", "step"] if attrs.get("dropout") else [])
    node = helper.make_node("ScaledDotProductAttention", inputs, ["a"], domain="memplan", **attrs)
    weight = helper.make_node("Mul", ["a", "w"], ["y"])
    params = {"k": RNG.standard_normal((b, hkv, t, d)), "v": RNG.standard_normal((b, hkv, t, dv)),
              "w": RNG.standard_normal((b, h, s, dv)), **({"bias": RNG.standard_normal((s, t))} if biased else {}),
              **({"step": np.array(2.0)} if attrs.get("dropout") else {})}
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, (b, h, s, d))
    graph = helper.make_graph([node, weight], "grad", [x], [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    return m, RNG.standard_normal((b, h, s, d))


def central_differences(f, arrays, name, eps=1e-6):
    """d f(**arrays) / d arrays[name] by central differences (f a float64 formula, cheap to call)."""
    value, grad = arrays[name], np.zeros_like(arrays[name])
    for k in np.ndindex(value.shape):
        for sign in (1, -1):
            moved = value.copy()
            moved[k] += sign * eps
            grad[k] += sign * f(**{**arrays, name: moved}) / (2 * eps)
    return grad


@pytest.mark.parametrize("form", list(GRAD_FORMS))
def test_gradients_match_finite_differences(form):
    """dQ, dK, dV and dBias of every form, in tiles of a few rows and keys, against central differences of the
    float64 formula (which the forward matches to 1e-12 above)."""
    attrs = GRAD_FORMS[form]
    m, x = grad_model(attrs, True)
    trained, grads = backward(planner.load(m), "y", wrt=["x", "k", "v", "bias"])
    got = run_on("numpy", planner.compile(trained, schedule="file", config=SMALL), {"x": x})
    params = {i.name: numpy_helper.to_array(i).copy() for i in m.graph.initializer}
    arrays = {"x": x, "k": params["k"], "v": params["v"], "bias": params["bias"]}

    def loss(x, k, v, bias):
        return float((reference(x, k, v, bias, step=2.0, **attrs)[0] * params["w"]).sum())
    for name in arrays:
        np.testing.assert_allclose(got[grads[name]], central_differences(loss, arrays, name), rtol=1e-5, atol=1e-7,
                                   err_msg=name)


@pytest.mark.torch
@pytest.mark.parametrize("form", list(GRAD_FORMS))
def test_torch_form_matches(form):
    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch
    feeds = [*qkv(h=4, hkv=2, s=6, t=9), RNG.standard_normal((6, 9))]
    attrs = GRAD_FORMS[form]
    m = sdpa_model(*[(x.shape, x.dtype) for x in feeds], lse=True, **attrs)
    names = ["q", "k", "v", "bias"]
    if attrs.get("dropout"):
        m.graph.node[0].input.extend(["", "step"])
        m.graph.input.append(helper.make_tensor_value_info("step", TensorProto.DOUBLE, ()))
        feeds, names = [*feeds, np.array(1.0)], [*names, "step"]
    with torch.no_grad():
        got = to_torch(m)(**{n: torch.tensor(x) for n, x in zip(names, feeds)})
    want_y, want_lse = reference(*feeds[:4], step=1.0, **attrs)
    np.testing.assert_allclose(got["y"].numpy(), want_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["lse"].numpy(), want_lse, rtol=1e-10, atol=1e-12)


def relative_terms(b=2, h=4, s=9, t=13, widths=(5, 6)):
    """DeBERTa's terms: tables (B, H, S, R) and (B, H, T, R') and their indices of S + T - 1 positions."""
    rows, cols = RNG.standard_normal((b, h, s, widths[0])), RNG.standard_normal((b, h, t, widths[1]))
    return rows, RNG.integers(0, widths[0], s + t - 1), cols, RNG.integers(0, widths[1], s + t - 1)


def with_relative(bias, rows, rows_index, cols, cols_index):
    """The bias plus the relative terms, whole, as the export computes them (float64)."""
    s, t = rows.shape[2], cols.shape[2]
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    gathered = np.take_along_axis(rows, np.broadcast_to(rows_index[i - j + t - 1], (*rows.shape[:2], s, t)), -1)
    crossed = np.take_along_axis(cols, np.broadcast_to(cols_index[(j - i + s - 1).T], (*cols.shape[:2], t, s)), -1)
    return (0 if bias is None else bias) + gathered + crossed.swapaxes(-1, -2)


def relative_model(shapes, terms, **attrs):
    """SDPA over inputs q, k, v, rows, cols (float64) with the two indices as initializers; outputs y, lse."""
    node = helper.make_node("ScaledDotProductAttention", ["q", "k", "v", "", "", "", "rows", "ri", "cols", "ci"],
                            ["y", "lse"], domain="memplan", **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in
              zip(["q", "k", "v", "rows", "cols"], [*shapes, terms[0].shape, terms[2].shape])]
    graph = helper.make_graph([node], "relative", inputs, [helper.make_tensor_value_info(n, 0, None) for n in node.output],
                              [numpy_helper.from_array(terms[1], "ri"), numpy_helper.from_array(terms[3], "ci")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("memplan", 1)])


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
@pytest.mark.parametrize("form", ["plain", "window, finite fill", "fill set after the bias"])
def test_relative_position_terms_match_the_formula(form, config, backend):
    feeds, terms = qkv(h=4, hkv=2, s=9, t=13), relative_terms()
    attrs = FORMS.get(form, {})
    m = relative_model([x.shape for x in feeds], terms, **attrs)
    got = run_on(backend, planner.compile(m, config=config),
                 dict(zip(["q", "k", "v", "rows", "cols"], [*feeds, terms[0], terms[2]])))
    want_y, want_lse = reference(*feeds, with_relative(None, *terms), **attrs)
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["lse"], want_lse, rtol=1e-12, atol=1e-12)


def test_relative_position_gradients_match_finite_differences():
    """dRows and dCols (scattered from dS) and dQ against central differences, in small tiles."""
    b, h, s, t, d = 1, 2, 5, 7, 3
    terms = relative_terms(b, h, s, t, (4, 3))
    node = helper.make_node("ScaledDotProductAttention", ["x", "k", "v", "", "", "", "rows", "ri", "cols", "ci"], ["a"],
                            domain="memplan", causal=1, fill=-3.0)
    weight = helper.make_node("Mul", ["a", "w"], ["y"])
    params = {"k": RNG.standard_normal((b, h, t, d)), "v": RNG.standard_normal((b, h, t, 2)),
              "w": RNG.standard_normal((b, h, s, 2)), "rows": terms[0], "ri": terms[1], "cols": terms[2], "ci": terms[3]}
    graph = helper.make_graph([node, weight], "grad", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, (b, h, s, d))],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    x = RNG.standard_normal((b, h, s, d))
    trained, grads = backward(planner.load(m), "y", wrt=["x", "rows", "cols"])
    got = run_on("numpy", planner.compile(trained, schedule="file", config=SMALL), {"x": x})
    values = {i.name: numpy_helper.to_array(i).copy() for i in m.graph.initializer}
    for name in ("x", "rows", "cols"):
        np.testing.assert_allclose(got[grads[name]], numeric_gradient(m, x, values, name, 1e-6), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


@pytest.mark.torch
def test_relative_position_torch_form_matches():
    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch
    feeds, terms = qkv(h=4, hkv=2, s=6, t=9), relative_terms(s=6, t=9)
    m = relative_model([x.shape for x in feeds], terms, causal=1)
    with torch.no_grad():
        got = to_torch(m)(**{n: torch.tensor(x) for n, x in zip(["q", "k", "v", "rows", "cols"],
                                                               [*feeds, terms[0], terms[2]])})
    want_y, want_lse = reference(*feeds, with_relative(None, *terms), causal=1)
    np.testing.assert_allclose(got["y"].numpy(), want_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["lse"].numpy(), want_lse, rtol=1e-10, atol=1e-12)
