"""planner.passes: each pass of the pipelines leaves the graph typed exactly as full shape inference
would (shapes.retype), the pipelines make what planner.load and compile made before, and the runner
refuses a pass whose needs are not met."""
from dataclasses import replace

import numpy as np
import pytest

import planner
from frontends import read
from frontends import symbol as S
from planner import CompileOptions, Config, PlanError, passes, shapes
from planner.ir import Node, Tensor
from zoo_cases import input_shapes, small_model

RNG = np.random.default_rng(0)


def signature(graph):
    """Everything a pass's result is: nodes (names, ops, edges, attrs, annotations) and typed tensors."""
    nodes = [(n.name, n.domain, n.op, n.inputs, n.outputs, repr(n.attrs), n.notes) for n in graph.nodes]
    tensors = [(t.name, t.shape, t.dtype, t.kind, None if t.data is None else t.data.tobytes())
               for t in graph.tensors.values()]
    return nodes, tensors, graph.inputs, graph.outputs, graph.updates


def dropout_mlp():
    x = S.var("x", ("batch", 6))
    h = S.op("Relu", S.op("Gemm", x, S.param("w1", RNG.standard_normal((6, 8)).astype(np.float32))))
    h = S.dropout(h, ratio=0.25)
    return S.op("Gemm", h, S.param("w2", RNG.standard_normal((8, 3)).astype(np.float32)))


MODELS = {"mlp": small_model("mlp"), "resnet18": small_model("resnet18"), "dropout": dropout_mlp()}
OPTIONS = [dict(optimizer="adam"), dict(optimizer="momentum", update="after_backward"),
           dict(optimizer="sgd", loss="mse", config=replace(Config(), inplace_update=False))]


def shapes_of(name):
    return {"x": (2, 6)} if name == "dropout" else input_shapes(MODELS[name], 2)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o["optimizer"])
def test_every_training_pass_types_as_full_inference_does(name, options):
    options = CompileOptions(training=True, **{"config": Config(), **options})
    pipeline, context = passes.pipeline(options), passes.Context(shapes_of(name))
    for k, step in enumerate(pipeline):
        graph, _ = passes.run(pipeline[:k + 1], read(MODELS[name]), context)
        assert all(t.is_static for t in graph.tensors.values()), step.name
        assert signature(shapes.infer(graph, pruned=False)) == signature(graph), step.name


def test_retype_folds_and_prunes_as_infer_does():
    graph = planner.load(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    out = graph.outputs[0]
    ones = Node("ConstantOfShape", (), ("ones",), {"shape": [1], "value": np.ones(1, np.float32)}, "ones")
    scale = Node("Mul", (out, "ones2"), ("scaled",), {}, "scale")
    shape = Node("Shape", (out,), ("shape",), {}, "shape")
    wide = Node("Expand", ("ones", "shape"), ("ones2",), {}, "expand")
    dead = Node("Neg", (out,), ("dead",), {}, "dead")
    tensors = {**graph.tensors, **{n: Tensor(n, None, None, "activation") for n in ("ones", "ones2", "shape", "dead")},
               "scaled": Tensor("scaled", None, None, "output")}
    rewritten = replace(graph, nodes=(*graph.nodes, ones, shape, wide, scale, dead), tensors=tensors,
                        outputs=("scaled",))
    assert signature(shapes.retype(rewritten, graph)) == signature(shapes.infer(rewritten))


def test_load_is_the_loading_pipeline_and_compile_rewrites_after_it():
    """load's graph is the model's own (its BatchNormalizations stay, so it trains); compile's inference
    pipeline rewrites it (folds them)."""
    model, shapes = small_model("resnet18"), input_shapes(small_model("resnet18"), 2)
    graph, facts = passes.run(passes.LOADING, read(model), passes.Context(input_shapes=shapes))
    assert facts == {} and signature(graph) == signature(planner.load(model, shapes))
    folded, _ = passes.run(passes.pipeline(CompileOptions()), read(model), passes.Context(input_shapes=shapes))
    assert any(n.op == "BatchNormalization" for n in graph.nodes)
    assert not any(n.op == "BatchNormalization" for n in folded.nodes)


def test_a_pass_needs_what_it_reads():
    model = small_model("mlp")
    with pytest.raises(PlanError, match="pass 'gradients' needs a graph typed, with a loss"):
        passes.run([passes.gradients()], read(model))
    with pytest.raises(PlanError, match="pass 'optimizer' needs a graph with gradients"):
        passes.run([passes.infer_shapes, passes.optimizer()], read(model),
                   passes.Context(input_shapes=input_shapes(model, 2)))


def test_prune_says_whether_it_changed_the_graph():
    graph = planner.load(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    assert passes.prune.apply(graph, passes.Context()).modified is False
    dead = Node("Neg", (graph.outputs[0],), ("dead",), {}, "dead")
    grown = replace(graph, nodes=(*graph.nodes, dead), tensors={**graph.tensors, "dead": graph.tensors[graph.outputs[0]]})
    assert passes.prune.apply(grown, passes.Context()).modified is True


def test_compile_takes_options_or_keywords_alike():
    model = small_model("mlp")
    shapes_ = input_shapes(model, 2)
    options = CompileOptions(strategy="share", training=True, optimizer="adam")
    by_options = planner.compile(model, shapes_, options)
    by_keywords = planner.compile(model, shapes_, strategy="share", training=True, optimizer="adam")
    over = planner.compile(model, shapes_, CompileOptions(strategy="naive", training=True), strategy="share",
                           optimizer="adam")
    for plan in (by_keywords, over):
        assert (plan.arena_bytes, plan.steps, {n: t.offset for n, t in plan.tensors.items()}) == \
            (by_options.arena_bytes, by_options.steps, {n: t.offset for n, t in by_options.tensors.items()})
    assert by_options.training["optimizer"] == "adam" and by_options.training["remat"]["remat"] is None


@pytest.mark.parametrize("keywords,error,message", [
    ({"strategy": "greedy"}, PlanError, "unknown strategy 'greedy'; choose one of naive, inplace"),
    ({"schedule": "random"}, PlanError, "unknown schedule 'random'"),
    ({"optimizer": "adam"}, PlanError, "apply to training=True"),
    ({"training": True, "optimizer": "rmsprop"}, planner.ModelError, "unknown optimizer 'rmsprop'"),
    ({"training": True, "update": "later"}, planner.ModelError, "unknown update 'later'"),
    ({"training": True, "optimizer_args": {"lr": -1}}, planner.ConfigError, "lr=-1 is invalid"),
    ({"stratgy": "share"}, TypeError, "unknown options stratgy"),
])
def test_options_are_checked_before_any_model_is_read(keywords, error, message):
    with pytest.raises(error, match=message):
        planner.compile("no-such-file.onnx", None, **keywords)


def test_annotations_convert_to_and_from_metadata_in_one_place():
    from planner.ir import Annotations
    notes = Annotations.from_metadata({"force_mirroring": "True", "mirror_stage": "s1"})
    assert notes == Annotations(force_mirroring=True, mirror_stage="s1") and notes.forward
    assert Annotations.from_metadata(notes.metadata()) == notes
    assert Annotations.from_metadata({"force_mirroring": "0"}).metadata() == {}
    with pytest.raises(planner.ModelError, match="node 'n' has annotations 'force_mirorring'"):
        Annotations.from_metadata({"force_mirorring": "1"}, "node 'n'")


def test_plans_carry_their_device_and_rank(tmp_path):
    """device and rank are options recorded in the plan and its file; bad values are PlanErrors."""
    plan = planner.compile("zoo:mlp", {"input": (2, 784)}, device="cuda:1", rank=3)
    assert (plan.device, plan.rank) == ("cuda:1", 3)
    assert planner.compile("zoo:mlp", {"input": (2, 784)}).device == "any"
    back = planner.Plan.from_json(plan.to_json(tmp_path / "plan.json"))
    assert (back.device, back.rank, back.opsets) == ("cuda:1", 3, plan.opsets)
    for bad in (dict(rank=-1), dict(rank=True), dict(device=""), dict(device="gpu"), dict(device="cuda:x")):
        with pytest.raises(planner.PlanError, match="rank|device"):
            planner.compile("zoo:mlp", {"input": (2, 784)}, **bad)


@pytest.mark.parametrize("batch", [2, 4], ids=["same types", "other shape"])
def test_retype_keeps_a_renamed_reader_only_where_the_new_tensor_has_the_old_ones_type(batch):
    """A node pointed at another tensor keeps its outputs' types when that tensor has the type of the one
    it replaces; of another shape, the node and those after it are inferred again, and meet the shapes
    the graph declares, as infer does."""
    graph = planner.load(small_model("mlp"), input_shapes(small_model("mlp"), 2))
    first, x = graph.nodes[0], graph.nodes[0].inputs[0]
    copy = Node("Concat", (x,) * (batch // 2), ("x2",), {"axis": 0}, "copy")
    rewritten = replace(graph, nodes=(copy, replace(first, inputs=("x2", *first.inputs[1:])), *graph.nodes[1:]),
                        tensors={**graph.tensors, "x2": Tensor("x2", None, None, "activation")})
    if batch == 2:
        assert signature(shapes.retype(rewritten, graph)) == signature(shapes.infer(rewritten))
        return
    with pytest.raises(planner.ShapeError, match=r"declared with shape \(2, 16\) but computes to \(4, 16\)"):
        shapes.infer(rewritten)
    with pytest.raises(planner.ShapeError, match=r"declared with shape \(2, 16\) but computes to \(4, 16\)"):
        shapes.retype(rewritten, graph)


def test_recomputed_clones_are_typed_as_inference_types_them():
    """replay types each clone as its source instead of inferring it: the same types full inference gives."""
    from planner.remat.recompute import droppable, recompute
    pipeline = passes.pipeline(CompileOptions(training=True, optimizer="adam", config=Config()))
    model = small_model("resnet18")
    before = [p.name for p in pipeline].index("recomputation")
    graph, _ = passes.run(pipeline[:before], read(model), passes.Context(input_shapes(model, 2)))
    rewritten = recompute(graph, droppable(graph))
    assert any(n.notes.recompute for n in rewritten.nodes)
    assert signature(shapes.infer(rewritten, pruned=False)) == signature(rewritten)
