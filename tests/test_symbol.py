"""The native symbolic API: graphs built directly and through ONNX agree, and the ONNX runs."""
import numpy as np
import onnx
import pytest

import planner
from frontends import symbol as S
from planner.errors import ModelError
from planner.ir import Annotations

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(0)


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.1).astype(np.float32)


def _cnn():
    x = S.var("data", ("batch", 3, 16, 16))
    with S.annotate(force_mirroring=True, mirror_stage="s1"):
        h = S.conv2d(x, S.param("conv1_w", _w(8, 3, 3, 3)), S.param("conv1_b", _w(8)), pad=1, name="conv1")
        h = S.batch_norm(h, S.param("bn1_gamma", _w(8) + 1), S.param("bn1_beta", _w(8)),
                         S.param("bn1_mean", _w(8)), S.param("bn1_var", np.abs(_w(8)) + 1))
        h = S.relu(h)
    h = S.pooling(h, "max", kernel=2, stride=2)
    h = S.relu(S.conv2d(h, S.param("conv2_w", _w(8, 4, 3, 3)), stride=2, pad=(1, 1), groups=2))
    h = S.flatten(S.pooling(h, "global_avg"))
    return S.softmax(S.dense(h, S.param("fc_w", _w(10, 8)), S.param("fc_b", _w(10)), name="fc"))


def _attention(d=16, heads=2):
    x = S.var("tokens", ("batch", "seq", d))
    dh = d // heads

    def split_heads(t):
        return S.transpose(S.reshape(t, (0, 0, heads, dh)), (0, 2, 1, 3))

    q, k, v = (split_heads(S.dense(x, S.param(f"w{n}", _w(d, d)), S.param(f"b{n}", _w(d)), name=n)) for n in "qkv")
    scores = (q @ S.transpose(k, (0, 1, 3, 2))) * (1 / np.sqrt(dh))
    ctx = S.reshape(S.transpose(S.softmax(scores) @ v, (0, 2, 1, 3)), (0, 0, d))
    y = S.layer_norm(S.dense(ctx, S.param("wo", _w(d, d))) + x, S.param("ln_g", _w(d) + 1), S.param("ln_b", _w(d)))
    with S.annotate(mirror_stage="ffn"):
        ffn = S.dense(S.gelu(S.dense(y, S.param("w1", _w(2 * d, d)), S.param("b1", _w(2 * d)))),
                      S.param("w2", _w(d, 2 * d)), S.param("b2", _w(d)))
    return S.dropout(ffn + y, 0.1)


def _static_args():
    """Ops whose static arguments ONNX passes as inputs at some opsets."""
    x = S.var("x", ("n", 4, 8, 8))
    h = S.clip(x, 0.0, 6)
    h = S.pad(h, [0, 0, 1, 1, 0, 0, 1, 1], value=0.5)
    h = S.slice(h, [1, 1], [9, 9], axes=[2, 3])
    h = S.resize(h, scales=[1, 1, 2, 2])
    h = S.reduce_mean(h, axes=[2, 3], keepdims=False)
    h = S.squeeze(S.unsqueeze(h, [2]), [2])
    a, b = S.split(h, 2, axis=1)
    c, d = S.split(S.concat(b, a, axis=1), [1, 3], axis=1)
    h = S.expand(S.reshape(S.concat(d, c, axis=1), (-1, 4, 1)), (1, 4, 3))
    h = S.reduce_sum(h, axes=[2])
    h = S.where(S.op("Greater", h, S.const(0.0)), h, 0.0)
    return S.gather(S.cast(h, "float16"), S.const(np.array([0, 2])), axis=1)


MODELS = {"cnn": (_cnn, {"data": (2, 3, 16, 16)}, [(2, 10)]),
          "attention": (_attention, {"tokens": (2, 5, 16)}, [(2, 5, 16)]),
          "static_args": (_static_args, {"x": (3, 4, 8, 8)}, [(3, 2, 1)])}


def _plain(value):
    """A comparable form of an attribute value that tells ints, floats, lists and tuples apart."""
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), repr(value.tolist()))
    return repr(value)


def assert_same_graph(a, b):
    assert (a.inputs, a.outputs, a.opset) == (b.inputs, b.outputs, b.opset)
    assert [(n.op, n.name, n.inputs, n.outputs, n.notes) for n in a.nodes] == \
        [(n.op, n.name, n.inputs, n.outputs, n.notes) for n in b.nodes]
    for na, nb in zip(a.nodes, b.nodes):
        assert {k: _plain(v) for k, v in na.attrs.items()} == {k: _plain(v) for k, v in nb.attrs.items()}, na.name
    assert list(a.tensors) == list(b.tensors)
    for name, ta in a.tensors.items():
        tb = b.tensors[name]
        assert (ta.shape, ta.dtype, ta.kind) == (tb.shape, tb.dtype, tb.kind), name
        assert (ta.data is None) == (tb.data is None), name
        if ta.data is not None:
            assert ta.data.dtype == tb.data.dtype and np.array_equal(ta.data, tb.data), name


def _run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _feeds(shapes):
    return {name: RNG.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("which", ["cnn", "static_args"])
def test_round_trip(which, opset):
    build, shapes, _ = MODELS[which]
    sym = build()
    assert_same_graph(planner.load(sym.to_graph(opset), shapes), planner.load(sym.to_onnx(opset), shapes))


def test_round_trip_attention():
    build, shapes, _ = MODELS["attention"]
    sym = build()
    assert_same_graph(planner.load(sym, shapes), planner.load(sym.to_onnx(), shapes))


@pytest.mark.parametrize("which", sorted(MODELS))
def test_onnx_checks_and_runs(which):
    build, shapes, expected = MODELS[which]
    model = build().to_onnx()
    onnx.checker.check_model(model, full_check=True)
    outputs = _run(model, _feeds(shapes))
    assert [o.shape for o in outputs] == expected
    assert all(np.isfinite(o).all() for o in outputs)
    graph = planner.load(model, shapes)
    assert [graph.tensors[o].shape for o in graph.outputs] == expected


def test_graph_declares_inputs_params_and_consts():
    graph = _attention().to_graph()
    assert graph.inputs == ("tokens",)
    assert graph.tensors["tokens"].shape == ("batch", "seq", 16)
    assert graph.tensors["tokens"].dtype == np.float32
    assert graph.tensors["wq"].kind == "param" and graph.tensors["wq"].data.shape == (16, 16)
    assert {t.dtype for t in graph.tensors.values() if t.kind == "const"} == {np.dtype(np.float32)}
    ops = [n.op for n in graph.nodes]
    assert "Gemm" not in ops and ops.count("MatMul") == 8 and ops[-1] == "Dropout"
    assert {n.op for n in _cnn().to_graph().nodes} >= {"Gemm", "Conv", "MaxPool", "GlobalAveragePool"}


def test_static_arguments_are_attributes():
    nodes = {n.op: n for n in _static_args().to_graph().nodes}
    assert nodes["Clip"].attrs == {"min": 0.0, "max": 6.0} and nodes["Clip"].inputs == ("x",)
    assert nodes["Pad"].attrs == {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "constant", "constant_value": 0.5}
    assert nodes["Slice"].attrs == {"starts": [1, 1], "ends": [9, 9], "axes": [2, 3]}
    assert nodes["Resize"].attrs == {"scales": [1.0, 1.0, 2.0, 2.0], "mode": "nearest"}
    assert nodes["Expand"].attrs == {"shape": [1, 4, 3]} and len(nodes["Expand"].inputs) == 1
    assert nodes["Cast"].attrs == {"to": onnx.TensorProto.FLOAT16}


def test_annotations():
    x = S.var("x", (2, 3))
    with S.annotate(force_mirroring=True):
        with S.annotate(mirror_stage="s1"):
            a = S.relu(x, name="a")
            b = S.sigmoid(a, name="b", meta={"mirror_stage": "s2", "force_mirroring": False})
        c = S.tanh(b, name="c")
    d = S.exp(c, name="d", meta={"mirror_stage": 3})
    want = {"a": Annotations(force_mirroring=True, mirror_stage="s1"), "b": Annotations(mirror_stage="s2"),
            "c": Annotations(force_mirroring=True), "d": Annotations(mirror_stage="3")}
    for graph in (d.to_graph(), planner.load(d.to_onnx())):
        assert {n.name: n.notes for n in graph.nodes} == want
    props = {n.name: {p.key: p.value for p in n.metadata_props} for n in d.to_onnx().graph.node}
    assert props["a"] == {"memplan.force_mirroring": "1", "memplan.mirror_stage": "s1"}


def test_operators_and_scalar_promotion():
    x = S.var("x", (2, 3))
    w = S.param("w", _w(3, 4))
    y = ((2 * x + 1) - (1 - x) / 2) ** 2
    z = -(y @ w)
    graph = z.to_graph()
    assert [n.op for n in graph.nodes] == ["Mul", "Add", "Sub", "Div", "Sub", "Pow", "MatMul", "Neg"]
    assert graph.nodes[0].inputs[0] == "const_0" and graph.nodes[0].inputs[1] == "x"
    assert all(t.dtype == np.float32 and t.shape == () for t in graph.tensors.values() if t.kind == "const")
    xv = RNG.standard_normal((2, 3)).astype(np.float32)
    want = -((((2 * xv + 1) - (1 - xv) / 2) ** 2) @ graph.tensors["w"].data)
    np.testing.assert_allclose(_run(z.to_onnx(), {"x": xv})[0], want, rtol=1e-5)
    i = S.var("i", (4,), dtype="int64")
    h = S.var("h", (4,), dtype=np.float16)
    assert (i + 1).dtype == np.int64 and (h * 0.5).dtype == np.float16
    assert {t.dtype for t in (h * 0.5).to_graph().tensors.values()} == {np.dtype(np.float16)}
    assert S.cast(i, np.float32).dtype == np.float32 and S.op("Shape", h).dtype == np.int64
    assert S.op("Less", h, h).dtype == np.bool_
    with pytest.raises(TypeError, match="cannot become a int64"):
        i + 0.5
    with pytest.raises(TypeError, match="unsupported operand"):
        x + "1"


def test_group_and_multi_output_ops():
    x = S.var("x", ("n", 6))
    a, b, c = S.split(x, 3, axis=1, name="parts")
    y, mask = S.dropout(S.relu(a), 0.2, training=True, mask=True, name="drop")
    g = S.group(y + b, S.exp(c, name="e"), mask)
    assert len(g) == 3 and g[1].name == "e"
    graph = g.to_graph()
    assert graph.outputs == ("Add_0", "e", "drop:1")
    assert graph.nodes[0].outputs == ("parts:0", "parts:1", "parts:2")
    assert g.to_graph(18).nodes[0].attrs["num_outputs"] == 3
    model = g.to_onnx()
    onnx.checker.check_model(model, full_check=True)
    outs = _run(model, {"x": np.ones((4, 6), np.float32)})
    assert [o.shape for o in outs] == [(4, 2), (4, 2), (4, 2)] and outs[2].dtype == np.bool_
    assert_same_graph(planner.load(g, {"x": (4, 6)}), planner.load(model, {"x": (4, 6)}))
    bn = S.batch_norm(x, *(S.param(n, np.ones(6, np.float32)) for n in ("g", "b", "m", "v")), training=True)
    assert len(bn) == 3 and S.group(*bn).to_graph().nodes[0].attrs["training_mode"] == 1
    onnx.checker.check_model(S.group(*bn).to_onnx(), full_check=True)


def test_auto_names_are_per_build():
    def model():
        x = S.var("x", (2, 2))
        return S.relu(S.relu(x) + S.relu(x, name="Relu_0"))
    first = [n.name for n in model().to_graph().nodes]
    assert first == ["Relu_1", "Relu_0", "Add_0", "Relu_2"]  # auto names skip given ones
    assert [n.name for n in model().to_graph().nodes] == first


def test_errors():
    x = S.var("x", (2, 3))
    with pytest.raises(TypeError, match="Relu input 0: expected a Symbol, got list; wrap values with const"):
        S.relu([1.0, 2.0])
    with pytest.raises(TypeError, match="Softmax has no attribute axes"):
        S.op("Softmax", x, axes=[1])
    with pytest.raises(ModelError, match="must be static"):
        S.op("Reshape", x, S.op("Shape", x))
    with pytest.raises(TypeError, match="group of 2 outputs"):
        S.relu(S.group(x, x))
    with pytest.raises(ModelError, match="names given to more than one symbol: x"):
        S.relu(x, name="x").to_graph()
    with pytest.raises(ModelError, match="opsets 13 to"):
        S.relu(x).to_onnx(opset=11)
    with pytest.raises(ValueError, match="kind must be"):
        S.pooling(x, "median", kernel=2)
    with pytest.raises(TypeError, match="shape must be"):
        S.var("y", (2, 3.5))
    with pytest.raises(planner.UnsupportedOpError):
        S.op("NoSuchOp", x)


def test_const_from_a_shape_becomes_an_attribute():
    x = S.var("x", (2, 3))
    y = S.op("Reshape", x, S.const(np.array([3, 2])))
    assert y.to_graph().nodes[0].attrs == {"shape": [3, 2]} and y.ndim == 2
    assert S.reshape(x, (3, 2)).ndim == 2
