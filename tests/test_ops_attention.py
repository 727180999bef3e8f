"""Attention, rotary embeddings and ONNX Runtime's transformer contrib ops (planner/ops/attention.py,
contrib.py, contrib_attention.py): each contrib op planned and run with poison against onnxruntime,
gradients of the composites against finite differences, and the refusals."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner.autodiff import backward
from test_autodiff import check, model, p, weighted
from zoo_cases import run_on

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)
MS = "com.microsoft"


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def contrib(op, inputs, outputs, consts=None, opset=17, domain=MS, out=TensorProto.FLOAT, **attrs):
    """A model of one `op` node reading `inputs` (name -> array, None for an omitted one) as graph inputs
    and `consts` as initializers; its outputs are declared of type `out`."""
    consts = consts or {}
    names = list(inputs) + [k for k in consts if k not in inputs]
    node = helper.make_node(op, [k if k in consts or inputs.get(k) is not None else "" for k in names],
                            outputs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for k, v in inputs.items() if v is not None and k not in consts],
        [helper.make_tensor_value_info(o, out, None) for o in outputs if o],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def assert_matches_onnxruntime(backend, m, feeds, rtol=1e-4, atol=1e-5, theirs=None):
    """memplan's outputs (on `backend`, poison on) against onnxruntime's, of `theirs` (model, feeds)
    where onnxruntime's CPU lacks the form `m` is in."""
    model, inputs = theirs or (m, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    got = run_on(backend, planner.compile(m, {k: v.shape for k, v in feeds.items()}), feeds)
    for name, value in want.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("op, extra, attrs", [
    ("Gelu", {}, {}), ("QuickGelu", {}, {}), ("QuickGelu", {}, dict(alpha=1.3)), ("FastGelu", {}, {}),
    ("FastGelu", dict(bias=(6,)), {}), ("BiasGelu", dict(bias=(6,)), {})])
def test_contrib_activations_match_onnxruntime(op, extra, attrs, backend):
    feeds = dict(x=rand(2, 3, 6), **{k: rand(*s) for k, s in extra.items()})
    assert_matches_onnxruntime(backend, contrib(op, feeds, ["y"], **attrs), feeds)


@pytest.mark.parametrize("op, weights", [("SkipLayerNormalization", ("gamma", "beta", "bias")),
                                         ("SkipLayerNormalization", ("gamma",)),
                                         ("SkipSimplifiedLayerNormalization", ("gamma", "bias"))])
@pytest.mark.parametrize("skip", [(2, 3, 8), (3, 8)])
def test_skip_normalisations_match_onnxruntime(op, weights, skip, backend):
    all_weights = ("gamma", "beta", "bias") if op == "SkipLayerNormalization" else ("gamma", "bias")
    feeds = dict(x=rand(2, 3, 8), skip=rand(*skip), **{w: rand(8) if w in weights else None for w in all_weights})
    for outputs in (["y", "mean", "inv_std_var", "sum"], ["y", "", "", "sum"], ["y"]):
        m = contrib(op, feeds, outputs, epsilon=1e-5)
        assert_matches_onnxruntime(backend, m, {k: v for k, v in feeds.items() if v is not None})


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_normalization_matches_onnxruntime(axis):
    """ONNX Runtime defines it in ONNX's domain; memplan reads it in com.microsoft too."""
    feeds = dict(x=rand(2, 3, 4), scale=rand(*([3, 4] if axis == 1 else [4])))
    theirs = contrib("SimplifiedLayerNormalization", feeds, ["y", "inv"], domain="", axis=axis)
    session = ort.InferenceSession(theirs.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    ours = contrib("SimplifiedLayerNormalization", feeds, ["y", "inv"], axis=axis)
    got = Executor(planner.compile(ours), backend="numpy", poison=True).run(feeds)
    for name, value in zip(["y", "inv"], want):
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    alone = Executor(planner.compile(contrib("SimplifiedLayerNormalization", feeds, ["y"], axis=axis)), backend="numpy",
                     poison=True).run(feeds)
    np.testing.assert_allclose(alone["y"], want[0], rtol=1e-4, atol=1e-6)


def test_contrib_ops_check_their_types():
    feeds = dict(x=rand(2, 3).astype(np.int32))
    with pytest.raises(planner.ShapeError, match="Gelu takes"):
        planner.load(contrib("Gelu", feeds, ["y"]))
    with pytest.raises(planner.ShapeError, match=r"gamma must have the hidden size's shape \(8,\)"):
        planner.load(contrib("SkipLayerNormalization", dict(x=rand(2, 8), skip=rand(2, 8), gamma=rand(4)), ["y"]))


@pytest.mark.parametrize("shape, positions, attrs", [
    ((2, 3, 16), (2, 3), dict(num_heads=2)), ((2, 3, 16), (1,), dict(num_heads=2, interleaved=1)),
    ((2, 2, 3, 8), (2, 3), {}), ((2, 3, 16), (2, 3), dict(num_heads=2, rotary_embedding_dim=4)),
    ((2, 2, 3, 8), (1,), dict(rotary_embedding_dim=4, num_heads=2, interleaved=1))])
def test_contrib_rotary_embedding_matches_onnxruntime(shape, positions, attrs, backend):
    half = attrs.get("rotary_embedding_dim", 8) // 2
    angles = rand(10, half)
    ids = np.array([2]) if positions == (1,) else RNG.integers(0, 10, positions)
    feeds = dict(x=rand(*shape), positions=ids.astype(np.int64), cos=np.cos(angles), sin=np.sin(angles))
    assert_matches_onnxruntime(backend, contrib("RotaryEmbedding", feeds, ["y"], **attrs), feeds)


def key_mask(kind, batch, seq, total):
    """int32 key masks of onnxruntime's forms: lengths, or ones and zeros by key or by query and key."""
    if kind == "lengths":
        return np.array([total, total - 2][:batch], np.int32)
    mask = (RNG.random((batch, seq, total) if kind == "3d" else (batch, total)) > 0.3).astype(np.int32)
    mask[..., 0] = 1  # no row all masked
    return mask


@pytest.mark.parametrize("form", ["3d", "bias", "qkv", "kv", "bnsh"])
def test_multi_head_attention_forms_match_onnxruntime(form, backend):
    b, s, length, n, h = 2, 3, 5, 2, 4
    feeds = dict(q=rand(b, s, n * h), k=rand(b, length, n * h), v=rand(b, length, n * 6))
    theirs = None
    if form == "bias":
        feeds["bias"] = rand(2 * n * h + n * 6)
    elif form == "bnsh":
        feeds = dict(q=feeds["q"], k=rand(b, n, length, h), v=rand(b, n, length, h))
    elif form in ("qkv", "kv"):  # onnxruntime's CPU has neither: checked against the same data unpacked
        packed = rand(b, s, n, 3, h) if form == "qkv" else rand(b, length, n, 2, h)
        parts = [packed[:, :, :, k].reshape(b, -1, n * h) for k in range(packed.shape[3])]
        unpacked = dict(q=parts[0], k=parts[1], v=parts[2]) if form == "qkv" else dict(q=feeds["q"], k=parts[0], v=parts[1])
        theirs = contrib("MultiHeadAttention", unpacked, ["y"], num_heads=n), unpacked
        feeds = dict(q=packed) if form == "qkv" else dict(q=feeds["q"], k=packed)
    assert_matches_onnxruntime(backend, contrib("MultiHeadAttention", feeds, ["y"], num_heads=n), feeds, theirs=theirs)


@pytest.mark.parametrize("mask", [None, "lengths", "2d", "3d"])
@pytest.mark.parametrize("past, unidirectional", [(0, 0), (2, 1), (2, 0)])
def test_multi_head_attention_masks_and_past_match_onnxruntime(mask, past, unidirectional, backend):
    b, s, n, h = 2, 3, 2, 4
    total = past + s
    feeds = dict(q=rand(b, s, n * h), k=rand(b, s, n * h), v=rand(b, s, n * h), bias=None,
                 mask=None if mask is None else key_mask(mask, b, s, total), attention_bias=rand(1, n, s, total),
                 past_key=rand(b, n, past, h) if past else None, past_value=rand(b, n, past, h) if past else None)
    outputs = ["y", "present_key", "present_value"] if past else ["y"]
    m = contrib("MultiHeadAttention", feeds, outputs, num_heads=n, unidirectional=unidirectional, scale=0.3)
    assert_matches_onnxruntime(backend, m, {k: v for k, v in feeds.items() if v is not None})


@pytest.mark.parametrize("mask", [None, "lengths", "2d", "3d"])
@pytest.mark.parametrize("past, unidirectional, sizes", [(0, 0, None), (2, 1, None), (0, 1, [8, 8, 12])])
def test_contrib_attention_matches_onnxruntime(mask, past, unidirectional, sizes, backend):
    b, s, n, d_in = 2, 3, 2, 6
    sizes = sizes or [8, 8, 8]
    total = past + s
    feeds = dict(x=rand(b, s, d_in), w=rand(d_in, sum(sizes)), bias=rand(sum(sizes)),
                 mask=None if mask is None else key_mask(mask, b, s, total), past=rand(2, b, n, past, 4) if past else None,
                 attention_bias=None if past else rand(b, 1, s, total))
    attrs = dict(num_heads=n, unidirectional=unidirectional, **({"qkv_hidden_sizes": sizes} if sizes[2] != 8 else {}))
    m = contrib("Attention", feeds, ["y", "present"] if past else ["y"], **attrs)
    assert_matches_onnxruntime(backend, m, {k: v for k, v in feeds.items() if v is not None})


GQA_CASES = {  # name: (batch, new tokens, past cache, seqlens_k, total_sequence_length, attributes)
    "first prompt": (2, 4, None, [3, 3], 4, {}),
    "padded prompt": (2, 4, None, [3, 1], 4, {}),
    "decoding": (2, 1, 6, [4, 2], 5, {}),
    "next chunk": (1, 3, 4, [6], 7, {}),
    "packed, rotary": (2, 1, 5, [5, 3], 6, dict(do_rotary=1)),
    "prompt, rotary interleaved": (1, 4, None, [3], 4, dict(do_rotary=1, rotary_interleaved=1)),
    "window, softcap, scale": (1, 4, 3, [6], 7, dict(local_window_size=2, softcap=2.0, scale=0.2)),
}


@pytest.mark.parametrize("case", GQA_CASES)
def test_group_query_attention_matches_onnxruntime(case, backend):
    batch, seq, cache, seqlens, total, attrs = GQA_CASES[case]
    heads, kv_heads, size = 4, 2, 16
    query = rand(batch, seq, (heads + 2 * kv_heads) * size) if "packed" in case else rand(batch, seq, heads * size)
    feeds = dict(query=query, key=None if "packed" in case else rand(batch, seq, kv_heads * size),
                 value=None if "packed" in case else rand(batch, seq, kv_heads * size),
                 past_key=None if cache is None else rand(batch, kv_heads, cache, size),
                 past_value=None if cache is None else rand(batch, kv_heads, cache, size))
    angles = rand(16, 8)
    consts = dict(seqlens_k=np.array(seqlens, np.int32), total_sequence_length=np.array(total, np.int32),
                  **(dict(cos_cache=np.cos(angles), sin_cache=np.sin(angles)) if attrs.get("do_rotary") else {}))
    m = contrib("GroupQueryAttention", feeds, ["y", "present_key", "present_value"], consts, num_heads=heads,
                kv_num_heads=kv_heads, **attrs)
    got = {k: v for k, v in feeds.items() if v is not None}
    if case == "padded prompt":  # the padding's rows are unspecified
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        want = session.run(None, got)[0]
        y = Executor(planner.compile(m), backend="numpy", poison=True).run(got)["y"]
        np.testing.assert_allclose(y[1, :2], want[1, :2], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(y[0], want[0], rtol=1e-4, atol=1e-5)
    else:
        assert_matches_onnxruntime(backend, m, got)


def test_group_query_attention_needs_its_lengths_when_planning():
    feeds = dict(query=rand(1, 1, 64), key=rand(1, 1, 32), value=rand(1, 1, 32), past_key=rand(1, 2, 3, 16),
                 past_value=rand(1, 2, 3, 16), seqlens_k=np.array([3], np.int32),
                 total_sequence_length=np.array(4, np.int32))
    m = contrib("GroupQueryAttention", feeds, ["y"], num_heads=4, kv_num_heads=2)
    with pytest.raises(planner.ShapeError, match="'seqlens_k' .* must be computable from the model's constants"):
        planner.load(m)


@pytest.mark.parametrize("attrs, shapes", [
    ({}, dict(key=(2, 2, 4, 3), value=(2, 2, 4, 5))),
    (dict(is_causal=1, softcap=3.0, scale=0.4), dict(key=(2, 1, 4, 3), value=(2, 1, 4, 3))),  # grouped heads
    ({}, dict(key=(2, 2, 2, 3), value=(2, 2, 2, 5), mask=(3, 4), past_key=(2, 2, 2, 3), past_value=(2, 2, 2, 5))),
    (dict(q_num_heads=2, kv_num_heads=1, is_causal=1), dict(key=(2, 4, 3), value=(2, 4, 3))),
])
def test_attention_gradients_match_finite_differences(attrs, shapes, backend):
    x_shape = [2, 3, 6] if "q_num_heads" in attrs else [2, 2, 3, 3]
    params = {name: p(*shape) for name, shape in shapes.items()}
    names = ["x", "key", "value", "mask" if "mask" in params else "",
             *(n for n in ("past_key", "past_value") if n in params)]
    check(backend, weighted([("Attention", names, ["a"], attrs)], x_shape, params, opset=23), p(*x_shape))


def test_attention_gradient_through_a_fully_masked_row_is_finite(backend):
    mask = np.ones((3, 4), bool)
    mask[1] = False
    m = weighted([("Attention", ["x", "key", "value", "mask"], ["a"], {})], [1, 1, 3, 2],
                 dict(key=p(1, 1, 4, 2), value=p(1, 1, 4, 2), mask=mask), opset=23)
    check(backend, m, p(1, 1, 3, 2))


@pytest.mark.parametrize("attrs, x_shape", [({}, [2, 2, 3, 4]), (dict(interleaved=1, rotary_embedding_dim=2), [2, 2, 3, 4]),
                                            (dict(num_heads=2), [2, 3, 8])])
def test_rotary_embedding_gradient_is_the_inverse_rotation(attrs, x_shape):
    """RotaryEmbedding takes no doubles: its input gradient (the rotation is linear in x, an orthogonal
    map of the rotated pairs) is checked as the transposed rotation: <R x, g> = <x, R^T g>."""
    half = attrs.get("rotary_embedding_dim", 4) // 2
    angles = rand(5, half)
    consts = dict(cos=np.cos(angles), sin=np.sin(angles), ids=np.array([[0, 3, 1], [4, 2, 2]], np.int64))
    m = contrib("RotaryEmbedding", dict(x=rand(*x_shape)), ["y"], consts, opset=23, domain="", **attrs)
    graph = planner.load(m)
    m.graph.node.append(helper.make_node("Mul", ["y", "g"], ["z"]))
    g = rand(*x_shape)
    m.graph.initializer.append(numpy_helper.from_array(g, "g"))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    trained, grads = backward(planner.load(m), "z", wrt=["x"])
    x = rand(*x_shape)
    dx = Executor(planner.compile(trained), backend="numpy", poison=True).run({"x": x})[grads["x"]]
    y = Executor(planner.compile(graph), backend="numpy").run({"x": x})["y"]
    np.testing.assert_allclose(np.sum(y * g), np.sum(x * dx), rtol=1e-4)
    np.testing.assert_allclose(np.sum(dx * dx), np.sum(g * g), rtol=1e-4)  # orthogonal: norms kept


@pytest.mark.parametrize("op, params, attrs", [("Gelu", {}, {}), ("QuickGelu", {}, dict(alpha=1.3)),
                                               ("FastGelu", dict(bias=(4,)), {}), ("BiasGelu", dict(bias=(4,)), {}),
                                               ("SimplifiedLayerNormalization", dict(scale=(4,)), {})])
def test_contrib_gradients_match_finite_differences(op, params, attrs, backend):
    params = {name: p(*shape) for name, shape in params.items()}
    m = model([(op, ["x", *params], ["a"], attrs), ("Mul", ["a", "k"], ["y"], {})], [3, 4], {**params, "k": p(3, 4)})
    m.graph.node[0].domain = MS
    m.opset_import.append(helper.make_opsetid(MS, 1))
    check(backend, m, p(3, 4))


def test_multi_head_attention_trains():
    """A float32 training step through the contrib composites plans, runs and moves the weights."""
    feeds = dict(q=rand(2, 3, 8))
    m = contrib("MultiHeadAttention", feeds, ["y"], dict(k=rand(2, 5, 8), v=rand(2, 5, 8)), num_heads=2)
    plan = planner.compile(m, training=True, loss="mse", optimizer="sgd")
    assert {s.op for s in plan.steps} >= {"ScaledDotProductAttention", "ScaledDotProductAttentionGrad"}
    assert plan.stats["fused_attention"] == 1
    ex = Executor(plan, backend="numpy", poison=True)
    losses = [ex.train_step({"q": feeds["q"], "targets": np.zeros((2, 3, 8), np.float32)}) for _ in range(3)]
    assert losses[2] < losses[0]


@pytest.mark.parametrize("segments, positions, mask", [(True, False, True), (False, True, False), (True, True, True)])
def test_embed_layer_normalization_matches_onnxruntime(segments, positions, mask, backend):
    b, s, hidden = 2, 5, 8
    holes = np.ones((b, s), np.int32)
    holes[0, 1], holes[1, 3:] = 0, 0  # counted, not the first zero's place
    feeds = dict(ids=RNG.integers(0, 10, (b, s)).astype(np.int32),
                 segment_ids=RNG.integers(0, 2, (b, s)).astype(np.int32) if segments else None,
                 words=rand(10, hidden), places=rand(7, hidden), segment=rand(2, hidden) if segments else None,
                 gamma=rand(hidden), beta=rand(hidden), mask=holes if mask else None,
                 position_ids=RNG.integers(0, 7, (1, s)).astype(np.int32) if positions else None)
    for outputs in (["y", "mask_index", "sum"], ["y", "", "sum"], ["y", "mask_index"]):
        m = contrib("EmbedLayerNormalization", feeds, outputs, epsilon=1e-5)
        for o in m.graph.output:
            if o.name == "mask_index":
                o.type.tensor_type.elem_type = TensorProto.INT32
        assert_matches_onnxruntime(backend, m, {k: v for k, v in feeds.items() if v is not None})


def test_bert_fused_by_onnxruntimes_optimizer(tmp_path, backend):
    """A tiny BERT exported by torch.onnx and fused by onnxruntime's transformer optimizer
    (EmbedLayerNormalization, Attention with a mask index, SkipLayerNormalization, BiasGelu) plans and
    runs like onnxruntime."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers import optimizer
    import warnings
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
    torch.manual_seed(0)
    bert = transformers.BertModel(config).eval()
    ids, mask = torch.randint(0, 64, (2, 8)), torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Hidden(), (ids, mask), str(tmp_path / "bert.onnx"), input_names=["ids", "mask"],
                          output_names=["out"], dynamo=False, opset_version=17,
                          dynamic_axes={name: {0: "batch", 1: "sequence"} for name in ("ids", "mask")})
    fused = optimizer.optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", num_heads=4, hidden_size=32,
                                     opt_level=0)
    counts = fused.get_fused_operator_statistics()
    assert counts["EmbedLayerNormalization"] == 1 and counts["Attention"] == 2 and counts["SkipLayerNormalization"] == 4
    feeds = {"ids": ids.numpy(), "mask": mask.numpy()}
    assert_matches_onnxruntime(backend, fused.model, feeds)


@pytest.mark.parametrize("op, feeds, attrs, error", [
    ("MultiHeadAttention", dict(q=(2, 3, 8), k=(2, 5, 8), v=(2, 5, 8)), {}, "required attribute 'num_heads'"),
    ("MultiHeadAttention", dict(q=(2, 3, 8), k=(3, 5, 8), v=(3, 5, 8)), dict(num_heads=2), "one batch size"),
    ("MultiHeadAttention", dict(q=(2, 3, 8), k=(2, 5, 8), v=(2, 4, 8)), dict(num_heads=2), "do not fit"),
    ("Attention", dict(x=(2, 3, 6), w=(6, 24), bias=(24,), mask=None, past=(2, 2, 2, 1, 4), extra=(2, 2, 3, 4)),
     dict(num_heads=2), "past and attention_bias cannot be given together"),
    ("RotaryEmbedding", dict(x=(2, 3, 8), ids=(2, 3), cos=(5, 2), sin=(5, 2)), dict(num_heads=2, scale=2.0),
     r"scale=2.0 is not supported"),
])
def test_contrib_attention_refusals(op, feeds, attrs, error):
    arrays = {k: None if s is None else (RNG.integers(0, 5, s) if k == "ids" else rand(*s)) for k, s in feeds.items()}
    with pytest.raises(planner.ShapeError, match=error):
        planner.load(contrib(op, arrays, ["y"], **attrs))


def test_contrib_ops_in_float16_match_onnxruntime(backend):
    """Narrow floats are computed in float32 and rounded once, as onnxruntime's CPU kernels do."""
    h = np.float16
    rng = np.random.default_rng(16)  # its own data, whatever the tests before it drew

    def draw(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    cases = [("MultiHeadAttention", dict(q=draw(2, 3, 8), k=draw(2, 5, 8), v=draw(2, 5, 8)), ["y"], {}, dict(num_heads=2)),
             ("SkipLayerNormalization", dict(x=draw(2, 3, 8), skip=draw(2, 3, 8), gamma=draw(8), beta=draw(8)), ["y"], {},
              {}),
             ("GroupQueryAttention", dict(query=draw(1, 4, 64), key=draw(1, 4, 32), value=draw(1, 4, 32), past_key=None,
                                          past_value=None), ["y", "present_key", "present_value"],
              dict(seqlens_k=np.array([3], np.int32), total_sequence_length=np.array(4, np.int32)),
              dict(num_heads=4, kv_num_heads=2)),
             ("RotaryEmbedding", dict(x=draw(2, 3, 16), positions=np.array([1]), cos=draw(5, 4), sin=draw(5, 4)), ["y"],
              {}, dict(num_heads=2))]
    for op, feeds, outputs, consts, attrs in cases:
        feeds = {k: v if v is None or v.dtype.kind != "f" else v.astype(h) for k, v in feeds.items()}
        m = contrib(op, feeds, outputs, consts, out=TensorProto.FLOAT16, **attrs)
        assert_matches_onnxruntime(backend, m, {k: v for k, v in feeds.items() if v is not None}, rtol=1e-3, atol=1e-3)
