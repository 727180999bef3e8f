"""The gradient of memplan.ScaledDotProductAttention's bias and through its LSE output (issue 19): dBias
of every broadcast shape and LSE's gradient against float64 finite differences, a dBias output only for
a bias that needs one, and training a learned bias (a synthetic relative bias and a T5 export) with the
attention fusion on and off."""
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner import ops
from planner.autodiff import backward
from planner.ops import Info
from test_fused_attention import SDPA, SMALL, cut, qkv
from test_no_hidden_allocations import BOUND, allocations
from zoo_cases import run_on

RNG = np.random.default_rng(1919)
GRAD = ops.get("ScaledDotProductAttentionGrad", "memplan")
B, H, HKV, S, T, D, DV = 2, 4, 2, 5, 7, 3, 2


def loss_model(bias_shape, causal, reads=("y", "lse"), dtype=TensorProto.DOUBLE, sizes=(B, H, HKV, S, T, D, DV)):
    """loss = sum(Y w) + sum(LSE u) (the terms `reads` names) of one fused attention over inputs q, k, v
    and bias, w and u random constants."""
    b, h, hkv, s, t, d, dv = sizes
    node = helper.make_node("ScaledDotProductAttention", ["q", "k", "v", "bias"], ["y", "lse"], domain="memplan",
                            causal=causal, scale=0.6)
    nodes, terms = [node], []
    weights = {"y": RNG.standard_normal((b, h, s, dv)), "lse": RNG.standard_normal((b, h, s))}
    for name in reads:
        nodes += [helper.make_node("Mul", [name, f"{name}_w"], [f"{name}_wy"]),
                  helper.make_node("ReduceSum", [f"{name}_wy"], [f"{name}_sum"], keepdims=0)]
        terms.append(f"{name}_sum")
    nodes.append(helper.make_node("Sum", terms, ["loss"]))
    shapes = {"q": (b, h, s, d), "k": (b, hkv, t, d), "v": (b, hkv, t, dv), "bias": bias_shape}
    inputs = [helper.make_tensor_value_info(n, dtype, shape) for n, shape in shapes.items()]
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(weights[n].astype(np_dtype), f"{n}_w") for n in reads]
    graph = helper.make_graph(nodes, "loss", inputs, [helper.make_tensor_value_info("loss", dtype, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    return m, {n: RNG.standard_normal(shape) for n, shape in shapes.items()}


def gradient_check(m, feeds, wrt, config=None, backend="numpy", eps=1e-6):
    """The planned gradients of `loss` with respect to `wrt`, run on `backend`, against central differences
    of the planned forward on NumPy (each run with poison on); returns the training graph."""
    trained, grads = backward(planner.load(m), "loss", wrt=wrt)
    got = run_on(backend, planner.compile(trained, schedule="file", config=config), feeds)
    forward = Executor(planner.compile(m, config=config), backend="numpy", poison=True)
    for name in wrt:
        numeric = np.zeros_like(feeds[name])
        for k in np.ndindex(numeric.shape):
            for sign in (1, -1):
                moved = feeds[name].copy()
                moved[k] += sign * eps
                numeric[k] += sign * float(forward.run({**feeds, name: moved})["loss"]) / (2 * eps)
        assert not np.isnan(got[grads[name]]).any()
        np.testing.assert_allclose(got[grads[name]], numeric, rtol=1e-5, atol=1e-7, err_msg=name)
    return trained


def grad_nodes(graph):
    return [n for n in graph.nodes if n.op == "ScaledDotProductAttentionGrad"]


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("bias_shape", [(1, 1, S, T), (B, 1, 1, T), (1, H, S, T), (B, H, S, T), (S, 1)])
def test_bias_and_lse_gradients_match_finite_differences(bias_shape, causal, config, backend):
    """dBias in each broadcast shape (grouped-query heads, two per kv head) and dQ, dK, dV with LSE's
    gradient flowing too."""
    m, feeds = loss_model(bias_shape, causal)
    wrt = ["q", "k", "v", "bias"] if bias_shape == (B, H, S, T) else ["bias"]
    trained = gradient_check(m, feeds, wrt, config, backend)
    [node] = grad_nodes(trained)
    assert len(node.inputs) == 8 and len(node.outputs) == 4


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
def test_lse_alone_has_a_gradient(config, backend):
    """A loss that reads LSE only: the gradient op gets no Y nor dY, and dV is zero."""
    m, feeds = loss_model((1, H, S, T), 1, reads=("lse",))
    trained = gradient_check(m, feeds, ["q", "k", "v", "bias"], config, backend)
    [node] = grad_nodes(trained)
    assert node.inputs[4] == node.inputs[6] == ""


@pytest.mark.parametrize("config", [None, SMALL], ids=["default tiles", "small tiles"])
def test_masked_bias_gets_zero_where_it_hides_keys(config, backend):
    """A bias with -inf entries and a row hidden whole: dBias is 0 there, finite elsewhere, as differences say."""
    m, feeds = loss_model((1, 1, S, T), 0, reads=("y",))
    feeds["bias"][RNG.random((1, 1, S, T)) < 0.3] = -np.inf
    feeds["bias"][0, 0, 2] = -np.inf
    trained, grads = backward(planner.load(m), "loss", wrt=["bias"])
    got = run_on(backend, planner.compile(trained, config=config), feeds)[grads["bias"]]
    assert (got[np.isneginf(feeds["bias"])] == 0).all() and np.isfinite(got).all()
    gradient_check(m, feeds, ["bias"], config, backend)


def test_the_bias_gets_a_gradient_output_only_when_it_needs_one():
    m, _ = loss_model((1, H, S, T), 0)
    for wrt, outputs in ((["q", "k", "v"], 3), (["q", "bias"], 4)):
        trained, _ = backward(planner.load(m), "loss", wrt=wrt)
        assert [len(n.outputs) for n in grad_nodes(trained)] == [outputs]


@pytest.mark.parametrize("bias_shape", [(1, 4, 40, 40), (2, 1, 1, 40), (2, 4, 40, 40)])
def test_16_bit_bias_gradient_sums_in_float32(bias_shape):
    """The gradient op on float16 inputs against float64's, by the same op: dBias summed in float32 scratch,
    or for a bias of the scores' shape each tile's once into its output."""
    feeds = [*qkv(s=40, t=40, d=8, dv=8, dtype=np.float16), RNG.standard_normal(bias_shape).astype(np.float16)]
    dy, dlse = RNG.standard_normal((2, 4, 40, 8)), RNG.standard_normal((2, 4, 40))
    step = type("Step", (), {"attrs": {"scale": 0.0, "causal": 1}})()
    results = {}
    for dtype in (np.float16, np.float64):
        q, k, v, bias = (f.astype(dtype) for f in feeds)
        wide = np.float32 if dtype == np.float16 else dtype
        infos = [Info(x.shape, x.dtype) for x in (q, k, v, bias)]
        y, lse = (np.empty(s, t) for s, t in SDPA.infer(step, infos))
        SDPA.kernel(np, step, [q, k, v, bias], [y, lse], cut(SDPA.workspace(step, infos, None, 8192)))
        outs = [np.empty(x.shape, x.dtype) for x in (q, k, v, bias)]
        layout = GRAD.workspace(step, infos + [None] * 4, [(x.shape, x.dtype) for x in outs], 8192)
        GRAD.kernel(np, step, [q, k, v, bias, y, lse, dy.astype(dtype), dlse.astype(wide)], outs, cut(layout))
        results[dtype] = outs
    for half, wide in zip(results[np.float16], results[np.float64]):
        assert half.dtype == np.float16
        np.testing.assert_allclose(half, wide, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias_shape", [(1, 12, 4096, 4096), (1, 1, 4096), (4096, 1)])
def test_workspace_grows_only_by_a_16_bit_accumulator_of_a_broadcast_bias(dtype, bias_shape):
    """dBias of float32 sums into its output, its broadcast sums in the free score tile: the workspace is the
    same with or without it; for float16 a broadcast bias adds a float32 accumulator of its shape (one of
    the scores' shape takes each tile's dS once, into its output); the tiles stay as large."""
    s = t = 4096
    node = type("Node", (), {"attrs": {"causal": 1}})()
    infos = [Info((1, 12, s, 64), np.dtype(dtype)), Info((1, 12, t, 64), np.dtype(dtype)),
             Info((1, 12, t, 64), np.dtype(dtype)), Info(bias_shape, np.dtype(dtype))]
    outs = [(i.shape, i.dtype) for i in infos]
    without, with_bias = (GRAD.workspace(node, infos + [None] * 4, o, 64 << 20) for o in (outs[:3], outs))
    broadcast = dtype == np.float16 and len(bias_shape) < 4
    extra = 4 * np.prod(bias_shape) if broadcast else 0
    assert with_bias.nbytes - without.nbytes in range(extra, extra + 64), (without.nbytes, with_bias.nbytes)
    assert [c.shape for c in with_bias.slices if c.name in ("rows", "cols")] == [(128,), (512,)]


def test_bias_gradient_allocates_nothing_hidden():
    feeds = qkv(b=1, h=4, hkv=2, s=512, t=512, d=32, dv=32, dtype=np.float32)
    for bias_shape in ((1, 4, 512, 512), (1, 1, 1, 512)):
        m, _ = loss_model(bias_shape, 1, dtype=TensorProto.FLOAT, sizes=(1, 4, 2, 512, 512, 32, 32))
        trained, _ = backward(planner.load(m), "loss", wrt=["q", "k", "v", "bias"])
        ex = Executor(planner.compile(trained), backend="numpy")
        data = dict(zip(["q", "k", "v", "bias"], [*feeds, RNG.standard_normal(bias_shape).astype(np.float32)]))
        seen, _ = allocations(ex, lambda: ex.run(data))
        assert all(n <= BOUND for _, n in seen), [(s.op, n) for s, n in seen if n > BOUND]


@pytest.mark.torch
def test_torch_form_of_the_gradient_matches():
    torch = pytest.importorskip("torch")
    q, k, v = qkv(s=6, t=9)
    bias = RNG.standard_normal((1, 4, 6, 9))
    step = type("Step", (), {"attrs": {"scale": 0.5, "causal": 1}})()
    infos = [Info(x.shape, x.dtype) for x in (q, k, v, bias)]
    y, lse = (np.empty(s, t) for s, t in SDPA.infer(step, infos))
    SDPA.kernel(np, step, [q, k, v, bias], [y, lse], cut(SDPA.workspace(step, infos, None, 1 << 20)))
    dy, dlse = RNG.standard_normal(y.shape), RNG.standard_normal(lse.shape)
    ins = [q, k, v, bias, y, lse, dy, dlse]
    outs = [np.empty(x.shape, x.dtype) for x in (q, k, v, bias)]
    GRAD.kernel(np, step, ins, outs, cut(GRAD.workspace(step, infos + [None] * 4, [(x.shape, x.dtype) for x in outs],
                                                        1 << 20)))
    want = GRAD.torch(torch, *map(torch.tensor, ins), scale=0.5, causal=1)
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-10, atol=1e-12)


def relative_bias_model(s=6, heads=2, d=4, buckets=5):
    """Exported attention (MatMul, Mul, Add, Softmax, MatMul) over projections of x, its bias gathered from a
    learned (buckets, heads) table by constant relative-position buckets, as T5's."""
    bucket = np.clip(np.arange(s)[None, :] - np.arange(s)[:, None], -(buckets // 2), buckets // 2) + buckets // 2
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n]) for n in "qkv"]
    nodes += [helper.make_node("Gather", ["table", "bucket"], ["gathered"]),
              helper.make_node("Transpose", ["gathered"], ["heads_first"], perm=[2, 0, 1]),
              helper.make_node("Unsqueeze", ["heads_first", "zero_axis"], ["bias"]),
              helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["qk"]),
              helper.make_node("Mul", ["qk", "scale"], ["scores"]),
              helper.make_node("Add", ["scores", "bias"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = {**{f"w{n}": RNG.standard_normal((d, d)).astype(np.float32) / 2 for n in "qkv"},
             "table": RNG.standard_normal((buckets, heads)).astype(np.float32), "bucket": bucket.astype(np.int64),
             "zero_axis": np.array([0], np.int64), "scale": np.array(d ** -0.5, np.float32)}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, heads, s, d))
    graph = helper.make_graph(nodes, "relative", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def train_fused_and_not(model, shapes, feeds, steps=5, lr=0.01):
    """(losses, params) of `steps` Adam steps (mse against random targets) of the plans with the attention
    fusion on and off; checks the fused plan holds the gradient op with a dBias output."""
    results = []
    for fuse in (True, False):
        plan = planner.compile(model, shapes, training=True, loss="mse", optimizer="adam", fuse_attention=fuse)
        grads = [s for s in plan.steps if s.op == "ScaledDotProductAttentionGrad"]
        assert not fuse or grads and all(len(s.outputs) == 4 for s in grads)
        targets = plan.tensors[plan.training["labels"]]
        ex = Executor(plan, backend="numpy", poison=True)
        ex.lr = lr
        data = {**feeds, targets.name: np.random.default_rng(0).standard_normal(targets.shape).astype(targets.dtype)}
        results.append(([ex.train_step(data) for _ in range(steps)], ex.parameters()))
    return results


def test_a_learned_relative_bias_trains_alike_fused_or_not():
    """Losses with the fusion on and off agree (the fused plan once gave the table no gradient: it stayed
    put and the losses parted by 2e-2), and so does the table, which moved."""
    model = relative_bias_model()
    x = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    (fused, fused_params), (plain, plain_params) = train_fused_and_not(model, None, {"x": x})
    np.testing.assert_allclose(fused, plain, rtol=1e-5)
    table = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "table"))
    assert np.abs(plain_params["table"] - table).max() > 1e-3
    np.testing.assert_allclose(fused_params["table"], plain_params["table"], rtol=1e-4, atol=1e-5)


@pytest.mark.torch
def test_t5_export_trains_alike_fused_or_not(tmp_path):
    """A T5 encoder (transformers config, no download), whose relative position bias is learned (without
    its gradient the fused plan's losses parted by 1e-3)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from exports import Output
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    module = Output(transformers.T5EncoderModel(config), ["input_ids"], "last_hidden_state")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (ids,), str(tmp_path / "t5.onnx"), input_names=["input_ids"],
                          output_names=["out"], dynamo=False, opset_version=17)
    (fused, fused_params), (plain, plain_params) = train_fused_and_not(str(tmp_path / "t5.onnx"), {"input_ids": (2, 8)},
                                                                       {"input_ids": ids.numpy()})
    np.testing.assert_allclose(fused, plain, rtol=1e-5)
    name = next(n for n in plain_params if "relative_attention_bias" in n)
    np.testing.assert_allclose(fused_params[name], plain_params[name], rtol=1e-4, atol=1e-5)
