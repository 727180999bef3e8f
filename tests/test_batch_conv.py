"""The batch_conv pass (memplan.BatchedConv): inference convolutions of small images are one GEMM over a chunk
of images, and the results stay those of the per-image GEMMs and onnxruntime, with the NumPy kernels and the
compiled ones, pointwise or not, with a residual and an activation, in whole batches and in chunks; the arena
never grows; what it does not take (one image, large images, groups, training, a CUDA device) keeps its Conv."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from planner.config import Config
from planner.errors import ShapeError
from test_winograd import ENGINES, memplan_model, onnxruntime
from test_winograd import run as run_on_engine

RNG = np.random.default_rng(12)
ENGINES = [*ENGINES, pytest.param("numba, MKL off", marks=ENGINES[1].marks)]
"""ENGINES and the compiled kernels with MKL switched off: where MKL runs, they compute a BatchedConv as the
conv it was made from, in lanes; without it, by its own columns and write-back."""


def run(model, x, engine="numpy", **options):
    """test_winograd.run, "numba, MKL off" the compiled kernels with executor.mkl switched off."""
    from contextlib import nullcontext

    from executor import mkl
    with mkl.switched_off() if engine == "numba, MKL off" else nullcontext():
        return run_on_engine(model, x, "numba" if engine.startswith("numba") else engine, **options)


def conv_model(x_shape, w_shape, after=(), **attrs):
    """x -> Conv(W, B) -> c -> `after` (reading "c", ending in "a") -> a 5x5 Conv of 64 channels -> y, whose
    columns are the slot of scratch the BatchedConv needs."""
    inits = {"w": RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:])), "b": RNG.standard_normal(w_shape[0]),
             "w5": RNG.standard_normal((64, w_shape[0], 5, 5)) / np.sqrt(25 * w_shape[0])}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), *after,
             helper.make_node("Conv", ["a" if after else "c", "w5"], ["y"], pads=[2, 2, 2, 2])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = {  # x shape, w shape (2^19 weights or more: batch_conv.LARGE), Conv attributes
    "pointwise": ((3, 1024, 7, 7), (512, 1024, 1, 1), {}),
    "strided pointwise": ((2, 512, 13, 14), (1024, 512, 1, 1), {"strides": [2, 2]}),
    "3x3 stride 2": ((2, 256, 13, 14), (256, 256, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "3x3 same": ((2, 256, 6, 5), (256, 256, 3, 3), {"pads": [1, 1, 1, 1]}),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_batched_conv_changes_no_result(case, engine):
    x_shape, w_shape, attrs = CASES[case]
    model, x = conv_model(x_shape, w_shape, **attrs), RNG.standard_normal(x_shape).astype(np.float32)
    plan, got = run(model, x, engine, winograd=False)
    plain, want = run(model, x, engine, winograd=False, batch_conv=False)
    assert plan.steps[0].op == "BatchedConv" and plan.stats["batched_conv"] >= 1
    assert plain.steps[0].op == "Conv" and plan.arena_bytes <= plain.arena_bytes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_residual_and_activation_are_applied_on_the_way_back(engine):
    after = [helper.make_node("Add", ["c", "x"], ["s"]), helper.make_node("Relu", ["s"], ["a"])]
    model = conv_model((3, 1024, 6, 6), (1024, 1024, 1, 1), after)
    x = RNG.standard_normal((3, 1024, 6, 6)).astype(np.float32)
    plan, got = run(model, x, engine)
    assert plan.steps[0].op == "BatchedConv" and plan.steps[0].attrs["activation"] == "Relu"
    np.testing.assert_allclose(got, run(model, x, engine, batch_conv=False)[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, onnxruntime(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_small_scratch_walks_chunks_of_images(engine):
    model, x = conv_model((7, 1024, 7, 7), (512, 1024, 1, 1)), RNG.standard_normal((7, 1024, 7, 7)).astype(np.float32)
    config = Config(workspace_limit=1_000_000)
    plan, got = run(model, x, engine, config=config)
    assert plan.steps[0].op == "BatchedConv" and 2 <= plan.steps[0].attrs["images"] < 7
    np.testing.assert_allclose(got, run(model, x, engine, config=config, batch_conv=False)[1], rtol=1e-5, atol=1e-5)


def test_resnet50_batches_its_last_stage_in_the_same_arena():
    plans = [planner.compile("zoo:resnet50", {"input": (4, 3, 224, 224)}, batch_conv=b) for b in (True, False)]
    assert plans[0].stats["batched_conv"] == 7 and plans[1].stats["batched_conv"] == 0
    assert plans[0].arena_bytes <= plans[1].arena_bytes


@pytest.mark.parametrize("why, x_shape, w_shape, attrs, options", [
    ("one image", (1, 1024, 7, 7), (512, 1024, 1, 1), {}, {}),
    ("large images", (2, 1024, 9, 9), (512, 1024, 1, 1), {}, {}),
    ("few weights", (2, 160, 7, 7), (960, 160, 1, 1), {}, {}),
    ("groups", (2, 1024, 7, 7), (1024, 512, 1, 1), {"group": 2}, {}),
    ("training", (2, 1024, 7, 7), (512, 1024, 1, 1), {}, {"training": True, "loss": "mse"}),
    ("a CUDA device", (2, 1024, 7, 7), (512, 1024, 1, 1), {}, {"device": "cuda:0"}),
])
def test_what_batch_conv_does_not_take_keeps_its_conv(why, x_shape, w_shape, attrs, options):
    plan = planner.compile(conv_model(x_shape, w_shape, **attrs), {"x": x_shape}, **options)
    assert plan.steps[0].op == "Conv" and plan.stats["batched_conv"] == 0


def test_a_batched_conv_of_groups_is_refused_by_name():
    model = memplan_model(helper.make_node("BatchedConv", ["x", "w"], ["y"], domain="memplan", group=2),
                          (2, 16, 4, 4), np.zeros((16, 8, 1, 1)))
    with pytest.raises(ShapeError, match="BatchedConv takes one group"):
        planner.compile(model, {"x": (2, 16, 4, 4)})


@pytest.mark.parametrize("form", ["winograd", "batched"])
def test_the_gpu_form_is_the_fused_conv_in_the_same_scratch(form, monkeypatch):
    """CuPy runs WinogradConv and BatchedConv as the FusedConv they were (executor.kernels.nn.as_fused_conv),
    its columns cut from their scratch: run here on NumPy, it gives the per-image im2col's results."""
    from executor.backends import numpy_backend
    from executor.kernels import KERNELS, nn
    x_shape, w_shape, attrs = ((4, 32, 9, 9), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}) if form == "winograd" else \
        ((3, 1024, 7, 7), (512, 1024, 1, 1), {})
    model, x = conv_model(x_shape, w_shape, **attrs), RNG.standard_normal(x_shape).astype(np.float32)
    want = run(model, x, winograd=False, batch_conv=False)[1]
    table = {**KERNELS, ("memplan", "WinogradConv"): nn.as_fused_conv, ("memplan", "BatchedConv"): nn.as_fused_conv}
    monkeypatch.setattr(numpy_backend, "table", lambda jit=None: table)
    plan, got = run(model, x)
    assert plan.steps[0].op == {"winograd": "WinogradConv", "batched": "BatchedConv"}[form]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
