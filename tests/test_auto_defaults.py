"""Defaults that reach the optimum: the "auto" strategy (best fit, then the exact search within a count of
effort), the "auto" workspace mode (the smaller of pooled slots and one-step tensors), and mirror recomputation
that never plans more than none."""
import random

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from frontends import zoo
from planner import CompileOptions, Config
from planner.allocators import allocate, lower_bound
from planner.allocators.bestfit import bestfit
from planner.allocators.exact import AUTO_PLACEMENTS
from test_allocators import U, check
from zoo_cases import input_shapes, small_model

POOLED = Config(workspace_mode="pool")


def test_the_defaults_are_auto():
    assert CompileOptions().strategy == "auto" and Config().workspace_mode == "auto"
    plan = planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    assert plan.strategy == "auto" and plan.stats["allocator"] == "auto"


def test_auto_reaches_load_where_best_fit_does_not():
    model, shapes = zoo.build("lenet"), {"input": (8, 1, 28, 28)}
    fit = planner.compile(model, shapes, training=True, strategy="bestfit", config=POOLED)
    auto = planner.compile(model, shapes, training=True, config=POOLED)
    assert fit.lower_bound_bytes == auto.lower_bound_bytes < fit.arena_bytes
    assert auto.arena_bytes == auto.lower_bound_bytes
    assert auto.stats["allocator_proof"]["by"] == "exact" and auto.stats["allocator_proof"]["optimal"]


@pytest.mark.parametrize("n", [60, 150])
def test_auto_is_never_above_best_fit_and_counts_its_effort(n):
    rng = random.Random(n)
    sizes = [rng.randint(1, 200) * U for _ in range(n)]
    starts = [rng.randrange(60) for _ in range(n)]
    ends = [s + rng.randrange(20) for s in starts]
    report = {}
    offsets, total = allocate("auto", sizes, starts, ends, U, report=report)
    check(sizes, starts, ends, offsets, total)
    assert lower_bound(sizes, starts, ends, U) <= total <= bestfit(sizes, starts, ends, U)[1]
    assert report["effort"] <= AUTO_PLACEMENTS * n * (n + 1) // 2
    assert allocate("auto", sizes, starts, ends, U) == (offsets, total)


def test_auto_leaves_a_plan_too_large_to_search_to_best_fit():
    n = 2100  # one placement of every buffer would take more effort than the cap
    sizes, starts, ends = [U * (1 + i % 7) for i in range(n)], list(range(n)), [i + 3 for i in range(n)]
    report = {}
    assert allocate("auto", sizes, starts, ends, U, report=report) == tuple(bestfit(sizes, starts, ends, U))
    assert report["by"] == "bestfit" and report["effort"] == 0


@pytest.mark.parametrize("case, batch", [("densenet121", 2), ("lenet", 8), ("resnet18", 2)])
def test_the_auto_workspace_mode_keeps_the_smaller_arena(case, batch):
    model = small_model(case)
    shapes = input_shapes(model, batch)
    plans = {mode: planner.compile(model, shapes, training=True, strategy="bestfit",
                                   config=Config(workspace_mode=mode)) for mode in ("pool", "tensor", "auto")}
    smaller = min(("pool", "tensor"), key=lambda mode: (plans[mode].arena_bytes, mode != "pool"))
    assert plans["auto"].arena_bytes == plans[smaller].arena_bytes
    assert plans["auto"].stats["workspace"]["mode"] == smaller


def bottleneck(width=4, size=32):
    """One ResNet bottleneck as PyTorch's inference export writes it: BatchNorm folded into the convolutions, whose
    equal biases the exporter shares through Identity nodes. Mirror recomputes its Relus and plans more than none
    (as resnet50's inference export at batch 8: 525.41 against 495.70 MiB)."""
    rng = np.random.default_rng(0)
    wide = 4 * width
    shapes = {"w0": (wide, 3, 3, 3), "w1": (width, wide, 1, 1), "w2": (width, width, 3, 3), "w3": (wide, width, 1, 1),
              "fc": (10, wide)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.1).astype(np.float32), n) for n, s in shapes.items()]
    inits += [numpy_helper.from_array(np.zeros(shapes[n][0], np.float32), f"b{n}") for n in ("w0", "w1", "fc")]

    def conv(x, w, bias, y, **attrs):
        return helper.make_node("Conv", [x, w, bias], [y], name=y, **attrs)

    def relu(x, y):
        return helper.make_node("Relu", [x], [y], name=y)
    nodes = [helper.make_node("Identity", ["bw0"], ["bw3"], name="bw3"),
             helper.make_node("Identity", ["bw1"], ["bw2"], name="bw2"),
             conv("x", "w0", "bw0", "c0", pads=[1] * 4), relu("c0", "r0"),
             conv("r0", "w1", "bw1", "c1"), relu("c1", "r1"),
             conv("r1", "w2", "bw2", "c2", pads=[1] * 4), relu("c2", "r2"), conv("r2", "w3", "bw3", "c3"),
             helper.make_node("Add", ["c3", "r0"], ["s"], name="s"), relu("s", "r3"),
             helper.make_node("GlobalAveragePool", ["r3"], ["p"], name="p"),
             helper.make_node("Flatten", ["p"], ["f"], name="f"),
             helper.make_node("Gemm", ["f", "fc", "bfc"], ["y"], name="y", transB=1)]
    graph = helper.make_graph(nodes, "bottleneck", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_mirror_falls_back_to_none_where_it_would_plan_more():
    model, shapes = bottleneck(), {"x": (1, 3, 32, 32)}
    none = planner.compile(model, shapes, training=True, strategy="bestfit", config=POOLED)
    mirror = planner.compile(model, shapes, training=True, strategy="bestfit", config=POOLED, remat="mirror")
    fallback = mirror.training["remat"]["fallback"]
    assert mirror.arena_bytes == none.arena_bytes == fallback["none_arena_bytes"] < fallback["mirror_arena_bytes"]
    assert fallback["to"] == "none" and mirror.training["remat"]["recomputed"] == []
    assert mirror.stats["recompute_flops"] == 0


@pytest.mark.parametrize("strategy", ["bestfit", "auto"])
@pytest.mark.parametrize("mode", ["pool", "auto"])
def test_mirror_never_plans_more_than_none(strategy, mode):
    model, shapes = bottleneck(), {"x": (1, 3, 32, 32)}
    options = dict(training=True, strategy=strategy, config=Config(workspace_mode=mode))
    assert planner.compile(model, shapes, remat="mirror", **options).arena_bytes <= \
        planner.compile(model, shapes, **options).arena_bytes


def test_mirror_keeps_its_plan_where_it_is_smaller():
    model = small_model("resnet_deep")
    shapes = input_shapes(model, 2)
    none = planner.compile(model, shapes, training=True)
    mirror = planner.compile(model, shapes, training=True, remat="mirror")
    assert mirror.arena_bytes < none.arena_bytes and "fallback" not in mirror.training["remat"]
    assert mirror.training["remat"]["recomputed"]
