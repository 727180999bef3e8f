"""Property tests of the rewrite passes (attention's are in test_attention_properties.py): hypothesis draws the
graphs each pass rewrites and near misses of them (a constant a little off, erf for tanh, an axis, a tensor or
a consumer too many, statistics of epsilon 0 and variance 0, windows the pass does not take), feeds them NaN,
inf, huge and tiny values, and holds the plans with and without the pass to onnxruntime's outputs
(pass_properties.check). An exact form must be rewritten; a near miss left alone, or rewritten to the same
results."""
import math

import numpy as np
from hypothesis import given, settings, strategies as st
from onnx import helper

from pass_properties import SETTINGS, SPECIALS, Case, model, onnxruntime, seeds, values
from planner.config import Config
from test_inverted_residual import block_layers

N = helper.make_node
H = 16
SALT = st.sampled_from([0.0, 0.02, 0.1])
"""How much of a feed is NaN, inf, huge or tiny."""
GELU = {"three": 3.0, "k": 0.044715, "c": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5, "sqrt2": math.sqrt(2),
        "rsqrt2": 1 / math.sqrt(2)}


def _halves(x, t1, half):
    """x/2 times the bracket t1: the 0.5 on x first, on the product last, or on the bracket."""
    if half == "first":
        return [N("Mul", [x, "half"], ["hx"]), N("Mul", ["hx", t1], ["y"])]
    if half == "last":
        return [N("Mul", [x, t1], ["xt"]), N("Mul", ["xt", "half"], ["y"])]
    return [N("Mul", [t1, "half"], ["ht"]), N("Mul", [x, "ht"], ["y"])]


def _activation(form, x, variant, inner, multiplicand):
    """The nodes of `form` of x, writing y: `inner` the Gelu's Tanh or Erf, `variant` its exported shape (x^3 by
    Pow or Muls, x / sqrt 2 by Div or Mul; where the 0.5 is), `multiplicand` what SiLU and Swish multiply."""
    if form == "gelu_tanh":
        cube = [N("Pow", [x, "three"], ["cube"])] if variant[0] == "pow" else \
            [N("Mul", [x, x], ["sq"]), N("Mul", ["sq", x], ["cube"])]
        return [*cube, N("Mul", ["cube", "k"], ["kc"]), N("Add", [x, "kc"], ["in"]), N("Mul", ["in", "c"], ["arg"]),
                N(inner, ["arg"], ["t"]), N("Add", ["t", "one"], ["t1"]), *_halves(x, "t1", variant[1])]
    if form == "gelu_erf":
        scaled = N("Div", [x, "sqrt2"], ["s"]) if variant[0] == "div" else N("Mul", ["rsqrt2", x], ["s"])
        return [scaled, N(inner, ["s"], ["e"]), N("Add", ["one", "e"], ["t1"]), *_halves(x, "t1", variant[1])]
    if form == "silu":
        return [N("Sigmoid", [x], ["s"]), N("Mul", [multiplicand, "s"], ["y"])]
    if form == "swish":
        return [N("Mul", [x, "alpha"], ["ax"]), N("Sigmoid", ["ax"], ["s"]), N("Mul", ["s", multiplicand], ["y"])]
    return [N(form, [x], ["y"], **({"approximate": variant[1]} if form == "Gelu" else {}))]


@st.composite
def activations(draw):
    """An activation in pieces (or ONNX's, after a bias Add) of x (+ bias), exact or one near miss: a constant
    a little off (Swish's alpha is any), one of them a vector, Erf for Tanh, another multiplicand, an
    intermediate read elsewhere, a bias computed."""
    rng = draw(seeds())
    form = draw(st.sampled_from(["gelu_tanh", "gelu_erf", "silu", "swish", "Gelu", "Relu", "Sigmoid", "Tanh"]))
    pieces = form in ("gelu_tanh", "gelu_erf", "silu", "swish")
    bias = draw(st.booleans()) if pieces else True
    misses = [None, "consumer", "computed bias"] + (["mixup", "constant", "vector"] if form.startswith("gelu") else
                                                    ["multiplicand"] if form == "silu" else
                                                    ["multiplicand", "constant", "vector"] if pieces else [])
    miss = draw(st.sampled_from(misses))
    variant = (draw(st.sampled_from(["div", "mul"] if form == "gelu_erf" else ["pow", "mul"])),
               draw(st.sampled_from(["first", "last", "bracket"] if pieces else ["none", "tanh"])))
    inner = {"gelu_tanh": "Tanh", "gelu_erf": "Erf"}.get(form)
    inner = {"Tanh": "Erf", "Erf": "Tanh"}[inner] if miss == "mixup" else inner
    x = "hb" if bias else "x"
    nodes = ([N("Add", ["x", "bias"], ["hb"])] if bias else []) + \
        _activation(form, x, variant, inner, "other" if miss == "multiplicand" else x)
    inputs, outputs = {"x": (3, 5, H), **({"other": (3, 5, H)} if miss == "multiplicand" else {})}, ["y"]
    inits = {"bias": rng.standard_normal(H), "alpha": np.float32(draw(st.sampled_from([1.702, 1.0, -2.5, 1e30]))),
             **{k: np.float32(v) for k, v in GELU.items()}}
    if miss == "computed bias":
        inputs["bias"] = (H,)
    used = {i for n in nodes for i in n.input}
    if miss in ("constant", "vector"):
        key = draw(st.sampled_from(sorted(k for k in used if k in inits and k != "bias")))
        inits[key] = np.full(H, inits[key], np.float32) if miss == "vector" else \
            np.float32(inits[key] * draw(st.sampled_from([0.98, 1.01, 1.0001])))
    if miss == "consumer":
        outputs.append(draw(st.sampled_from(sorted(o for n in nodes[:-1] for o in n.output))))
    feeds = {k: values(rng, shape, draw(SALT)) for k, shape in inputs.items()}
    fires = None if miss in ("consumer", "computed bias") or (form, miss) == ("swish", "constant") or \
        bias and miss == "multiplicand" else miss is None  # a Sigmoid after a bias Add fuses alone
    return Case(model(nodes, inputs, outputs, inits, opset=20), feeds, fires,
                f"{form} {variant}, bias {bias}, miss {miss}")


@settings(SETTINGS, max_examples=100)
@given(case=activations())
def test_activation_fusion_keeps_ieee_results(case):
    case.check("fuse_activation")


@st.composite
def norms(draw):
    """A layer or RMS norm in pieces (or an Add before ONNX's LayerNormalization), exact or one near miss;
    some rows constant, whose variance is 0."""
    rng = draw(seeds())
    form = draw(st.sampled_from(["layer", "rms", "residual"]))
    eps = draw(st.sampled_from([1e-5, 1e-6, 0.0]))
    shape, inputs, outputs = (2, 4, H), {"x": (2, 4, H)}, ["y"]
    inits = {"w": rng.standard_normal(H), "b": rng.standard_normal(H), "two": np.float32(2), "one": np.float32(1),
             "eps": np.float32(eps)}
    if form == "residual":
        miss = draw(st.sampled_from([None, "broadcast", "negative epsilon", "consumer"]))
        inputs["s"] = (1, 1, H) if miss == "broadcast" else shape
        eps = -1e-5 if miss == "negative epsilon" else eps
        nodes = [N("Add", ["x", "s"], ["sum"]),
                 N("LayerNormalization", ["sum", "w", "b"], ["y", *(["mean"] if miss == "consumer" else [])],
                   epsilon=eps)]
        outputs += ["mean"] if miss == "consumer" else []
    else:
        miss = draw(st.sampled_from([None, "epsilon placement", "axis", "consumer", "constant", "weight"] +
                                    (["sub other", "second centring"] if form == "layer" else [])))
        square, scale = draw(st.sampled_from(["pow", "mul"])), draw(st.sampled_from(["div", "reciprocal", "one"]))
        wide = draw(st.sampled_from(["mean", "var"] if form == "layer" else ["var"])) if miss == "axis" else None
        nodes = []
        if form == "layer":
            nodes += [N("ReduceMean", ["x"], ["mean"], axes=[-2, -1] if wide == "mean" else [-1]),
                      N("Sub", ["x2" if miss == "sub other" else "x", "mean"], ["d"])]
            inputs.update({"x2": shape} if miss == "sub other" else {})
        d = "d" if form == "layer" else "x"
        nodes.append(N("Pow", [d, "two"], ["sq"]) if square == "pow" else N("Mul", [d, d], ["sq"]))
        nodes.append(N("ReduceMean", ["sq"], ["var"], axes=[-2, -1] if wide == "var" else [-1]))
        nodes += [N("Sqrt", ["var"], ["sd0"]), N("Add", ["sd0", "eps"], ["sd"])] if miss == "epsilon placement" else \
            [N("Add", ["var", "eps"], ["ve"]), N("Sqrt", ["ve"], ["sd"])]
        if miss == "second centring":  # the numerator centred by a mean over other axes
            nodes += [N("ReduceMean", ["x"], ["mean2"], axes=[-2, -1]), N("Sub", ["x", "mean2"], ["d2"])]
        top = "d2" if miss == "second centring" else d
        nodes += [N("Div", [top, "sd"], ["xh"])] if scale == "div" else [
            N("Reciprocal", ["sd"], ["r"]) if scale == "reciprocal" else N("Div", ["one", "sd"], ["r"]),
            N("Mul", [top, "r"], ["xh"])]
        bias = form == "layer" and draw(st.booleans())
        nodes += [N("Mul", ["xh", "w"], ["wx" if bias else "y"])] + ([N("Add", ["wx", "b"], ["y"])] if bias else [])
        if miss == "consumer":
            outputs.append(draw(st.sampled_from(sorted({"var", "sd", "xh", *(["mean"] if form == "layer" else [])}))))
            miss += f" {outputs[-1]}"
        if miss == "constant":
            key = "two" if square == "pow" else "one" if scale == "one" else "eps"
            inits[key] = np.float32({"two": 2.01, "one": 1.01, "eps": -1e-5}[key])
        if miss == "weight":
            inits["w"] = rng.standard_normal((4, 1))
    feeds = {k: values(rng, s, draw(SALT)) for k, s in inputs.items()}
    feeds["x"][0, draw(st.integers(0, 3))] = draw(st.integers(-3, 3))  # a constant row: variance 0
    fires = None if miss in ("axis", "sub other", "consumer mean") else miss is None  # RMS norms of d = x - mean
    return Case(model(nodes, inputs, outputs, inits), feeds, fires,
                f"{form} norm, epsilon {eps}, miss {miss}: {[n.op_type for n in nodes]}")


@settings(SETTINGS, max_examples=120)
@given(case=norms())
def test_norm_fusion_keeps_ieee_results(case):
    case.check("fuse_norm")


@st.composite
def conv_epilogues(draw):
    """Conv, then an Add of Z and an activation (either or both), as fuse_conv takes them, or a near miss."""
    rng = draw(seeds())
    k, group, bias = draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([1, 2, 4])), draw(st.booleans())
    adds = draw(st.booleans())
    act = draw(st.sampled_from(["Relu", "Sigmoid", "Tanh", "HardSigmoid", "Clip"] + ([None] if adds else [])))
    miss = draw(st.sampled_from([None, "consumer", "broadcast", "self", "other input"]))
    inits = {"w": rng.standard_normal((8, 4 // group, k, k)), "b": rng.standard_normal(8),
             "lo": np.float32(draw(st.sampled_from([0.0, -1.0, 6.0]))),
             "hi": np.float32(draw(st.sampled_from([6.0, 0.5])))}
    inputs = {"x": (2, 4, 6, 6), "z": (1, 8, 1, 1) if miss == "broadcast" else (2, 8, 6, 6)}
    nodes = [N("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], pads=[k // 2] * 4, group=group)]
    last = "c"
    if adds or miss in ("broadcast", "self"):
        nodes.append(N("Add", ["c", "c" if miss == "self" else "z"], ["s"]))
        last = "s"
    if act:
        source = "z" if miss == "other input" else last
        extra = {"alpha": 0.3, "beta": 0.4} if act == "HardSigmoid" else {}
        nodes.append(N(act, [source, *(["lo", "hi"] if act == "Clip" else [])], ["a"], **extra))
        if miss == "other input":
            nodes.append(N("Add", [last, "a"], ["a2"]))
    outputs = [nodes[-1].output[0]] + (["c"] if miss == "consumer" else [])
    used = {i for n in nodes for i in n.input}
    inputs = {k: v for k, v in inputs.items() if k in used}
    feeds = {k: values(rng, s, draw(SALT)) for k, s in inputs.items()}
    fires = True if miss is None else None if miss == "other input" else False
    return Case(model(nodes, inputs, outputs, inits), feeds, fires,
                f"conv {k}x{k}, group {group}, bias {bias}, add {adds}, {act}, miss {miss}")


@settings(SETTINGS, max_examples=80)
@given(case=conv_epilogues())
def test_conv_fusion_keeps_ieee_results(case):
    case.check("fuse_conv", scaled=True)


ODD_STATISTICS = {  # (statistic, value) of one channel: the unfolded op's infinities and NaNs, or none
    "variance 0": ("var", 0.0), "negative variance": ("var", -0.5), "tiny variance": ("var", 1e-12),
    "negative scale": ("scale", -1.5), "scale 0": ("scale", 0.0), "infinite mean": ("mean", np.inf),
    "NaN shift": ("beta", np.nan), "infinite variance": ("var", np.inf)}


@st.composite
def batch_norms(draw):
    """Conv, then BatchNormalization of epsilon 0 or not, its statistics odd in some channels, or a near miss."""
    rng = draw(seeds())
    eps, bias = draw(st.sampled_from([0.0, 1e-5])), draw(st.booleans())
    stats = {"scale": rng.uniform(0.5, 2, 6), "beta": rng.standard_normal(6), "mean": rng.standard_normal(6),
             "var": rng.uniform(0.1, 2, 6)}
    odd = draw(st.lists(st.sampled_from(sorted(ODD_STATISTICS)), max_size=2))
    for kind in odd:
        name, value = ODD_STATISTICS[kind]
        stats[name][draw(st.integers(0, 5))] = value
    miss = draw(st.sampled_from([None, None, "consumer", "after relu"]))
    nodes = [N("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], pads=[1, 1, 1, 1])]
    if miss == "after relu":
        nodes.append(N("Relu", ["c"], ["r"]))
    nodes.append(N("BatchNormalization", [nodes[-1].output[0], "scale", "beta", "mean", "var"], ["y"], epsilon=eps))
    inits = {"w": rng.standard_normal((6, 4, 3, 3)), **({"b": rng.standard_normal(6)} if bias else {}), **stats}
    s32 = {k: np.float32(v) for k, v in stats.items()}
    with np.errstate(all="ignore"):
        factor = s32["scale"] / np.sqrt(s32["var"] + np.float32(eps))
    foldable = all(np.isfinite(v).all() for v in (*s32.values(), factor))
    feeds = {"x": values(rng, (2, 4, 5, 5), draw(SALT))}
    m = model(nodes, {"x": (2, 4, 5, 5)}, ["y", *(["c"] if miss == "consumer" else [])], inits)
    return Case(m, feeds, foldable and miss is None, f"epsilon {eps}, bias {bias}, {odd or 'plain statistics'}, "
                                                     f"miss {miss}")


@settings(SETTINGS, max_examples=80)
@given(case=batch_norms())
def test_batchnorm_folding_keeps_ieee_results_or_declines(case):
    case.check("fold_batchnorm", scaled=True)


@st.composite
def transposed_matmuls(draw):
    """MatMul(A, Transpose(W)), W a matrix (a weight or an input), or a transpose the fold does not take."""
    rng = draw(seeds())
    miss = draw(st.sampled_from([None, None, "batched", "identity perm", "consumer", "vector", "twice"]))
    a_shape = (8,) if miss == "vector" else draw(st.sampled_from([(4, 8), (2, 3, 8)]))
    w_shape, perm = {"batched": ((a_shape[0], 5, 8), [0, 2, 1]), "identity perm": ((8, 5), [0, 1]),
                     "twice": ((8, 5), [1, 0])}.get(miss, ((5, 8), [1, 0]))
    nodes = [N("Transpose", ["w"], ["wt"], perm=perm)]
    if miss == "twice":
        nodes.append(N("Transpose", ["wt"], ["wt2"], perm=[1, 0]))
    nodes.append(N("MatMul", ["a", nodes[-1].output[0]], ["y"]))
    weight = draw(st.booleans())
    inputs = {"a": a_shape, **({} if weight else {"w": w_shape})}
    feeds = {k: values(rng, s, draw(SALT)) for k, s in inputs.items()}
    m = model(nodes, inputs, ["y", *(["wt"] if miss == "consumer" else [])],
              {"w": rng.standard_normal(w_shape)} if weight else {})
    return Case(m, feeds, miss in (None, "twice"), f"A {a_shape}, W {w_shape} ({'weight' if weight else 'fed'}), "
                                                   f"perm {perm}, miss {miss}")


@settings(SETTINGS, max_examples=40)
@given(case=transposed_matmuls())
def test_transpose_folding_keeps_ieee_results(case):
    case.check("fold_transpose")


@st.composite
def linear_layers(draw):
    """Gemm(A, B, C, transB=1) of a constant B read once, or a B read elsewhere or fed."""
    rng = draw(seeds())
    miss = draw(st.sampled_from([None, "read elsewhere", "fed"]))
    nodes = [N("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=draw(st.sampled_from([1.0, -0.5])), beta=0.75)]
    if miss == "read elsewhere":
        nodes.append(N("Gemm", ["a", "w"], ["y2"], transB=1))
    inputs = {"a": (4, 8), **({"w": (5, 8)} if miss == "fed" else {})}
    feeds = {k: values(rng, s, draw(SALT)) for k, s in inputs.items()}
    inits = {"c": rng.standard_normal(5), **({} if miss == "fed" else {"w": rng.standard_normal((5, 8))})}
    return Case(model(nodes, inputs, [n.output[0] for n in nodes], inits), feeds, miss is None, f"miss {miss}")


@settings(SETTINGS, max_examples=30)
@given(case=linear_layers())
def test_pretransposed_weights_keep_ieee_results(case):
    case.check("pretranspose")


@st.composite
def convolutions_3x3(draw):
    """A 3x3 convolution Winograd takes (any padding, a fused Z and Relu or not), or one of a stride, dilation,
    groups or few channels it does not; then a 7x7 conv, whose columns are the scratch Winograd's needs.
    Images salted with NaN, inf and huge values (some images only), or a weight that is not finite."""
    rng = draw(seeds())
    n, c, m = draw(st.sampled_from([1, 3])), draw(st.sampled_from([16, 24])), draw(st.sampled_from([16, 20]))
    size = (draw(st.integers(6, 11)), draw(st.integers(6, 11)))
    miss = draw(st.sampled_from([None] * 4 + ["stride", "dilation", "groups", "few channels"]))
    c = 8 if miss == "few channels" else c
    attrs = draw(st.sampled_from([{"pads": [draw(st.integers(0, 2)) for _ in range(4)]}, {"auto_pad": "SAME_UPPER"},
                                  {"auto_pad": "SAME_LOWER"}, {"auto_pad": "VALID"}]))
    attrs = {"stride": {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "groups": {"group": 2, "pads": [1, 1, 1, 1]},
             "dilation": {"dilations": [2, 2], "pads": [2, 2, 2, 2]}}.get(miss, attrs)
    w = rng.standard_normal((m, c // attrs.get("group", 1), 3, 3)) / np.sqrt(9 * c)
    if draw(st.booleans()) and draw(st.booleans()):
        w.flat[draw(st.integers(0, w.size - 1))] = draw(st.sampled_from([np.inf, np.nan, 1e30]))
    nodes = [N("Conv", ["x", "w", "b"], ["c"], **attrs)]
    epilogue = draw(st.booleans())
    if epilogue:
        nodes += [N("Add", ["c", "c0"], ["s"]), N("Relu", ["s"], ["a"])]
    nodes.append(N("Conv", [nodes[-1].output[0], "w7"], ["y"], pads=[3, 3, 3, 3]))
    x = values(rng, (n, c, *size), draw(SALT), specials=SPECIALS[:5])
    plain = draw(st.integers(0, n))
    x[:plain] = rng.standard_normal((plain, c, *size))  # the images before these take the transforms
    inits = {"w": w, "b": rng.standard_normal(m), "w7": rng.standard_normal((16, m, 7, 7)) / np.sqrt(49 * m)}
    m0 = model(nodes[:1], {"x": x.shape}, ["c"], inits)
    feeds = {"x": x}
    if epilogue:
        feeds["c0"] = values(rng, onnxruntime(m0, {"x": x})["c"].shape, draw(SALT), specials=SPECIALS[:5])
    small = draw(st.sampled_from([False, False, True]))  # a scratch of one image or two
    m = model(nodes, {k: v.shape for k, v in feeds.items()}, ["y", nodes[-2].output[0]], inits)
    return Case(m, feeds, None if small else miss is None, f"x {x.shape}, W {w.shape}, {attrs}, epilogue {epilogue}, "
                f"small scratch {small}, miss {miss}", {"config": Config(workspace_limit=60_000)} if small else {})


@settings(SETTINGS, max_examples=80)
@given(case=convolutions_3x3())
def test_winograd_keeps_ieee_results(case):
    case.check("winograd", atol=1e-5, scaled=True, batch_conv=False)


def chain(rng, shape, layers, residual):
    """x -> each layer (a Conv of (weight shape, attributes) with a bias, or an activation by name: Clip(0, 6)
    or another) -> [+ residual: "x" or another input "z"] -> y: its nodes and initializers."""
    inits, nodes, last = {"lo": np.float32(0), "hi": np.float32(6)}, [], "x"
    for k, layer in enumerate(layers):
        if isinstance(layer, str):
            if layer:
                nodes.append(N(layer, [last, "lo", "hi"] if layer == "Clip" else [last], [f"t{k}"]))
                last = f"t{k}"
            continue
        w_shape, attrs = layer
        inits[f"w{k}"], inits[f"b{k}"] = rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:])), \
            rng.standard_normal(w_shape[0]) * 0.1
        nodes.append(N("Conv", [last, f"w{k}", f"b{k}"], [f"t{k}"], **attrs))
        last = f"t{k}"
    if residual:
        nodes.append(N("Add", [last, residual], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    return nodes, inits


@st.composite
def inverted_residuals(draw):
    """MobileNetV2's blocks (widening or not, stride 1 or 2, a residual), or a near miss: a depthwise stride of
    3, no padding, a widened tensor read elsewhere, a residual that is not the block's input."""
    rng = draw(seeds())
    shape = draw(st.sampled_from([(4, 8, 9, 3), (4, 8, 9, 4), (2, 8, 10, 6)]))
    widen, act = draw(st.booleans()), draw(st.sampled_from(["Clip", "Relu", ""]))
    miss = draw(st.sampled_from([None, None, "stride 3", "no padding", "consumer", "other residual"]))
    stride = 3 if miss == "stride 3" else draw(st.sampled_from([1, 2]))
    layers = block_layers(8, 48 if widen else 8, 8, stride, widen, act)
    if miss == "no padding":
        layers[-3][1]["pads"] = [0, 0, 0, 0]
    residual = "" if stride != 1 or miss == "no padding" else "z" if miss == "other residual" else \
        draw(st.sampled_from(["x", ""]))
    nodes, inits = chain(rng, shape, layers, residual)
    inputs = {"x": shape, **({"z": shape} if residual == "z" else {})}
    outputs = ["y", *([nodes[0].output[0]] if miss == "consumer" else [])]
    feeds = {k: values(rng, s, draw(SALT) / 5, specials=SPECIALS[:6]) for k, s in inputs.items()}
    return Case(model(nodes, inputs, outputs, inits), feeds, False if miss in ("stride 3", "no padding") else None,
                f"x {shape}, widen {widen}, stride {stride}, {act or 'no activation'}, residual {residual!r}, "
                f"miss {miss}")


@settings(SETTINGS, max_examples=80)
@given(case=inverted_residuals())
def test_inverted_residual_keeps_ieee_results(case):
    case.check("inverted_residual", atol=1e-5, scaled=True)


@st.composite
def batched_convolutions(draw):
    """A conv of small images and large weights over a batch (one GEMM for the batch), or one of groups or of
    one image, which stays; then a 5x5 conv, whose columns are the scratch the batched one needs."""
    rng = draw(seeds())
    miss = draw(st.sampled_from([None, None, "groups", "one image"]))
    pointwise, group = draw(st.booleans()), 2 if miss == "groups" else 1
    channels, filters, k = (1024, 512, 1) if pointwise else (256, 256, 3)
    shape = (1 if miss == "one image" else draw(st.sampled_from([2, 3])), channels, 8, 8)
    w = rng.standard_normal((filters, channels // group, k, k)) / np.sqrt(channels * k * k)
    nodes = [N("Conv", ["x", "w"], ["c"], group=group, strides=[2, 2], pads=[k // 2] * 4),
             N("Conv", ["c", "w5"], ["y"], pads=[2, 2, 2, 2])]
    feeds = {"x": values(rng, shape, draw(SALT) / 10, specials=SPECIALS[:6])}
    inits = {"w": w, "w5": rng.standard_normal((8, filters, 5, 5)) / np.sqrt(25 * filters)}
    return Case(model(nodes, {"x": shape}, ["y", "c"], inits), feeds, None if miss == "one image" else miss is None,
                f"x {shape}, W {w.shape}, miss {miss}")


@settings(SETTINGS, max_examples=12)
@given(case=batched_convolutions())
def test_batched_convolutions_keep_ieee_results(case):
    case.check("batch_conv", scaled=True, winograd=False)
