"""planner.passes.pipeline: the passes compile runs, built once from the CompileOptions with their settings,
and what each pass ensures, checked right after it on zoo graphs under several settings."""
from dataclasses import replace
from types import MappingProxyType

import ml_dtypes
import numpy as np
import pytest

import planner
from frontends import read
from frontends import symbol as S
from planner import CompileOptions, Config, Parallel, PlanError, passes, planning
from planner.generation import Generation
from planner.options import Device, Precision
from zoo_cases import input_shapes, small_model

CASES = {  # name: (zoo case, options, the passes that find work there)
    "resnet18 inference": ("resnet18", dict(), {"fold_batchnorm", "fuse_conv", "winograd"}),
    "mobilenet_v2 inference": ("mobilenet_v2", dict(), {"fold_batchnorm", "fuse_conv"}),
    "gpt2 inference": ("gpt2_small", dict(), {"fuse_attention", "fuse_norm", "fuse_activation"}),
    "bert fp16": ("bert_base", dict(precision="fp16"), {"fuse_attention", "precision"}),
    "resnet18 adam mirror": ("resnet18", dict(training=True, optimizer="adam", remat="mirror"), {"training_mode"}),
    "gpt2 amp-fp16": ("gpt2_small", dict(training=True, precision="amp-fp16"), {"precision"}),
    "gpt2 dp2 zero3 tp2": ("gpt2_small", dict(training=True, parallel=Parallel(dp=2, zero=3, tp=2)),
                           {"tensor_parallel", "data_parallel"}),
    "mlp stage 0 of 2": ("mlp", dict(training=True, parallel=Parallel(pp=2, microbatches=2)), set()),
    "mlp amp-bf16 zero1 buckets": ("mlp", dict(training=True, precision="amp-bf16", parallel=Parallel(
        dp=2, zero=1, bucket_bytes=1 << 10)), {"precision", "data_parallel"}),
}


def stepwise(options, model, shapes):
    """Run `options`' pipeline on `model` one pass at a time: (pass, graph before, graph after, facts after,
    the properties `run` tracks after it) for each."""
    def measure(graph, facts):
        return planning.measure(graph, options.strategy, options.orders, options.config, (), facts)
    graph, facts, properties = read(model), {}, frozenset()
    for step in passes.pipeline(options):
        context = passes.Context(shapes, MappingProxyType(facts), measure)
        after, found = passes.run([step], graph, context, properties)
        facts = {**facts, **found}
        properties = (properties & step.keeps) | step.makes
        yield step, graph, after, facts, properties
        graph = after


@pytest.mark.parametrize("case", CASES)
def test_every_pass_ensures_what_it_says(case):
    """After each pass, what it makes and ensures and what it keeps of what was there hold; and where the
    case gives a pass work, what it ensures did not hold before it (the check sees the difference)."""
    name, options, work = CASES[case]
    model = small_model(name)
    worked = set()
    for step, before, graph, facts, properties in stepwise(CompileOptions(config=Config(), **options), model,
                                                           input_shapes(model, 2)):
        assert step.makes | step.ensures, f"{step.name} states nothing it ensures"
        for prop in properties | step.ensures:
            assert prop.holds(graph, facts), f"after {step.name}, the graph is not {prop}"
        if step.name in work and not all(p.holds(before, facts) for p in step.ensures):
            worked.add(step.name)
    assert worked == work


def test_a_property_that_fails_is_seen():
    graph = planner.load(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    dead = planner.Node("Neg", (graph.outputs[0],), ("dead",), {}, "dead")
    grown = replace(graph, nodes=(*graph.nodes, dead), tensors={**graph.tensors, "dead": graph.tensors[graph.outputs[0]]})
    assert passes.PRUNED.holds(graph, {}) and not passes.PRUNED.holds(grown, {})
    assert not passes.LOSS.holds(graph, {}) and not passes.UPDATES.holds(graph, {"params": ["w"]})


def names(**options):
    return [p.name for p in passes.pipeline(CompileOptions(config=Config(), **options))]


LOADING = ["infer_shapes", "decompose", "simplify", "prune"]
FUSIONS = ["fuse_attention", "fold_repeat_kv", "fuse_norm", "fuse_activation", "fold_transpose"]
CPU = ["inverted_residual", "winograd", "batch_conv"]


@pytest.mark.parametrize("options,expected", [
    ({}, [*LOADING, "fold_batchnorm", "fuse_conv", *FUSIONS, "pretranspose", *CPU, "transpose_view", "prune"]),
    (dict(device="cuda:0", precision="bf16"), [*LOADING, "fold_batchnorm", "fuse_conv", *FUSIONS, "pretranspose",
                                               "precision", "transpose_view", "prune"]),
    (dict(device="cpu", fuse_attention=False, winograd=False, fold_batchnorm=False),
     [*LOADING, "fuse_conv", *FUSIONS[2:], "pretranspose", "inverted_residual", "batch_conv", "transpose_view",
      "prune"]),
    (dict(generation=Generation(tokens=1)), [*LOADING, "fold_batchnorm", "fuse_conv", *FUSIONS, "pretranspose", *CPU,
                                             "transpose_view", "kv_cache", "next_token", "prune"]),
    (dict(training=True), [*LOADING, "check_names", *FUSIONS, "transpose_view", "prune", "training_mode", "loss",
                           "gradients", "optimizer", "recomputation"]),
    (dict(training=True, parallel=Parallel(dp=2, tp=2, pp=2)),
     [*LOADING, "check_names", *FUSIONS, "transpose_view", "prune", "tensor_parallel", "training_mode", "loss",
      "gradients", "optimizer", "pipeline_cut", "pipeline_stage", "recomputation", "data_parallel"]),
], ids=["inference", "cuda bf16", "some off", "generation", "training", "3-D parallel"])
def test_the_pipeline_holds_the_passes_the_options_turn_on(options, expected):
    assert names(**options) == expected


def test_passes_take_their_settings_when_built():
    """A pass holds the settings it was built with; none reads options from its context."""
    assert not hasattr(passes.Context(), "options")
    y = S.op("Relu", S.op("Identity", S.var("x", ("batch", 3))))
    graph, context = read(y), passes.Context({"x": (2, 3)})
    (kept,) = [n.outputs[0] for n in graph.nodes if n.op == "Identity"]
    for keep, left in (((), 0), ((kept,), 1)):
        simplified, _ = passes.run([passes.infer_shapes, passes.simplify(keep)], graph, context)
        assert sum(n.op == "Identity" for n in simplified.nodes) == left


@pytest.mark.parametrize("text,kind,index,gpu", [("any", "any", None, False), ("cpu", "cpu", None, False),
                                                 ("cuda", "cuda", None, True), ("cuda:3", "cuda", 3, True)])
def test_a_device_is_parsed_once(text, kind, index, gpu):
    device = CompileOptions(device=text).device
    assert (device.kind, device.index, device.is_gpu, str(device)) == (kind, index, gpu, text)
    assert CompileOptions(device=device) == CompileOptions(device=text)


@pytest.mark.parametrize("bad", ["", "gpu", "cuda:", "cuda:-1", "any:0", "cuda:٣", None, 0])
def test_a_device_that_is_none_is_refused(bad):
    with pytest.raises(PlanError, match='device must name a device \\("any", "cpu", "cuda" or "cuda:N"\\)'):
        CompileOptions(device=bad)


def test_a_precision_says_what_it_means():
    table = {p.value: (p.low, p.mixed, p.scales_loss) for p in Precision}
    half, brain = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
    assert table == {"fp32": (None, False, False), "fp16": (half, False, False), "bf16": (brain, False, False),
                     "amp-fp16": (half, True, True), "amp-bf16": (brain, True, False)}
    assert CompileOptions(precision="amp-fp16").precision is Precision.AMP_FP16
    assert Device.parse(Device("cuda", 1)) == Device("cuda", 1)
