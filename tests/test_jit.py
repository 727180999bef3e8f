"""The compiled CPU kernels (executor/jit, numba) give the shared NumPy kernels' results: depthwise and
im2col convolutions in every window form and chunking, FusedConv's epilogues, BiasActivation's activations;
and the executor's choice of them (jit=None/True/False, MEMPLAN_JIT, threads)."""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from executor import jit as compiled
from executor.backends import numpy_backend
from planner import Config
from planner.errors import MemplanError

numba = pytest.importorskip("numba")

CONVS = {  # name: (x shape, w shape, group, attrs)
    "depthwise 3x3": ((2, 8, 9, 9), (8, 1, 3, 3), 8, dict(pads=[1, 1, 1, 1])),
    "depthwise strided": ((3, 6, 12, 11), (6, 1, 3, 3), 6, dict(strides=[2, 2], pads=[1, 0, 1, 2])),
    "depthwise strided multiplier 2": ((2, 6, 13, 16), (12, 1, 3, 3), 6, dict(strides=[2, 2], pads=[0, 1, 2, 2])),
    "depthwise multiplier 3": ((2, 4, 7, 7), (12, 1, 3, 3), 4, dict(pads=[1, 1, 1, 1])),
    "depthwise rows padded unevenly": ((2, 4, 9, 9), (4, 1, 3, 3), 4, dict(pads=[0, 1, 2, 1])),
    "depthwise two columns": ((2, 4, 6, 2), (4, 1, 3, 3), 4, dict(pads=[1, 1, 1, 1])),
    "depthwise dilated 5x5": ((1, 5, 16, 16), (5, 1, 5, 5), 5, dict(dilations=[2, 2], pads=[4, 4, 4, 4])),
    "depthwise same_upper": ((2, 3, 10, 7), (3, 1, 4, 2), 3, dict(auto_pad="SAME_UPPER", strides=[2, 1])),
    "3x3": ((2, 5, 11, 10), (7, 5, 3, 3), 1, dict(pads=[1, 1, 1, 1])),
    "strided 7x7": ((2, 3, 23, 20), (4, 3, 7, 7), 1, dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    "dilated asymmetric": ((1, 4, 13, 12), (6, 4, 3, 2), 1, dict(dilations=[2, 3], pads=[0, 2, 3, 1])),
    "grouped": ((2, 6, 9, 9), (9, 2, 3, 3), 3, dict(pads=[1, 1, 1, 1], strides=[1, 2])),
    "pointwise": ((2, 6, 5, 5), (4, 6, 1, 1), 1, {}),
}
ACTIVATIONS = [("", []), ("Relu", []), ("Sigmoid", []), ("Tanh", []), ("Clip", [0.0, 6.0]),
               ("HardSigmoid", [0.2, 0.5])]


def conv_model(x_shape, w_shape, group, attrs, activation=None, params=(), z=False):
    """A Conv with a bias; with `activation` given ("" for none), a com.microsoft FusedConv, with Z when `z`."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(w_shape[:1]).astype(np.float32), "b")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    if activation is None:
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, **attrs)
    else:
        fused = {k: v for k, v in (("activation", activation), ("activation_params", list(params))) if v}
        node = helper.make_node("FusedConv", ["x", "w", "b", *(["z"] if z else [])], ["y"], domain="com.microsoft",
                                group=group, **fused, **attrs)
    graph = helper.make_graph([node], "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    if z:  # Z of Y's shape, from a second input bound when planning
        graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def both(model, feeds, config=None):
    """The outputs of the plan run with the compiled kernels and without, poison on."""
    plan = planner.compile(model, {k: v.shape for k, v in feeds.items()}, config=config)
    return [Executor(plan, backend="numpy", poison=True, jit=jit).run(feeds) for jit in (True, False)]


@pytest.mark.parametrize("case", CONVS)
@pytest.mark.parametrize("limit", [1, 900, 64 * 2 ** 20])
def test_convs_match_the_numpy_kernels_in_any_chunks(case, limit):
    x_shape, w_shape, group, attrs = CONVS[case]
    x = np.random.default_rng(0).standard_normal(x_shape, dtype=np.float32)
    fast, plain = both(conv_model(x_shape, w_shape, group, attrs), {"x": x}, Config(workspace_limit=limit))
    np.testing.assert_allclose(fast["y"], plain["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mkl_on", [True, False])
@pytest.mark.parametrize("transposed", [False, True])
def test_the_compiled_gemm_takes_blocks_of_wider_matrices(mkl_on, transposed):
    """blas.dot with an operand and the output each a block of columns of a wider matrix (a 1x1 conv's
    pixels, `pointwise`): their rows lie a leading dimension apart, the columns around the output's block
    stay as they were, on MKL's GEMM and on numba's np.dot alike."""
    from contextlib import nullcontext

    from executor.jit import blas
    from executor import mkl

    if mkl_on and not mkl.available():
        pytest.skip("MKL is not installed (the memplan[cpu] extra)")

    @numba.njit
    def into_block(gemm, a, b_wide, wide):
        blas.dot(gemm, a, b_wide[:, 1:6], wide[:, 3:8])

    rng = np.random.default_rng(4)
    a, b_wide = rng.standard_normal((6, 4), dtype=np.float32), rng.standard_normal((4, 9), dtype=np.float32)
    wide = np.full((6, 11), np.nan, np.float32)
    with nullcontext() if mkl_on else mkl.switched_off():
        into_block(blas.sgemm(), np.asfortranarray(a) if transposed else a, b_wide, wide)
    np.testing.assert_allclose(wide[:, 3:8], a @ b_wide[:, 1:6], rtol=1e-5, atol=1e-5)
    assert np.isnan(wide[:, :3]).all() and np.isnan(wide[:, 8:]).all()


@pytest.mark.parametrize("activation,params", ACTIVATIONS)
@pytest.mark.parametrize("case", ["depthwise strided", "3x3", "pointwise"])
@pytest.mark.parametrize("z", [False, True])
def test_fused_conv_epilogues_match(case, activation, params, z):
    x_shape, w_shape, group, attrs = CONVS[case]
    model = conv_model(x_shape, w_shape, group, attrs, activation, params, z)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    y_shape = planner.compile(conv_model(x_shape, w_shape, group, attrs), {"x": x_shape}).tensors["y"].shape
    feeds = {"x": x, **({"z": rng.standard_normal(y_shape, dtype=np.float32)} if z else {})}
    fast, plain = both(model, feeds, Config(workspace_limit=900))
    np.testing.assert_allclose(fast["y"], plain["y"], rtol=1e-5, atol=1e-5)


POOLS = [dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
         dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], ceil_mode=1),
         dict(kernel_shape=[3, 2], dilations=[2, 1], strides=[2, 1]),
         dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[2, 2]),
         dict(kernel_shape=[3, 3], strides=[2, 2]),
         dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
         dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1])]


@pytest.mark.parametrize("attrs", POOLS)
def test_max_pools_match(attrs):
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 11, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 10), dtype=np.float32)
    fast, plain = both(model, {"x": x})
    np.testing.assert_array_equal(fast["y"], plain["y"])


def bias_activation_model(shape, bias_shape, **attrs):
    inits = [] if bias_shape is None else \
        [numpy_helper.from_array(np.random.default_rng(2).standard_normal(bias_shape).astype(np.float32), "b")]
    node = helper.make_node("BiasActivation", ["x", *(["b"] if bias_shape is not None else [])], ["y"],
                            domain="memplan", **attrs)
    graph = helper.make_graph([node], "act", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])


@pytest.mark.parametrize("attrs", [dict(activation="Gelu"), dict(activation="Gelu", approximate="tanh"),
                                   dict(activation="Relu"), dict(activation="Sigmoid"), dict(activation="Tanh"),
                                   dict(activation="Swish", alpha=1.702)])
@pytest.mark.parametrize("bias_shape", [(48,), (1, 48), (1,), None])
def test_bias_activation_matches(attrs, bias_shape):
    x = np.random.default_rng(0).standard_normal((3, 5, 48), dtype=np.float32) * 4
    x[0, 0, :6] = [0.0, -0.0, 1e-30, -9.0, 12.0, -40.0]
    fast, plain = both(bias_activation_model(x.shape, bias_shape, **attrs), {"x": x})
    np.testing.assert_allclose(fast["y"], plain["y"], rtol=2e-6, atol=1e-6)


def test_gelu_is_within_float32_rounding_of_float64():
    """The compiled exact Gelu (an erfc fit and an exp of its own, vectorised) against erf in float64."""
    from scipy.special import erf
    x = np.linspace(-12, 12, 100_001, dtype=np.float32)
    got = Executor(planner.compile(bias_activation_model(x.shape, None, activation="Gelu"), {"x": x.shape}),
                   backend="numpy", jit=True).run({"x": x})["y"]
    z = x.astype(np.float64)
    want = z / 2 * (1 + erf(z / np.sqrt(2)))
    central = np.abs(z) < 6
    assert np.max(np.abs(got - want)[central] / np.abs(want[central]).clip(1e-30)) < 5e-6
    assert np.max(np.abs(got - want)) < 1e-6


def test_zoo_models_run_like_onnxruntime_with_the_compiled_kernels():
    import onnxruntime as ort
    from frontends import zoo
    for name in ("mobilenet_v2", "resnet18"):
        model = zoo.build(name)
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
        plan = planner.compile(model, {"input": x.shape})
        got = Executor(plan, backend="numpy", poison=True, jit=True).run({"input": x})
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = session.run(None, {"input": x})
        for name_, w in zip(plan.outputs, want):
            assert np.linalg.norm(got[name_] - w) / np.linalg.norm(w) < 1e-5, name


def test_the_executor_chooses_the_table(monkeypatch):
    plan = planner.compile("zoo:mlp", {"input": (2, 784)})
    assert Executor(plan, backend="numpy", jit=True).jit
    assert not Executor(plan, backend="numpy", jit=False).jit
    monkeypatch.setenv("MEMPLAN_JIT", "0")
    assert not Executor(plan, backend="numpy").jit
    monkeypatch.setenv("MEMPLAN_JIT", "1")
    assert Executor(plan, backend="numpy").jit
    monkeypatch.setattr(compiled, "available", lambda: False)
    assert not Executor(plan, backend="numpy").jit
    with pytest.raises(MemplanError, match="needs numba"):
        Executor(plan, backend="numpy", jit=True)


def test_threads_cap_the_compiled_loops_too():
    plan = planner.compile(bias_activation_model((64, 48), (48,)), {"x": (64, 48)})
    ex = Executor(plan, backend="numpy", jit=True, threads=1)
    seen = []
    kernel = numpy_backend.table(True)["memplan", "BiasActivation"]
    ex.program = [(lambda *a: (seen.append(numba.get_num_threads()), kernel(*a)), *bound[1:])
                  for bound in ex.program]
    ex.run({"x": np.ones((64, 48), np.float32)})
    assert seen == [1]


def test_a_forked_child_runs_the_compiled_kernels_after_its_parent():
    """numba's GNU OpenMP layer aborts a child forked after the parent ran parallel loops; TBB's (or one
    thread, without TBB) does not."""
    from isolation import isolated
    plan = planner.compile(bias_activation_model((64, 48), (48,), activation="Gelu"), {"x": (64, 48)})
    x = np.ones((64, 48), np.float32)
    want = Executor(plan, backend="numpy", jit=True).run({"x": x})["y"]
    kind, got = isolated(lambda: Executor(plan, backend="numpy", jit=True).run({"x": x})["y"])
    assert kind == "ok" and np.array_equal(got, want)


def test_executors_in_several_threads_run_the_compiled_kernels_at_once():
    from concurrent.futures import ThreadPoolExecutor
    plan = planner.compile(bias_activation_model((256, 48), (48,), activation="Gelu"), {"x": (256, 48)})
    x = np.random.default_rng(0).standard_normal((256, 48), dtype=np.float32)
    want = Executor(plan, backend="numpy", jit=False).run({"x": x})["y"]

    def runs(_):
        ex = Executor(plan, backend="numpy", jit=True)
        return [ex.run({"x": x})["y"] for _ in range(50)]
    with ThreadPoolExecutor(4) as pool:
        for results in pool.map(runs, range(4)):
            for got in results:
                np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_openblas_threads_sleep_sooner_only_where_the_compiled_kernels_run(monkeypatch):
    from planner import config
    for jit, preset, want in (("1", None, "18"), ("0", None, None), ("1", "28", "28")):
        monkeypatch.setenv("MEMPLAN_JIT", jit)
        if preset is None:
            monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
        else:
            monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", preset)
        config.quiet_blas()
        assert os.environ.get("OPENBLAS_THREAD_TIMEOUT") == want


def attention_model(q, k, v, bias, lse, **attrs):
    """One memplan.ScaledDotProductAttention over inputs of the given shapes (bias None for none), with the
    LSE output when `lse`."""
    names = ["q", "k", "v", *(["bias"] if bias else [])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, (q, k, v, bias))]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["y", "lse"][:1 + lse]]
    node = helper.make_node("ScaledDotProductAttention", names, ["y", "lse"][:1 + lse], domain="memplan", **attrs)
    return helper.make_model(helper.make_graph([node], "attention", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])


ATTENTIONS = {  # name: (Q, K, V, bias shapes, attributes)
    "plain": ((2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 5), None, {}),
    "grouped causal": ((1, 4, 5, 8), (1, 2, 9, 8), (1, 2, 9, 8), None, dict(causal=1)),
    "key mask": ((2, 2, 6, 4), (2, 2, 10, 4), (2, 2, 10, 4), (2, 1, 1, 10), dict(scale=0.3)),
    "full bias causal": ((1, 2, 9, 4), (1, 2, 9, 4), (1, 2, 9, 4), (1, 2, 9, 9), dict(causal=1)),
    "one query": ((2, 2, 1, 4), (2, 2, 1, 4), (2, 2, 1, 4), (2, 1, 1, 1), {}),
}


@pytest.mark.parametrize("case", ATTENTIONS)
@pytest.mark.parametrize("limit", [600, 64 * 2 ** 20])
@pytest.mark.parametrize("lse", [False, True])
def test_attention_matches(case, limit, lse):
    q, k, v, bias, attrs = ATTENTIONS[case]
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s, dtype=np.float32) for n, s in zip("qkv", (q, k, v))}
    if bias:
        feeds["bias"] = np.where(rng.random(bias) < 0.2, -np.inf, rng.standard_normal(bias)).astype(np.float32)
    fast, plain = both(attention_model(q, k, v, bias, lse, **attrs), feeds, Config(workspace_limit=limit))
    for name in plain:
        np.testing.assert_allclose(fast[name], plain[name], rtol=1e-5, atol=1e-6)


def test_a_numba_that_cannot_set_up_the_kernels_leaves_the_numpy_ones(monkeypatch):
    def broken():
        raise RuntimeError("cannot cache function 'depthwise': no locator available")
    monkeypatch.setattr(compiled, "overrides", broken)
    monkeypatch.setattr(numpy_backend, "_compiled", {})
    monkeypatch.setattr(compiled, "BROKEN", [])
    plan = planner.compile("zoo:mlp", {"input": (2, 784)})
    with pytest.warns(RuntimeWarning, match=r"no locator available\); running the NumPy kernels"):
        assert not Executor(plan, backend="numpy").jit
    with pytest.raises(MemplanError, match="cannot be set up"):
        Executor(plan, backend="numpy", jit=True)
