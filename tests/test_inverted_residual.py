"""The inverted_residual pass (memplan.InvertedResidual, MobileNetV2's block as one op): inference plans fuse a
1x1 conv (or none), a 3x3 depthwise conv and a 1x1 conv, and the results stay those of the three convolutions
and of onnxruntime, with the compiled kernel and with the NumPy one, over whole images, bands of rows and
groups of images; the widened tensors leave the arena; what the pass does not take keeps its convolutions."""
from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from executor import jit as compiled
from executor.kernels import KERNELS, find
from planner.errors import ShapeError
from planner.ops.inverted_residual import LANE_BYTES, banding

RNG = np.random.default_rng(5)
JITS = [False, pytest.param(True, marks=pytest.mark.skipif(not compiled.available(), reason="numba is not installed"))]


def block_model(shape, widened, filters, stride=1, widen=True, residual=False, activation="Clip", bias=True):
    """x (shape) -> [1x1 conv to `widened` channels, activation] -> 3x3 depthwise conv of `stride`, activation
    -> 1x1 conv to `filters` channels [+ x] -> y."""
    return chain_model(shape, block_layers(shape[1], widened, filters, stride, widen, activation), residual, bias)


def block_layers(channels, widened, filters, stride=1, widen=True, activation="Clip"):
    """The layers of one block, for chain_model: (weight shape, conv attributes) or an activation's name."""
    inner = widened if widen else channels
    widening = [((widened, channels, 1, 1), {}), activation] if widen else []
    return [*widening, ((inner, 1, 3, 3), {"group": inner, "pads": [1, 1, 1, 1], "strides": [stride, stride]}),
            activation, ((filters, inner, 1, 1), {})]


def chain_model(shape, layers, residual=False, bias=True):
    """x (shape) -> each layer in turn (a Conv with its bias, or an activation: Clip(0, 6) or another op by
    name; "" none) [+ x] -> y."""
    inits, nodes, last = {"lo": np.float32(0), "hi": np.float32(6)}, [], "x"
    for k, layer in enumerate(layers):
        if isinstance(layer, str):
            if layer:
                nodes.append(helper.make_node(layer, [last, "lo", "hi"] if layer == "Clip" else [last], [f"t{k}"]))
                last = f"t{k}"
            continue
        w_shape, attrs = layer
        inits[f"w{k}"] = RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))
        inputs = [last, f"w{k}"]
        if bias:
            inits[f"b{k}"] = RNG.standard_normal(w_shape[0]) * 0.1
            inputs.append(f"b{k}")
        nodes.append(helper.make_node("Conv", inputs, [f"t{k}"], **attrs))
        last = f"t{k}"
    if residual:
        nodes.append(helper.make_node("Add", [last, "x"], ["sum"]))
        last = "sum"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model, x, jit=True, **options):
    plan = planner.compile(model, {"x": x.shape}, **options)
    return plan, Executor(plan, backend="numpy", jit=jit, poison=True).run({"x": x})["y"]


def onnxruntime(model, x):
    import onnxruntime as ort
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


CASES = {  # x shape, widened, filters, block_model's keywords: large enough that the fused plan is no larger
    "widen, stride 1, residual": ((4, 8, 25, 27), 48, 8, {"residual": True}),
    "widen, stride 2": ((4, 8, 30, 23), 48, 12, {"stride": 2}),
    "widen, stride 2, odd": ((3, 6, 31, 31), 36, 10, {"stride": 2}),
    "no widening": ((8, 16, 32, 32), 16, 8, {"widen": False}),
    "no widening, stride 2, relu": ((8, 16, 33, 29), 16, 8, {"widen": False, "stride": 2, "activation": "Relu"}),
    "no widening, residual": ((6, 12, 20, 17), 12, 12, {"widen": False, "residual": True}),
    "no widening, one column, no bias": ((8, 16, 40, 1), 16, 8, {"widen": False, "bias": False}),
    "no activation, no bias": ((4, 8, 24, 24), 48, 8, {"activation": "", "bias": False}),
    "one image": ((1, 16, 56, 56), 96, 16, {"residual": True}),
    "three columns": ((4, 8, 9, 3), 48, 8, {"residual": True}),
    "four columns": ((4, 8, 9, 4), 48, 8, {"residual": True}),
    "four columns, stride 2": ((4, 8, 9, 4), 48, 12, {"stride": 2}),
    "six columns, stride 2": ((4, 8, 10, 6), 48, 12, {"stride": 2}),
}


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("case", CASES)
def test_the_fused_block_changes_no_result(case, jit):
    shape, widened, filters, keywords = CASES[case]
    model, x = block_model(shape, widened, filters, **keywords), RNG.standard_normal(shape).astype(np.float32)
    plan, got = run(model, x, jit)
    plain, want = run(model, x, jit, inverted_residual=False)
    assert plan.stats["inverted_residual"] == 1 and plan.steps[0].op == "InvertedResidual"
    assert plain.stats["inverted_residual"] == 0 and plan.arena_bytes <= plain.arena_bytes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("jit", JITS)
@pytest.mark.parametrize("widen", [True, False])
@pytest.mark.parametrize("images, rows", [(1, 1), (1, 3), (2, 5), (3, 2)])
def test_every_banding_gives_the_same_result(jit, images, rows, widen):
    """Jobs of one row, of bands that do not divide the image, of groups of images that do not divide the
    batch: each writes its part of Y, its halo rows read from the image or zero padding, reading no scratch
    it did not write (the scratch starts as NaN)."""
    shape, widened = (5, 8, 10, 9), 24 if widen else 8
    model, x = block_model(shape, widened, 8, stride=2, widen=widen), RNG.standard_normal(shape).astype(np.float32)
    plan = planner.compile(model, {"x": shape})
    step = plan.steps[0]
    assert step.op == "InvertedResidual"
    y = np.empty(plan.tensors[step.outputs[0]].shape, np.float32)
    found = banding(5, 8, widened, 8, shape[2:], y.shape[2:], 2, np.float32, widen, 2, images, rows)
    step = replace(step, attrs={**step.attrs, "images": found.images, "rows": found.rows, "lanes": found.lanes})
    ins = [x if name == "x" else plan.data[name] if name else None for name in step.inputs]
    scratch = {s.name: np.full(s.shape, np.nan, np.float32) for s in found.layout.slices}
    kernel = compiled.overrides() if jit else KERNELS
    find(kernel, step)(np, step, ins, [y], scratch)
    np.testing.assert_allclose(y, onnxruntime(model, x), rtol=1e-4, atol=1e-5)


def test_mobilenet_v2_fuses_every_block_and_its_arena_shrinks():
    shapes = {"input": (2, 3, 224, 224)}
    plan = planner.compile("zoo:mobilenet_v2", shapes)
    plain = planner.compile("zoo:mobilenet_v2", shapes, inverted_residual=False)
    assert plan.stats["inverted_residual"] == 17 and plain.stats["inverted_residual"] == 0
    assert plan.arena_bytes < plain.arena_bytes
    assert plan.stats["forward_flops"] == plain.stats["forward_flops"]
    x = RNG.standard_normal((2, 3, 224, 224)).astype(np.float32)
    got = Executor(plan, backend="numpy").run({"input": x})
    want = Executor(plain, backend="numpy").run({"input": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


def test_banding_fits_a_lane_splits_the_batch_and_caps_the_lanes():
    big = banding(8, 16, 96, 24, (112, 112), (56, 56), 2, np.float32, True, 2)
    assert big.images == 1 and big.rows < 56 and big.lanes == 2
    per_lane = next(s for s in big.layout.slices if s.name == "widened").nbytes // 2
    assert per_lane < LANE_BYTES
    small = banding(8, 160, 960, 160, (7, 7), (7, 7), 1, np.float32, True, 2)
    assert small.rows == 7 and 8 % small.images == 0 and (8 // small.images) % 2 == 0
    alone = banding(1, 160, 960, 160, (7, 7), (7, 7), 1, np.float32, True, 2)
    assert alone.images == 1 and alone.rows == 4 and alone.lanes == 2
    assert banding(1, 8, 8, 8, (1, 1), (1, 1), 1, np.float32, False, 4).lanes == 1


@pytest.mark.parametrize("why, keywords, options", [
    ("training", {}, {"training": True, "loss": "mse"}),
    ("a CUDA device", {}, {"device": "cuda:0"}),
    ("the option off", {}, {"inverted_residual": False}),
    ("fp16", {}, {"precision": "fp16"}),
])
def test_what_the_pass_does_not_take_keeps_its_convolutions(why, keywords, options):
    model = block_model((2, 8, 6, 6), 16, 8, **keywords)
    plan = planner.compile(model, {"x": (2, 8, 6, 6)}, **options)
    assert plan.stats["inverted_residual"] == 0, why


def test_the_plan_is_the_same_without_the_compiled_kernels(monkeypatch):
    """Whether numba runs the block or NumPy does, the plan fuses it: its arena does not depend on the kernels."""
    model, shapes = block_model((4, 8, 24, 24), 48, 8), {"x": (4, 8, 24, 24)}
    plan = planner.compile(model, shapes)
    monkeypatch.setenv("MEMPLAN_JIT", "0")
    plain = planner.compile(model, shapes)
    assert plan.stats["inverted_residual"] == plain.stats["inverted_residual"] == 1
    assert plan.arena_bytes == plain.arena_bytes


def test_a_widened_tensor_read_elsewhere_stays_written():
    """The widened tensor is also a graph output: its conv stays, and the block fused from the depthwise conv
    on reads it (no widening of its own)."""
    model = block_model((4, 8, 24, 24), 48, 8)
    model.graph.output.append(helper.make_tensor_value_info("t1", TensorProto.FLOAT, None))
    plan = planner.compile(model, {"x": (4, 8, 24, 24)})
    assert [s.op for s in plan.steps][:2] == ["FusedConv", "InvertedResidual"]
    assert plan.steps[1].inputs[:2] == ("t1", "")


def test_a_block_without_its_widening_follows_one_that_narrows():
    """Two blocks, the second without a 1x1 widening conv of its own: the first's narrowing conv is not taken
    for the second's widening one, and each is fused."""
    shape = (8, 8, 32, 32)
    model = chain_model(shape, block_layers(8, 48, 16) + block_layers(16, 16, 8, widen=False))
    x = RNG.standard_normal(shape).astype(np.float32)
    plan, got = run(model, x)
    assert plan.stats["inverted_residual"] == 2
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs, inputs, match", [
    ({"strides": [3, 3]}, None, "strides"),
    ({}, {"w2": (16, 1, 5, 5)}, "W2"),
    ({}, {"w3": (8, 12, 1, 1)}, "W3"),
])
def test_the_schema_refuses_what_the_kernels_do_not_compute(attrs, inputs, match):
    from planner import ops
    from planner.ops.base import Info
    shapes = {"x": (2, 8, 6, 6), "w1": (16, 8, 1, 1), "w2": (16, 1, 3, 3), "w3": (8, 16, 1, 1), **(inputs or {})}
    infos = [Info(shapes[n], np.dtype(np.float32)) if n else None for n in ("x", "w1", "", "w2", "", "w3", "", "")]
    node = planner.ir.Node("InvertedResidual", ("x", "w1", "", "w2", "", "w3", "", ""), ("y",), attrs, "n",
                           domain="memplan")
    with pytest.raises(ShapeError, match=match):
        ops.get("InvertedResidual", "memplan").infer(node, infos)


@pytest.mark.parametrize("jit", JITS)
def test_a_model_holding_the_op_runs_in_the_banding_its_plan_chose(jit):
    """A memplan.InvertedResidual read from a model, without images, rows or lanes: the schema chooses them
    for its scratch and the kernels read them off the scratch, as onnxruntime computes the three convs."""
    shape, widened, filters = (2, 8, 12, 10), 24, 8
    weights = {"w1": (widened, 8, 1, 1), "w2": (widened, 1, 3, 3), "w3": (filters, widened, 1, 1)}
    inits = {k: RNG.standard_normal(s).astype(np.float32) / 3 for k, s in weights.items()}
    node = helper.make_node("InvertedResidual", ["x", "w1", "", "w2", "", "w3", ""], ["y"], domain="memplan",
                            strides=[2, 2], expand_activation="Relu", depthwise_activation="Relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])
    x = RNG.standard_normal(shape).astype(np.float32)
    plan, got = run(model, x, jit)
    assert plan.steps[0].attrs["rows"] == 0 and {s.name for s in plan.steps[0].scratch} >= {"widened", "depthwise"}
    reference = chain_model(shape, [(weights["w1"], {}), "Relu", (weights["w2"], {"group": widened, "pads": [1] * 4,
                                    "strides": [2, 2]}), "Relu", (weights["w3"], {})], bias=False)
    for init in reference.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(inits[{"w0": "w1", "w2": "w2", "w4": "w3"}[init.name]], init.name)
                      if init.name.startswith("w") else init)
    np.testing.assert_allclose(got, onnxruntime(reference, x), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["widen, stride 1, residual", "widen, stride 2", "no widening"])
def test_a_fused_plan_runs_on_cupy_as_on_numpy_and_allocates_nothing(case):
    """A plan made for any device holds InvertedResidual; the CuPy backend runs it by the shared kernel."""
    from executor import backends
    from planner.errors import MemplanError
    from zoo_cases import assert_program_allocates_nothing
    try:
        cupy = backends.get("cupy").xp
    except MemplanError:
        pytest.skip("needs CuPy and a CUDA GPU")
    shape, widened, filters, keywords = CASES[case]
    model, x = block_model(shape, widened, filters, **keywords), RNG.standard_normal(shape).astype(np.float32)
    plan = planner.compile(model, {"x": shape})
    assert plan.steps[0].op == "InvertedResidual"
    ex = Executor(plan, backend="cupy")
    got = ex.run({"x": x})["y"].get()
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-5)
    assert_program_allocates_nothing(cupy, ex)
