"""The activation fusion pass and memplan.BiasActivation: each exported form of an activation (and the bias
Add before it) becomes one op, results do not change (with and without the pass, and against
onnxruntime), training steps and gradients agree, and the kernels allocate nothing the plan cannot see."""
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from frontends import read
from planner import ops, passes
from planner.autodiff import backward
from planner.errors import ShapeError
from planner.ops import Info
from pass_properties import JITS, assert_same, onnxruntime
from test_autodiff import numeric_gradient
from test_fused_attention import cut
from test_no_hidden_allocations import BOUND, allocations
from zoo_cases import run_on

RNG = np.random.default_rng(0)
H = 8
SQRT2, C, K = math.sqrt(2), math.sqrt(2 / math.pi), 0.044715


def _gelu_tanh(cube="pow", half="first", swap=False):
    """GPT-2's gelu_new: 0.5 x (1 + tanh(C (x + K x^3))), the 0.5 on x first, on the product last or on
    the bracket; `swap` puts each constant on the left."""
    def mul(a, b):
        return ("Mul", [b, a] if swap else [a, b])
    nodes = [("Pow", ["x", "three"], ["cube"]) if cube == "pow" else ("Mul", ["x", "x"], ["sq"]),
             *([] if cube == "pow" else [("Mul", ["sq", "x"], ["cube"])]),
             (*mul("cube", "k"), ["kc"]), ("Add", ["x", "kc"], ["in"]), (*mul("in", "c"), ["arg"]),
             ("Tanh", ["arg"], ["t"]), ("Add", ["one", "t"] if swap else ["t", "one"], ["t1"])]
    return nodes + _halves(half, mul)


def _halves(half, mul):
    if half == "first":
        return [(*mul("x", "half"), ["hx"]), ("Mul", ["hx", "t1"], ["y"])]
    if half == "last":
        return [("Mul", ["x", "t1"], ["xt"]), (*mul("xt", "half"), ["y"])]
    return [(*mul("t1", "half"), ["ht"]), ("Mul", ["x", "ht"], ["y"])]


def _gelu_erf(scale="div", half="last"):
    """BERT's x * 0.5 * (1 + erf(x / sqrt 2)), x / sqrt 2 as a Div or a Mul."""
    first = ("Div", ["x", "sqrt2"], ["s"]) if scale == "div" else ("Mul", ["rsqrt2", "x"], ["s"])
    return [first, ("Erf", ["s"], ["e"]), ("Add", ["one", "e"], ["t1"]), *_halves(half, lambda a, b: ("Mul", [a, b]))]


FORMS = {
    "gelu_new": (_gelu_tanh(), {"activation": "Gelu", "approximate": "tanh"}),
    "gelu_new x*x*x, 0.5 last": (_gelu_tanh("mul", "last"), {"activation": "Gelu", "approximate": "tanh"}),
    "gelu_new constants left, 0.5 on bracket": (_gelu_tanh("pow", "bracket", swap=True),
                                                {"activation": "Gelu", "approximate": "tanh"}),
    "erf gelu": (_gelu_erf(), {"activation": "Gelu", "approximate": "none"}),
    "erf gelu by Mul, 0.5 first": (_gelu_erf("mul", "first"), {"activation": "Gelu", "approximate": "none"}),
    "silu": ([("Sigmoid", ["x"], ["s"]), ("Mul", ["s", "x"], ["y"])], {"activation": "Swish", "alpha": 1.0}),
    "quick gelu": ([("Mul", ["x", "alpha"], ["ax"]), ("Sigmoid", ["ax"], ["s"]), ("Mul", ["x", "s"], ["y"])],
                   {"activation": "Swish", "alpha": 1.702}),
    "onnx gelu": ([("Gelu", ["x"], ["y"], {"approximate": "tanh"})], {"activation": "Gelu", "approximate": "tanh"}),
    "relu": ([("Relu", ["x"], ["y"])], {"activation": "Relu"}),
    "sigmoid": ([("Sigmoid", ["x"], ["y"])], {"activation": "Sigmoid"}),
    "tanh": ([("Tanh", ["x"], ["y"])], {"activation": "Tanh"}),
}
PIECES = [name for name in FORMS if len(FORMS[name][0]) > 1]
"""The forms that fuse without a bias; ONNX's one-node activations fuse only with one."""
SCALARS = {"three": 3.0, "k": K, "c": C, "one": 1.0, "half": 0.5, "sqrt2": SQRT2, "rsqrt2": 1 / SQRT2,
           "alpha": 1.702}


def form_model(name, bias=True, values=None):
    """y = form(x W + b) (or of x W), float32, ONNX opset 20; the form's constants are initializers
    (`values` overrides some)."""
    nodes, _ = FORMS[name]
    front = [("MatMul", ["input", "w"], ["h"])] + ([("Add", ["h", "bias"], ["hb"])] if bias else [])
    rename = {"x": "hb" if bias else "h"}
    body = [(op, [rename.get(i, i) for i in ins], outs, *rest) for op, ins, outs, *rest in nodes]
    used = {i for _, ins, *_ in body for i in ins}
    scalars = {k: np.float32((values or {}).get(k, v)) for k, v in SCALARS.items() if k in used}
    params = {"w": RNG.standard_normal((H, H)).astype(np.float32) / 2, "bias": RNG.standard_normal(H).astype(np.float32),
              **{k: np.array(v, np.float32) for k, v in scalars.items()}}
    params = {k: v for k, v in params.items() if k in used | {i for _, ins, *_ in front for i in ins}}
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, name=outs[0], **(rest[0] if rest else {})) for op, ins, outs, *rest in front + body],
        "form", [helper.make_tensor_value_info("input", TensorProto.FLOAT, (2, 5, H))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def outputs(m, backend="numpy", **options):
    x = RNG.standard_normal((2, 5, H)).astype(np.float32)
    plans = [planner.compile(m, {"input": x.shape}, fuse_activation=f, **options) for f in (True, False)]
    return x, plans, [run_on(backend, p, {"input": x})["y"] for p in plans]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("name", FORMS)
def test_each_form_fuses_and_changes_no_result(name, bias, backend):
    import onnxruntime as ort
    m = form_model(name, bias)
    x, plans, (fused, plain) = outputs(m, backend)
    fuses = bias or name in PIECES
    assert plans[0].stats["fused_activation"] == fuses and plans[1].stats["fused_activation"] == 0
    if fuses:
        step = next(s for s in plans[0].steps if s.op == "BiasActivation")
        assert {k: step.attrs[k] for k in FORMS[name][1]} == pytest.approx(FORMS[name][1])
        assert len(step.inputs) == 1 + bias
        assert [s.op for s in plans[0].steps] == ["MatMul", "BiasActivation"]
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-6)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fused, session.run(None, {"input": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, values", [("gelu_new", {"k": 0.045}), ("erf gelu", {"sqrt2": 1.4}),
                                          ("gelu_new", {"half": 0.49}), ("gelu_new x*x*x, 0.5 last", {"c": 0.8})])
def test_a_wrong_constant_keeps_the_pieces(name, values):
    _, plans, (fused, plain) = outputs(form_model(name, values=values))
    assert plans[0].stats["fused_activation"] == 0
    np.testing.assert_array_equal(fused, plain)


def test_a_bias_add_read_elsewhere_stays_and_a_computed_addend_is_no_bias():
    """The Add's output is read by a second output: the activation fuses on it, the Add stays; an Add of
    two computed tensors is the activation's input, not a bias."""
    m = form_model("gelu_new")
    m.graph.output.append(helper.make_tensor_value_info("hb", TensorProto.FLOAT, None))
    plan = planner.compile(m, {"input": (2, 5, H)})
    assert plan.stats["fused_activation"] == 1
    assert [s.op for s in plan.steps] == ["MatMul", "Add", "BiasActivation"]
    m = form_model("relu")
    m.graph.node[1].input[1] = "h"  # h + h
    assert planner.compile(m, {"input": (2, 5, H)}).stats["fused_activation"] == 0
    m = form_model("silu")
    m.graph.node[1].input[1] = "h"
    plan = planner.compile(m, {"input": (2, 5, H)})
    assert [s.op for s in plan.steps] == ["MatMul", "Add", "BiasActivation"]


@pytest.mark.parametrize("precision", ["fp16", "amp-fp16", "amp-bf16"])
def test_16_bit_plans_fuse_and_keep_16_bit_tensors(precision):
    """fp16 plans and autocast's (where the op is in LOWER, as a Linear's bias and the activation after it
    are) fuse, X and Y stay 16-bit, and the outputs stay the unfused plan's within 16-bit rounding."""
    x, plans, (fused, plain) = outputs(form_model("gelu_new"), precision=precision)
    assert plans[0].stats["fused_activation"] == 1
    step = next(s for s in plans[0].steps if s.op == "BiasActivation")
    assert {np.dtype(plans[0].tensors[t].dtype).itemsize for t in (*step.inputs, *step.outputs)} == {2}
    tol = 2e-2 if precision.endswith("bf16") else 4e-3
    np.testing.assert_allclose(fused.astype(np.float32), plain.astype(np.float32), rtol=tol, atol=tol)


def test_16_bit_exports_keep_their_pieces():
    """A float16 export rounds each piece; the fused op would not, so it is left as it is."""
    m = form_model("silu", bias=False)
    for init in m.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for value in (m.graph.input[0], m.graph.output[0]):
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    assert planner.compile(m, {"input": (2, 5, H)}).stats["fused_activation"] == 0


@pytest.mark.parametrize("name", ["gelu_new", "erf gelu", "quick gelu", "silu", "relu"])
def test_training_steps_match_the_exported_form(name):
    m = form_model(name)
    x = RNG.standard_normal((2, 5, H)).astype(np.float32)
    losses = []
    for fuse in (True, False):
        plan = planner.compile(m, {"input": x.shape}, training=True, loss="mse", fuse_activation=fuse)
        assert plan.stats["fused_activation"] == fuse
        targets = plan.tensors[plan.training["labels"]]
        ex = Executor(plan, backend="numpy", poison=True)
        losses.append([ex.train_step({"input": x, targets.name: np.full(targets.shape, 0.1, np.float32)})
                       for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert len(set(np.round(losses[0], 6))) == 3  # the params did train


@pytest.mark.parametrize("name", ["gelu_new", "erf gelu by Mul, 0.5 first", "quick gelu", "sigmoid"])
def test_gradients_match_the_exported_form(name):
    """d sum(y) / d (input, W, bias) through the fused op and through the pieces as read."""
    m = form_model(name)
    x = RNG.standard_normal((2, 5, H)).astype(np.float32)
    got = []
    for graph, fuse in ((passes.run(passes.pipeline(planner.CompileOptions()), read(m))[0], True), (planner.load(m), False)):
        assert any(n.op == "BiasActivation" for n in graph.nodes) == fuse
        trained, grads = backward(graph, "y", wrt=["input", "w", "bias"])
        out = Executor(planner.compile(trained, fuse_activation=fuse), backend="numpy", poison=True).run({"input": x})
        got.append([out[grads[name]] for name in ("input", "w", "bias")])
    for fused, plain in zip(*got):
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-6)


def op_model(activation, bias, shape=(3, 4), **attrs):
    """y = k * BiasActivation(x, bias), float64, for finite differences."""
    params = {"k": RNG.standard_normal(shape)}
    if bias:
        params["bias"] = RNG.standard_normal(shape[-1:])
    node = helper.make_node("BiasActivation", ["x", *(["bias"] if bias else [])], ["a"], domain="memplan",
                            activation=activation, **attrs)
    graph = helper.make_graph([node, helper.make_node("Mul", ["a", "k"], ["y"])], "act",
                              [helper.make_tensor_value_info("x", TensorProto.DOUBLE, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])


ACTIVATIONS = [("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
               ("Swish", {}), ("Swish", {"alpha": 1.702})]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("activation, attrs", ACTIVATIONS, ids=[f"{a}{attrs}" for a, attrs in ACTIVATIONS])
def test_gradients_match_finite_differences(activation, attrs, bias, backend):
    m = op_model(activation, bias, **attrs)
    x = RNG.standard_normal((3, 4))
    x[np.abs(x) < 0.05] = 0.5  # away from Relu's kink
    graph = planner.load(m)
    wrt = ["x", "bias"] if bias else ["x"]
    trained, grads = backward(graph, "y", wrt=wrt)
    assert [n.op for n in trained.nodes].count("BiasActivationGrad") == 1
    got = run_on(backend, planner.compile(trained, schedule="file"), {"x": x})
    params = {i.name: numpy_helper.to_array(i).copy() for i in m.graph.initializer}
    for name in wrt:
        np.testing.assert_allclose(got[grads[name]], numeric_gradient(m, x, params, name, 1e-6), rtol=1e-5,
                                   atol=1e-7, err_msg=name)


@pytest.mark.parametrize("activation, attrs", ACTIVATIONS, ids=[f"{a}{attrs}" for a, attrs in ACTIVATIONS])
def test_kernels_match_pytorch_over_many_tiles(activation, attrs):
    """Rows longer than a tile, rows shorter, a bias of two trailing dims and a leading 1, float16 in
    float32 tiles."""
    torch = pytest.importorskip("torch")
    forward, grad = ops.get("BiasActivation", "memplan"), ops.get("BiasActivationGrad", "memplan")
    node = type("Node", (), {"attrs": {"activation": activation, **attrs}})()
    step = type("Step", (), {"attrs": forward.normalize(node)})()
    for shape, bias_shape, dtype in [((3, 9000), (9000,), np.float64), ((70, 33, 5), (1, 33, 5), np.float64),
                                     ((20000,), None, np.float64), ((4, 3000), (3000,), np.float16)]:
        x = RNG.standard_normal(shape).astype(dtype)
        b = None if bias_shape is None else RNG.standard_normal(bias_shape).astype(dtype)
        dy = RNG.standard_normal(shape).astype(dtype)
        infos = [Info(x.shape, x.dtype), None if b is None else Info(b.shape, b.dtype)]
        y, dx = np.empty_like(x), np.empty_like(x)
        forward.kernel(np, step, [x, b], [y], cut(forward.workspace(node, infos, None, 0)))
        grad.kernel(np, step, [dy, x, b], [dx], cut(grad.workspace(node, [infos[0], *infos], None, 0)))
        t = [None if a is None else torch.tensor(a.astype(np.float64)) for a in (x, b, dy)]
        tol = 2e-3 if dtype == np.float16 else 1e-12
        np.testing.assert_allclose(y, forward.torch(torch, t[0], t[1], **step.attrs).numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(dx, grad.torch(torch, t[2], t[0], t[1], **step.attrs).numpy(), rtol=tol, atol=tol)


def test_no_hidden_allocations_forward_and_backward():
    shape = (64, 1024)
    m = op_model("Gelu", True, shape, approximate="tanh")
    graph = planner.load(m)
    for g in (graph, backward(graph, "y", wrt=["x", "bias"])[0]):
        ex = Executor(planner.compile(g), backend="numpy")
        assert any(s.op.startswith("BiasActivation") for s in ex.plan.steps)
        seen, _ = allocations(ex, lambda: ex.run({"x": RNG.standard_normal(shape)}))
        assert all(n <= BOUND for _, n in seen), [(s.op, n) for s, n in seen if n > BOUND]


@pytest.mark.parametrize("shapes, attrs, error", [
    (((2, 3), (3,)), {"activation": "Elu"}, "activation must be one of"),
    (((2, 3), (3,)), {"activation": "Gelu", "approximate": "erf"}, "approximate must be"),
    (((2, 3), (3,)), {"activation": "Swish", "alpha": float("nan")}, "alpha must be a finite"),
    (((2, 3), (2,)), {"activation": "Relu"}, "trailing dims"),
    (((2, 3), (2, 1)), {"activation": "Relu"}, "trailing dims"),
    (((3,), (1, 3, 1)), {"activation": "Relu"}, "trailing dims"),
])
def test_bad_attributes_and_bias_shapes_are_shape_errors(shapes, attrs, error):
    schema = ops.get("BiasActivation", "memplan")
    node = type("Node", (), {"attrs": attrs})()
    with pytest.raises(ShapeError, match=error):
        schema.infer(node, [Info(s, np.dtype(np.float32)) for s in shapes])
    with pytest.raises(ShapeError, match="dtype"):
        schema.infer(type("Node", (), {"attrs": {}})(), [Info((2, 3), np.dtype(np.float32)), Info((3,), np.dtype(np.float64))])


def test_flops():
    schema, grad = ops.get("BiasActivation", "memplan"), ops.get("BiasActivationGrad", "memplan")
    node = type("Node", (), {"attrs": {"activation": "Relu"}})()
    x, b = Info((4, 5), np.dtype(np.float32)), Info((5,), np.dtype(np.float32))
    assert schema.flops(node, [x, b], [((4, 5), x.dtype)]) == 40
    assert schema.flops(node, [x], [((4, 5), x.dtype)]) == 20
    assert grad.flops(node, [x, x, b], [((4, 5), x.dtype)]) == 80


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["gpt2-dynamo", "bert-torchscript"])
def test_transformers_exports_fuse_every_mlp_activation(kind, backend, tmp_path):
    """GPT-2's gelu_new as the dynamo exporter writes it, and BERT's erf Gelu as the TorchScript one
    (opset 17) does, each fuse in both layers; the plan still runs like onnxruntime, and like the unfused
    plan."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    from exports import Output, runs_like_onnxruntime
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    if kind == "gpt2-dynamo":
        pytest.importorskip("onnxscript")
        config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, use_cache=False)
        model = Output(transformers.GPT2LMHeadModel(config), ["input_ids"], "logits", use_cache=False)
    else:
        config = transformers.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, max_position_embeddings=32)
        model = Output(transformers.BertModel(config), ["input_ids"], "last_hidden_state")
    path = tmp_path / "model.onnx"
    plan = runs_like_onnxruntime(model, path, kind.endswith("dynamo"), backend, input_ids=ids)
    assert plan.stats["fused_activation"] == 2
    assert not {"Tanh", "Erf"} & {s.op for s in plan.steps}
    if kind == "bert-torchscript":  # its Linear is a MatMul and a bias Add, which folds in
        assert all(len(s.inputs) == 2 for s in plan.steps if s.op == "BiasActivation")
    plain = planner.compile(str(path), {"input_ids": (2, 8)}, fuse_activation=False)
    feeds = {"input_ids": ids.numpy()}
    got, want = (run_on(backend, p, feeds)["out"] for p in (plan, plain))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    trained = planner.compile(str(path), {"input_ids": (2, 8)}, training=True)
    assert sum(s.op == "BiasActivationGrad" for s in trained.steps) == 2


@pytest.mark.parametrize("bound, rtol", [(3, 7e-7), (9, 3e-6)])
def test_the_float32_normal_cdf_follows_scipys(bound, rtol):
    """Gelu's Phi from the erfc fit, against SciPy's in float64, relative to Phi on both tails."""
    from scipy.special import ndtr
    from planner.ops.activation import normal_cdf
    x = np.linspace(-bound, bound, 100_001, dtype=np.float32)
    out, spare = np.empty_like(x), np.empty_like(x)
    normal_cdf(np, x, out, spare)
    want = ndtr(x.astype(np.float64))
    assert out[50_000] == 0.5 and np.all(np.abs(out - want) <= rtol * want)


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("name", ["gelu_new", "erf gelu", "silu", "quick gelu", "onnx gelu", "relu", "sigmoid", "tanh"])
def test_nan_infinities_and_huge_values_keep_their_results(name, jit):
    """Rows of x W + b that are NaN, +-inf or +-1e30 (an input row holding one): the fused op, NumPy's and the
    compiled one (whose arithmetic may not take NaN or inf for anything: Sigmoid(NaN) was 0 there, Gelu(inf)
    NaN), gives onnxruntime's results, as the pieces do."""
    x = RNG.standard_normal((2, 5, H)).astype(np.float32)
    x[0, :, 0] = [np.nan, np.inf, -np.inf, 1e30, -1e30]
    x[1, 1, 3] = 1e-40
    m = form_model(name)
    plans = [planner.compile(m, {"input": x.shape}, fuse_activation=f) for f in (True, False)]
    assert plans[0].stats["fused_activation"] == 1
    want = onnxruntime(m, {"input": x})["y"]
    for plan in plans:
        assert_same(Executor(plan, backend="numpy", jit=jit).run({"input": x})["y"], want)
