"""memplan's own CUDA kernels (executor/backends/cupy_conv.py, cupy_fused.py) against the NumPy backend and
the plain formulas: depthwise convolutions with FusedConv's epilogues, AddLayerNormalization in place and not,
and attention with each number of threads a query row can take."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

import planner
from executor import Executor
from executor.backends import cupy_fused
from test_fused_attention import qkv, reference, run
from zoo_cases import feeds as zoo_feeds, input_shapes, rel_l2, run_on, small_model

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng(23)


def depthwise_model(x_shape, multiplier, kernel, dtype, after=(), bias=True, **attrs):
    """x -> Conv(group = channels, `multiplier` outputs each) -> the ops of `after` ("add": a residual input z of
    the output's shape; else (op, attributes, constant inputs)), each feeding the next."""
    channels = x_shape[1]
    w = RNG.standard_normal((channels * multiplier, 1, *kernel)).astype(dtype)
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(channels * multiplier).astype(dtype), "b"))
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["t0"], group=channels, **attrs)]
    inputs = [helper.make_tensor_value_info("x", kind, x_shape)]
    for i, op in enumerate(after):
        if op == "add":
            # the cases adding a residual keep the image's size
            inputs.append(helper.make_tensor_value_info("z", kind, (x_shape[0], channels * multiplier, *x_shape[2:])))
            nodes.append(helper.make_node("Add", [f"t{i}", "z"], [f"t{i + 1}"]))
            continue
        name, op_attrs, constants = op
        names = [f"c{i}_{j}" for j in range(len(constants))]
        inits += [numpy_helper.from_array(np.asarray(c, dtype), n) for n, c in zip(names, constants)]
        nodes.append(helper.make_node(name, [f"t{i}", *names], [f"t{i + 1}"], **op_attrs))
    graph = helper.make_graph(nodes, "depthwise", inputs, [helper.make_tensor_value_info(f"t{len(after)}", kind, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


DEPTHWISE_CASES = {
    "3x3-clip": ((2, 6, 9, 11), 1, (3, 3), [("Clip", {}, (0.0, 6.0))], {"pads": [1, 1, 1, 1]}),
    "multiplier-strided-dilated-relu": ((3, 4, 12, 10), 2, (5, 3), [("Relu", {}, ())],
                                        {"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]}),
    "residual-hardsigmoid": ((2, 5, 7, 8), 1, (3, 3), ["add", ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, ())],
                             {"auto_pad": "SAME_UPPER"}),
    "1d-strided-sigmoid": ((2, 5, 17), 1, (3,), [("Sigmoid", {}, ())], {"strides": [2], "pads": [1, 0]}),
    "no-bias-tanh": ((1, 8, 6, 6), 1, (3, 3), [("Tanh", {}, ())], {"pads": [0, 0, 0, 0]}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_depthwise_convs_run_on_memplans_kernel_as_numpy_runs_them(cupy, case, dtype):
    x_shape, multiplier, kernel, after, attrs = DEPTHWISE_CASES[case]
    model = depthwise_model(x_shape, multiplier, kernel, dtype, after, bias=case != "no-bias-tanh", **attrs)
    plan = planner.compile(model, device="cuda")
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(dtype)
             for i in model.graph.input}
    ex = Executor(plan, backend="cupy", poison=True)
    convs = {s.name for s in plan.steps if s.op in ("Conv", "FusedConv")}
    assert convs and convs <= ex.runtime.depthwise_steps, [(s.op, s.name) for s in plan.steps]
    got = {k: v.get() for k, v in ex.run(feeds).items()}
    want = run_on("numpy", plan, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12 if dtype == np.float64 else 1e-5,
                                   atol=1e-12 if dtype == np.float64 else 1e-5)


def layer_norm_model(shape, dtype, skip, bias, total, rms, axis=-1):
    """One memplan.AddLayerNormalization over graph inputs, scale and bias of the normalised dims."""
    kind = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    normalised = shape[axis % len(shape):]
    names = ["x", "skip" if skip else "", "scale", "bias" if bias else ""]
    node = helper.make_node("AddLayerNormalization", names, ["y", "sum"] if total else ["y"], domain="memplan",
                            axis=axis, epsilon=1e-5, rms=rms)
    inputs = [helper.make_tensor_value_info(n, kind, shape if n in ("x", "skip") else normalised) for n in names if n]
    outputs = [helper.make_tensor_value_info(n, kind, None) for n in node.output]
    graph = helper.make_graph([node], "norm", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("memplan", 1)])
    return model, {n: RNG.standard_normal(shape if n in ("x", "skip") else normalised).astype(dtype) + (n == "x")
                   for n in names if n}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("skip, bias, total, rms", [(True, True, True, 0), (True, True, False, 0),
                                                    (False, True, False, 0), (True, False, True, 1),
                                                    (False, False, False, 1)])
@pytest.mark.parametrize("shape, axis", [((3, 7, 768), -1), ((5, 33), -1), ((2, 3, 4, 300), 2), ((4, 1500), -1)])
def test_add_layer_norm_runs_as_numpy_runs_it(cupy, dtype, skip, bias, total, rms, shape, axis):
    model, feeds = layer_norm_model(shape, dtype, skip, bias, total, rms, axis)
    plan = planner.compile(model, device="cuda")
    got, want = run_on("cupy", plan, feeds), run_on("numpy", plan, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12 if dtype == np.float64 else 2e-5,
                                   atol=1e-12 if dtype == np.float64 else 2e-5, err_msg=name)


def test_add_layer_norm_in_place_over_its_inputs(cupy):
    """Y over X and Sum over skip (the op's in-place pairs), as the planner shares them in a residual stream."""
    model, feeds = layer_norm_model((6, 384), np.float64, True, True, True, 0)
    plan = planner.compile(model, device="cuda")
    want = run_on("numpy", plan, feeds)
    x, skip = (cupy.asarray(feeds[n]) for n in ("x", "skip"))
    scale, bias = (cupy.asarray(feeds[n]) for n in ("scale", "bias"))
    from executor.backends import cupy_backend
    kernel = cupy_backend.kernels[("memplan", "AddLayerNormalization")]
    kernel(cupy, plan.steps[0], [x, skip, scale, bias], [x, skip], {})
    np.testing.assert_allclose(x.get(), want["y"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(skip.get(), want["sum"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads", [1, 4 * 2 * 4 * 9, cupy_fused.THREADS], ids=["1 lane", "4 lanes", "32 lanes"])
@pytest.mark.parametrize("d, dv", [(80, 48), (64, 64), (3, 7)])
@pytest.mark.parametrize("causal", [0, 1])
def test_attention_with_any_lanes_a_row_takes(cupy, monkeypatch, threads, d, dv, causal):
    monkeypatch.setattr(cupy_fused, "THREADS", threads)
    feeds = qkv(b=2, h=4, hkv=2, s=9, t=13, d=d, dv=dv)
    bias = RNG.standard_normal((1, 4, 9, 13))
    bias[RNG.random(bias.shape) < 0.2] = -np.inf
    y, lse, _ = run([*feeds, bias], backend="cupy", causal=causal)
    want_y, want_lse = reference(*feeds, bias, causal=causal)
    np.testing.assert_allclose(y, want_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pick", ["fused", "conv then memplan's epilogue"])
@pytest.mark.parametrize("case", ["resnet50", "mobilenet_v2"])
def test_either_form_of_a_fused_conv_cudnn_may_be_timed_to_runs_as_numpy(cupy, monkeypatch, case, pick):
    """FusedConv steps with an epilogue (ReLU, ReLU6's clip, a residual) run by cuDNN's fused graph, or by its conv
    alone and memplan's one-pass epilogue: whichever the timing picks, the same outputs."""
    pytest.importorskip("cudnn")
    from executor.backends import cudnn_conv
    choices = []

    def choose(self, candidates, step, ins, outs):
        choices.append(len(candidates))
        return candidates[0 if pick == "fused" else -1]
    monkeypatch.setattr(cudnn_conv.Convolutions, "_fastest", choose)
    model = small_model(case)
    plan = planner.compile(model, input_shapes(model, 2), device="cuda")
    inputs = zoo_feeds(model, 2)
    got = run_on("cupy", plan, inputs)
    assert choices and set(choices) == {2}, choices
    for name, value in run_on("numpy", plan, inputs).items():
        assert rel_l2(got[name], value) < 1e-5, name
