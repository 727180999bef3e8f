"""The winograd pass (memplan.WinogradConv, F(2x2, 3x3)): inference plans compute their 3x3 convolutions by it
and the results stay those of im2col and onnxruntime, with the NumPy kernels and the compiled ones, in whole
batches and in the chunks and blocks a small scratch forces; the arena never grows; what it does not take
(training, a CUDA device, 16-bit, strides, groups, few channels) keeps its Conv."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import jit as compiled
from executor.backends import cupy_backend
from planner.config import Config
from planner.errors import ShapeError
from pass_properties import assert_same
from zoo_cases import run_on

RNG = np.random.default_rng(11)
ENGINES = ["numpy",
           pytest.param("numba", marks=pytest.mark.skipif(not compiled.available(), reason="numba is not installed")),
           pytest.param("cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(not cupy_backend.available(),
                                                                            reason="needs CuPy and a CUDA GPU")])]
"""Where the kernels run: NumPy's, the compiled ones (numba), CuPy's (the GPU form)."""


def conv_model(x_shape, w_shape, after=(), bias=True, **attrs):
    """x -> Conv(W[, B]) -> c -> `after` nodes reading "c" and ending in "a" -> a 5x5 Conv to 16 channels -> y.
    The last conv's columns are the scratch the plan holds, which a Winograd conv of a small image needs
    (its own im2col takes less than its transforms)."""
    inits = {"w": RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:])),
             "w5": RNG.standard_normal((16, w_shape[0], 5, 5)) / np.sqrt(25 * w_shape[0])}
    if bias:
        inits["b"] = RNG.standard_normal(w_shape[0])
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], **attrs), *after,
             helper.make_node("Conv", ["a" if after else "c", "w5"], ["y"], pads=[2, 2, 2, 2])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def memplan_model(node, x_shape, w):
    """A model of one memplan conv `node` reading x of `x_shape` and the float32 initializer w."""
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(w, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])


def run(model, x, engine="numpy", **options):
    plan = planner.compile(model, {"x": x.shape}, **options)
    return plan, execute(engine, plan, {"x": x})["y"]


def execute(engine, plan, feeds):
    """The plan's outputs, run once with poison on by `engine` (one of ENGINES)."""
    return run_on("cupy" if engine == "cupy" else "numpy", plan, feeds, jit=engine == "numba")


def onnxruntime(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


CASES = {  # x shape, w shape, Conv attributes
    "same, even": ((2, 16, 8, 8), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    "same, odd": ((3, 16, 7, 9), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    "valid": ((2, 24, 9, 6), (16, 24, 3, 3), {}),
    "uneven pads": ((1, 16, 5, 11), (20, 16, 3, 3), {"pads": [0, 2, 2, 1]}),
    "auto_pad": ((2, 16, 6, 5), (16, 16, 3, 3), {"auto_pad": "SAME_LOWER"}),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_winograd_changes_no_result(case, engine):
    x_shape, w_shape, attrs = CASES[case]
    model, x = conv_model(x_shape, w_shape, **attrs), RNG.standard_normal(x_shape).astype(np.float32)
    plan, got = run(model, x, engine)
    plain, want = run(model, x, engine, winograd=False, batch_conv=False)
    assert plan.steps[0].op == "WinogradConv" and plan.stats["winograd"] == 1
    assert plain.steps[0].op == "Conv" and plan.arena_bytes <= plain.arena_bytes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_f4x4_computes_the_convolution(case, engine):
    """A WinogradConv of tile 4 (F(4x4, 3x3)) with a bias, a residual Z and an activation, on images whose
    sizes are no multiple of 4 and on every kind of padding, against onnxruntime's Conv + Add + Relu."""
    x_shape, w_shape, attrs = CASES[case]
    w, b = RNG.standard_normal(w_shape) / np.sqrt(9 * w_shape[1]), RNG.standard_normal(w_shape[0]).astype(np.float32)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    conv = memplan_model(helper.make_node("Conv", ["x", "w"], ["y"], **attrs), x_shape, w)
    conv.opset_import.pop()
    z = RNG.standard_normal(onnxruntime(conv, x).shape).astype(np.float32)

    def model(*nodes):
        built = memplan_model(nodes[0], x_shape, w)
        built.graph.node.extend(nodes[1:])
        built.graph.initializer.append(numpy_helper.from_array(b, "b"))
        built.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, list(z.shape)))
        return built
    reference = model(helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                      helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["y"]))
    reference.opset_import.pop()
    winograd = model(helper.make_node("WinogradConv", ["x", "w", "b", "z"], ["y"], domain="memplan", tile=4,
                                      activation="Relu", **attrs))
    plan = planner.compile(winograd, {"x": x_shape, "z": z.shape})
    got = execute(engine, plan, {"x": x, "z": z})["y"]
    want = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "z": z})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_large_outputs_take_f4x4(engine):
    """Outputs of at least LARGE pixels a side take F(4x4, 3x3), with the results of im2col."""
    x_shape, w_shape = (2, 16, 30, 29), (24, 16, 3, 3)
    model, x = conv_model(x_shape, w_shape, pads=[1, 1, 1, 1]), RNG.standard_normal(x_shape).astype(np.float32)
    plan, got = run(model, x, engine)
    assert plan.steps[0].op == "WinogradConv" and plan.steps[0].attrs["tile"] == 4
    np.testing.assert_allclose(got, run(model, x, engine, winograd=False, batch_conv=False)[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("tile", [2, 4])
def test_given_chunks_of_images_and_blocks_of_channels(tile, engine):
    """A WinogradConv's `images` and `block` attributes: the kernel walks chunks of 2 images and blocks of 16
    output channels."""
    x_shape, w = (5, 16, 9, 10), RNG.standard_normal((40, 16, 3, 3)) * 0.1
    node = helper.make_node("WinogradConv", ["x", "w"], ["y"], domain="memplan", pads=[1, 1, 1, 1], tile=tile,
                            images=2, block=16)
    model, x = memplan_model(node, x_shape, w), RNG.standard_normal(x_shape).astype(np.float32)
    got = run(model, x, engine)[1]
    model.graph.node[0].CopyFrom(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]))
    model.opset_import.pop()
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("bias", [True, False])
def test_the_fused_epilogue_of_a_residual_and_activation(engine, bias):
    """Conv + Add(x) + Clip, as fuse_conv makes a FusedConv of them: bias, Z and activation in the epilogue."""
    after = [helper.make_node("Add", ["c", "x"], ["s"]), helper.make_node("Clip", ["s", "lo", "hi"], ["a"])]
    model = conv_model((2, 16, 6, 7), (16, 16, 3, 3), after, bias=bias, pads=[1, 1, 1, 1])
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, np.float32), k)
                                    for k, v in (("lo", -0.3), ("hi", 0.8))])
    x = RNG.standard_normal((2, 16, 6, 7)).astype(np.float32)
    plan, got = run(model, x, engine)
    assert plan.steps[0].op == "WinogradConv" and plan.steps[0].attrs["activation"] == "Clip"
    np.testing.assert_allclose(got, run(model, x, engine, winograd=False, batch_conv=False)[1], rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_small_scratch_walks_chunks_of_images_and_blocks_of_channels(engine):
    """Under a workspace limit a fraction of im2col's, the Tiling takes fewer images and output channels
    at a time."""
    x_shape, w_shape = (5, 16, 4, 4), (80, 16, 3, 3)
    model, x = conv_model(x_shape, w_shape, pads=[1, 1, 1, 1]), RNG.standard_normal(x_shape).astype(np.float32)
    config = Config(workspace_limit=150_000)
    plan, got = run(model, x, engine, config=config)
    step = plan.steps[0]
    assert step.op == "WinogradConv" and step.attrs["images"] < 5 and step.attrs["block"] < 80
    want = run(model, x, engine, config=config, winograd=False, batch_conv=False)[1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_the_arena_of_resnet50_does_not_grow():
    plans = [planner.compile("zoo:resnet50", {"input": (2, 3, 224, 224)}, winograd=w) for w in (True, False)]
    assert plans[0].stats["winograd"] == 13 and plans[1].stats["winograd"] == 0
    assert plans[0].arena_bytes <= plans[1].arena_bytes


@pytest.mark.parametrize("why, x_shape, w_shape, attrs, options", [
    ("a stride", (1, 16, 8, 8), (16, 16, 3, 3), {"strides": [2, 2]}, {}),
    ("a dilation", (1, 16, 8, 8), (16, 16, 3, 3), {"dilations": [2, 2]}, {}),
    ("groups", (1, 16, 8, 8), (16, 8, 3, 3), {"group": 2}, {}),
    ("a 5x5 kernel", (1, 16, 8, 8), (16, 16, 5, 5), {}, {}),
    ("few channels", (1, 3, 8, 8), (16, 3, 3, 3), {}, {}),
    ("training", (1, 16, 8, 8), (16, 16, 3, 3), {}, {"training": True, "loss": "mse"}),
    ("a CUDA device", (1, 16, 8, 8), (16, 16, 3, 3), {}, {"device": "cuda:0"}),
    ("fp16", (1, 16, 8, 8), (16, 16, 3, 3), {}, {"precision": "fp16"}),
])
def test_what_winograd_does_not_take_keeps_its_conv(why, x_shape, w_shape, attrs, options):
    plan = planner.compile(conv_model(x_shape, w_shape, **attrs), {"x": x_shape}, **options)
    assert "WinogradConv" not in {s.op for s in plan.steps} and plan.stats["winograd"] == 0


def test_a_winograd_conv_read_from_a_file_chooses_its_own_tiling():
    """memplan.WinogradConv without images and block: the Tiling under the workspace limit."""
    node = helper.make_node("WinogradConv", ["x", "w"], ["y"], domain="memplan", pads=[1, 1, 1, 1], activation="Relu")
    model = memplan_model(node, (2, 16, 6, 6), RNG.standard_normal((16, 16, 3, 3)) * 0.2)
    x = RNG.standard_normal((2, 16, 6, 6)).astype(np.float32)
    got = run(model, x)[1]
    model.graph.node[0].CopyFrom(helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]))
    model.graph.node.append(helper.make_node("Relu", ["c"], ["y"]))
    model.opset_import.pop()
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs, message", [({"strides": [2, 2]}, "3x3 kernel of stride and dilation 1"),
                                             ({"tile": 3}, r"F\(m x m, 3x3\) for m in \(2, 4\), got tile 3")])
def test_a_winograd_conv_of_another_kernel_is_refused_by_name(attrs, message):
    model = memplan_model(helper.make_node("WinogradConv", ["x", "w"], ["y"], domain="memplan", **attrs),
                          (1, 16, 8, 8), np.zeros((16, 16, 3, 3)))
    with pytest.raises(ShapeError, match=message):
        planner.compile(model, {"x": (1, 16, 8, 8)})


@pytest.mark.parametrize("engine", ENGINES[:2])
@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("odd", ["nan", "infinities", "huge", "past float32's squares", "weight"])
def test_values_the_transforms_would_smear_are_convolved_directly(odd, tile, engine):
    """A NaN, an infinity or a value far above the others mixes into every output of its tile under the
    transforms (NaN, or its rounding); a chunk of images holding one (the others take the transforms), or
    weights holding one, are convolved directly: onnxruntime's NaN, infinities and finite values, output by
    output."""
    x_shape, w = (5, 16, 9, 10), RNG.standard_normal((24, 16, 3, 3)) * 0.1
    x = RNG.standard_normal(x_shape).astype(np.float32)
    if odd == "weight":
        w[3, 2, 1, 1] = np.inf
    else:
        x[2, 3, 4, 5], x[4, 0, 0, 9] = {"nan": (np.nan, np.nan), "infinities": (np.inf, -np.inf),
                                        "huge": (1e12, -1e15), "past float32's squares": (1e30, -3e38)}[odd]
    node = helper.make_node("WinogradConv", ["x", "w"], ["y"], domain="memplan", pads=[1, 1, 1, 1], tile=tile,
                            images=2, block=16)
    model = memplan_model(node, x_shape, w)
    got = run(model, x, engine)[1]
    model.graph.node[0].CopyFrom(helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]))
    model.opset_import.pop()
    assert_same(got, onnxruntime(model, x), atol=1e-4)
