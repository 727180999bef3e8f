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
from pass_properties import assert_same, onnxruntime
from test_autodiff import numeric_gradient
from test_fused_attention import cut
from test_no_hidden_allocations import BOUND, allocations
from zoo_cases import input_shapes, reference, rel_l2, run_on, small_model

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
def test_gradients_match_finite_differences(case, config, backend):
    """dX, dskip, dscale and dbias of LayerNormalization and of the fused op (with its Sum read too) against
    central differences, the gradient one memplan.LayerNormalizationGrad."""
    m, x = fused_model(**case)
    names = ["x", *(i.name for i in m.graph.initializer if i.name in ("w", "b", "s"))]
    trained, grads = backward(planner.load(m), "y", wrt=names)
    assert [n.op for n in trained.nodes].count("LayerNormalizationGrad") == 1
    got = run_on(backend, planner.compile(trained, schedule="file", config=config), {"x": x})
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


def pieces_model(form, shared=False, eps=1e-5, two=2.0, axes=(-1,), dtype=np.float32):
    """A float model y = norm(x + x * k) as an exporter writes `form`, the norm's weight w (and bias b); with
    `shared` the residual sum is read elsewhere too (output z). Its feeds."""
    names = {"rms_pow_reciprocal": ("Pow", "Reciprocal"), "rms_mul_div": ("Mul", "Div"),
             "rms_pow_one_over": ("Pow", "OneOver"), "ln_pow_div": ("Pow", "Div"),
             "ln_mul_reciprocal": ("Mul", "Reciprocal")}
    shape = (2, 4, 16)
    params = {"k": RNG.standard_normal(shape), "k2": RNG.standard_normal(shape), "w": RNG.standard_normal(16),
              "b": RNG.standard_normal(16), "eps": np.array(eps), "two": np.array(two), "one": np.array(1.0)}
    node = helper.make_node
    nodes = [node("Mul", ["x", "k"], ["h"]), node("Add", ["x", "h"], ["r"])]
    if form == "ln_node":
        nodes.append(node("LayerNormalization", ["r", "w", "b"], ["y"], epsilon=eps))
    else:
        square, scale = names[form]
        centred = "r"
        if form.startswith("ln"):
            nodes += [node("ReduceMean", ["r"], ["mean"], axes=list(axes)), node("Sub", ["r", "mean"], ["d"])]
            centred = "d"
        nodes += [node("Pow", [centred, "two"], ["sq"]) if square == "Pow" else node("Mul", [centred, centred], ["sq"]),
                  node("ReduceMean", ["sq"], ["ms"], axes=list(axes)), node("Add", ["ms", "eps"], ["v"]),
                  node("Sqrt", ["v"], ["den"])]
        if scale == "Div":
            nodes.append(node("Div", [centred, "den"], ["n"]))
        else:
            inverse = (node("Reciprocal", ["den"], ["inv"]) if scale == "Reciprocal"
                       else node("Div", ["one", "den"], ["inv"]))
            nodes += [inverse, node("Mul", [centred, "inv"], ["n"])]
        if form.startswith("ln"):
            nodes += [node("Mul", ["n", "w"], ["nw"]), node("Add", ["b", "nw"], ["y"])]
        else:
            nodes.append(node("Mul", ["w", "n"], ["y"]))
    outputs = ["y", "z"] if shared else ["y"]
    if shared:
        nodes.append(node("Mul", ["r", "k2"], ["z"]))
    used = {i for n in nodes for i in n.input}
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, form, [helper.make_tensor_value_info("x", onnx_type, shape)],
                              [helper.make_tensor_value_info(o, onnx_type, None) for o in outputs],
                              [numpy_helper.from_array(v.astype(dtype), k) for k, v in params.items() if k in used])
    feeds = {"x": RNG.standard_normal(shape).astype(dtype)}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def with_and_without(model, feeds, shapes=None, backend="numpy", **options):
    """(plan with the pass, its outputs, the outputs without it), each run on `backend` with poison on."""
    shapes = shapes or {k: v.shape for k, v in feeds.items()}
    plans = [planner.compile(model, shapes, fuse_norm=f, **options) for f in (True, False)]
    fused, plain = (run_on(backend, p, feeds) for p in plans)
    assert plans[1].stats["fused_norm"] == 0
    return plans[0], fused, plain


def like_onnxruntime(model, feeds, got):
    import onnxruntime as ort
    path = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for name, want in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


FORMS = ["rms_pow_reciprocal", "rms_mul_div", "rms_pow_one_over", "ln_pow_div", "ln_mul_reciprocal", "ln_node"]


@pytest.mark.parametrize("shared", [False, True], ids=["sum unread", "sum read"])
@pytest.mark.parametrize("form", FORMS)
def test_each_form_fuses_with_its_residual_add_and_changes_no_result(form, shared, backend):
    pytest.importorskip("onnxruntime")
    model, feeds = pieces_model(form, shared)
    plan, fused, plain = with_and_without(model, feeds, backend=backend)
    assert plan.stats["fused_norm"] == 1
    steps = [s for s in plan.steps if s.op == "AddLayerNormalization"]
    assert len(steps) == 1 and steps[0].inputs[:2] == ("x", "h") and (len(steps[0].outputs) == 2) == shared
    assert not {"Add", "ReduceMean", "Sqrt", "LayerNormalization"} & {s.op for s in plan.steps}
    for name in plain:
        assert rel_l2(fused[name], plain[name]) < 1e-5, name
    like_onnxruntime(model, feeds, fused)


@pytest.mark.parametrize("form, change", [
    ("rms_pow_reciprocal", dict(two=3.0)), ("ln_pow_div", dict(two=2.5)), ("rms_mul_div", dict(axes=(1,))),
    ("ln_mul_reciprocal", dict(axes=(0, 2))), ("rms_pow_reciprocal", dict(dtype=np.float16)),
])
def test_forms_that_are_no_norm_stay(form, change):
    """A Pow not of 2, statistics over other axes than the weight's (or not trailing), a 16-bit export:
    the pieces stay, and results are the same."""
    model, feeds = pieces_model(form, **change)
    plan, fused, plain = with_and_without(model, feeds)
    assert plan.stats["fused_norm"] == 0
    np.testing.assert_array_equal(fused["y"], plain["y"])


@pytest.mark.parametrize("case", ["gpt2_small", "bert_base"])
def test_zoo_models_fuse_and_change_no_result(case, backend):
    model, inputs, want = reference(case, 2)
    plan, fused, plain = with_and_without(model, inputs, backend=backend)
    assert plan.stats["fused_norm"] >= 4
    for name in want:
        assert rel_l2(fused[name], plain[name]) < 1e-5, name
        np.testing.assert_allclose(fused[name], want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["gpt2_small", "bert_base"])
def test_training_through_fused_norms_matches_the_exported_form(case, backend):
    model = small_model(case)
    _, inputs, _ = reference(case, 2)
    losses = []
    for fuse in (True, False):
        plan = planner.compile(model, input_shapes(model, 2), training=True, loss="mse", fuse_norm=fuse)
        assert (plan.stats["fused_norm"] > 0) == fuse
        targets = plan.tensors[plan.training["labels"]]
        feeds = {**inputs, targets.name: np.full(targets.shape, 0.1, np.dtype(targets.dtype))}
        ex = Executor(plan, backend=backend, poison=True)
        losses.append([ex.train_step(feeds) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def test_mixed_precision_computes_the_fused_op_in_float32(backend):
    """Under amp-fp16 the fused op reads its residual in float32, as autocast's Add and layer_norm do."""
    model, inputs, _ = reference("gpt2_small", 2)
    plan, fused, plain = with_and_without(model, inputs, backend=backend, precision="amp-fp16")
    steps = [s for s in plan.steps if s.op == "AddLayerNormalization"]
    assert steps and all(np.dtype(plan.tensors[i].dtype) == np.float32 for s in steps for i in s.inputs if i)
    for name in plain:
        assert rel_l2(fused[name], plain[name]) < 1e-5, name


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny LLaMA's dynamo export (RMSNorm in pieces) and its path."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    from test_llama_export import BATCH, SEQ, VOCAB, export, tiny_llama
    path = tmp_path_factory.mktemp("llama") / "llama.onnx"
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    export(tiny_llama(), ids, path)
    return str(path), ids.numpy()


@pytest.mark.torch
def test_llama_rms_norms_fuse_and_change_no_result(llama):
    path, ids = llama
    pytest.importorskip("onnxruntime")
    plan, fused, plain = with_and_without(path, {"input_ids": ids})
    assert plan.stats["fused_norm"] == 5  # two per layer and the final norm
    assert not {"Pow", "Sqrt", "ReduceMean"} & {s.op for s in plan.steps}
    assert rel_l2(fused["logits"], plain["logits"]) < 1e-5
    like_onnxruntime(path, {"input_ids": ids}, fused)


@pytest.mark.torch
def test_llama_trains_alike_with_and_without_the_pass(llama):
    """Three SGD steps: equal losses and parameters; the fused plan's arena is no larger."""
    path, ids = llama
    labels = np.concatenate([ids[:, 1:], np.full((ids.shape[0], 1), -100)], axis=1)
    runs, plans = [], []
    for fuse in (True, False):
        plans.append(planner.compile(path, {"input_ids": ids.shape}, training=True, loss="cross_entropy",
                                     optimizer="sgd", optimizer_args={"lr": 0.1}, fuse_norm=fuse))
        ex = Executor(plans[-1], backend="numpy", poison=True)
        runs.append(([ex.train_step({"input_ids": ids, "labels": labels}) for _ in range(3)], ex.parameters()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-5)
    for name, value in runs[1][1].items():
        assert rel_l2(runs[0][1][name], value) < 1e-5, name
    assert plans[0].arena_bytes <= plans[1].arena_bytes


@pytest.mark.torch
@pytest.mark.parametrize("build, dynamo", [("gpt2", True), ("bert", False)], ids=["gpt2-dynamo", "bert-torchscript16"])
def test_exports_fuse_and_run_like_onnxruntime(build, dynamo, tmp_path):
    """GPT-2's LayerNormalization nodes after residual Adds (dynamo) and BERT's layer norms in pieces
    (TorchScript at opset 16)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxruntime")
    if dynamo:
        pytest.importorskip("onnxscript")
    import warnings
    import test_transformers_exports as exports
    torch.manual_seed(0)
    module, inputs = getattr(exports, build)()
    path = str(tmp_path / "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), tuple(inputs.values()), path, input_names=list(inputs), output_names=["out"],
                          dynamo=dynamo, **({} if dynamo else {"opset_version": 16}))
    feeds = {name: value.numpy() for name, value in inputs.items()}
    plan, fused, plain = with_and_without(path, feeds)
    assert plan.stats["fused_norm"] >= 4
    assert rel_l2(fused["out"], plain["out"]) < 1e-5
    like_onnxruntime(path, feeds, fused)


@pytest.mark.torch
@pytest.mark.parametrize("rms", [0, 1])
def test_torch_forms_match_the_kernels(rms):
    torch = pytest.importorskip("torch")
    x, skip, dy, dsum = (RNG.standard_normal((3, 4, 6)) for _ in range(4))
    w, b = RNG.standard_normal(6), RNG.standard_normal(6)
    fwd = ops.get("AddLayerNormalization", "memplan")
    step, infos = _step(rms=rms), [Info(a.shape, a.dtype) for a in (x, skip, w, b)]
    outs = [np.empty(x.shape), np.empty(x.shape)]
    fwd.kernel(np, step, [x, skip, w, b], outs, cut(fwd.workspace(step, infos, None, 1 << 20)))
    t = [torch.tensor(a) for a in (x, skip, w, b, dy, dsum)]
    for got, want in zip(fwd.torch(torch, *t[:4], rms=rms), outs):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    grads = GRAD.torch(torch, t[4], torch.tensor(outs[1]), t[2], dsum=t[5], rms=rms)
    dx, dscale, dbias = _grad(dy, outs[1], w, rms=rms)
    for got, want in zip(grads, (dx + dsum, dscale, dbias)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", ["ln_pow_div", "rms_mul_div", "ln_node"])
@pytest.mark.parametrize("eps", [np.nan, np.inf, -1e-5])
def test_an_epsilon_the_fused_op_does_not_take_keeps_the_norm(form, eps):
    """An epsilon that is NaN, infinite or below 0 (the fused op takes a finite one >= 0): no fused op, no
    error, and onnxruntime's results, NaN where it has them."""
    model, feeds = pieces_model(form, eps=eps)
    plan, fused, plain = with_and_without(model, feeds)
    assert plan.stats["fused_norm"] == 0
    for got in (fused, plain):
        assert_same(got["y"], onnxruntime(model, feeds)["y"])


def test_a_numerator_centred_by_another_mean_is_no_norm():
    """x - mean(x) over the last axis squared for the variance, x - mean(x) over the last two in the numerator:
    two Subs the pattern's one centring Op would both match, were an Op not held to one node."""
    node = helper.make_node
    nodes = [node("ReduceMean", ["x"], ["m"], axes=[-1]), node("Sub", ["x", "m"], ["d"]),
             node("ReduceMean", ["x"], ["m2"], axes=[-2, -1]), node("Sub", ["x", "m2"], ["d2"]),
             node("Mul", ["d", "d"], ["sq"]), node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             node("Add", ["var", "eps"], ["v"]), node("Sqrt", ["v"], ["sd"]), node("Div", ["d2", "sd"], ["xh"]),
             node("Mul", ["xh", "w"], ["y"])]
    graph = helper.make_graph(nodes, "two means", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 4, 16))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.float32(1e-5), "eps"),
                               numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": RNG.standard_normal((3, 4, 16)).astype(np.float32)}
    plan, fused, plain = with_and_without(model, feeds)
    assert plan.stats["fused_norm"] == 0
    np.testing.assert_array_equal(fused["y"], plain["y"])
    like_onnxruntime(model, feeds, fused)


def test_a_weight_that_is_the_normalised_rows_is_no_norm():
    """x^ * x^ over a vector: the weight variable would bind x^, which the fused op's rewrite drops."""
    node = helper.make_node
    nodes = [node("ReduceMean", ["x"], ["m"], axes=[-1]), node("Sub", ["x", "m"], ["d"]),
             node("Mul", ["d", "d"], ["sq"]), node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             node("Add", ["var", "eps"], ["v"]),
             node("Sqrt", ["v"], ["sd"]), node("Div", ["d", "sd"], ["xh"]), node("Mul", ["xh", "xh"], ["y"])]
    graph = helper.make_graph(nodes, "squared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (16,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.float32(1e-5), "eps")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": RNG.standard_normal(16).astype(np.float32)}
    plan, fused, _ = with_and_without(model, feeds)
    assert plan.stats["fused_norm"] == 0
    like_onnxruntime(model, feeds, fused)
