"""planner.compile: from a model to a verified Plan. The passes of a pipeline (planner.passes) make the
typed graph of inference or of a training step, and planner.planning plans it in each schedule order
(keeping the smallest arena) before the Plan is verified.
"""
import sys
import time
from dataclasses import replace
from types import MappingProxyType

from . import allocators, forked, generation, ops, passes, planning
from .config import Config
from .errors import PlanError
from .options import SCHEDULES, STRATEGIES, CompileOptions
from .passes.fold_transpose import SUFFIX as FOLDED
from .passes.pretranspose import SUFFIX as PRETRANSPOSED
from .plan import ALIGNMENT
from .planning import plan_graph, smallest_plan

__all__ = ["compile", "compile_stages", "split", "plan_graph", "CompileOptions", "STRATEGIES", "SCHEDULES"]


def compile(model, input_shapes=None, options=None, **keywords):
    """Plan `model` (a path, onnx.ModelProto, Symbol, typed Graph or "zoo:NAME") into one arena.

    `options` is a CompileOptions; `keywords` (its field names) set options over it, so
    `compile(model, shapes, strategy="share")` and `compile(model, shapes, CompileOptions(strategy="share"))`
    are the same plan.

    `schedule="auto"` plans both the file's order and the memory-aware one and keeps the smaller
    arena. `fetch` names intermediate tensors the caller wants to read after the run; like graph
    outputs they live to the end and are never overwritten.

    `training=True` plans one training step (planner.training): `loss` ("cross_entropy" or "mse") on
    `loss_output` (default the first output), gradients of the params PyTorch would train (not the
    numbers of the model's code, nor the `frozen` names; `trainable` names train whatever their use;
    plan.training["constants"] says why each other initializer stays), and `optimizer` ("sgd",
    "momentum", "adam", "adamw") with `optimizer_args`, each param updated in place as soon as its
    gradient is complete (`update="eager"`) or after the backward pass. cross_entropy reads the classes
    on `class_axis` (default: dim 1, or the last dim of a language model's (batch, seq, vocab) logits;
    see planner.losses) and skips labels equal to `ignore_index` (PyTorch's -100; None for none).
    `remat` ("mirror", "sublinear", "budget", "optimal", "selective", "full", see planner.remat) recomputes
    forward tensors in backward instead of keeping them ("swap" and "hybrid" copy them to host memory);
    `memory_budget` (bytes) asks for the least recomputation whose arena fits it (remat="budget";
    InfeasibleBudgetError when none does). MXNET_BACKWARD_DO_MIRROR=1 means "mirror". `offload="optimizer"`
    holds the optimizer's state and master weights in host memory and updates there (ZeRO-Offload,
    planner/passes/offload.py).

    `precision` ("fp32", "fp16", "bf16", "amp-fp16", "amp-bf16", see planner.precision) plans in that
    type. The graph rewrites (planner/passes/) are on by default; False keeps the exported form:
    `fuse_attention`, `fuse_norm`, `fuse_activation`, `fold_transpose`, and for inference `fold_batchnorm`,
    `fuse_conv`, `pretranspose`, and (not in plans for a CUDA `device`) `inverted_residual`, `winograd` and
    `batch_conv`.
    plan.stats counts the fused ops.

    A model whose weights are absent (an export on PyTorch's meta device: typed, shaped weights without data;
    `weights=False` for external data not to be read) is planned as with them, its params counted and
    trained as params; `plan.weights_absent` names them, and no Executor runs it.
    """
    from frontends import read
    start = time.perf_counter()
    options = _configured(CompileOptions.of(options, **keywords))
    if options.generation is not None:
        return _generation(model, input_shapes, options, start)
    model = read(model, options.weights, options.training)
    pipeline = passes.pipeline(options)
    graph, facts = passes.run(pipeline, model, _context(options, input_shapes, pipeline))
    return _planned(graph, facts, options, start)


def _generation(model, input_shapes, options, start):
    """The GenerationPlan of a model read with a cache: each step's passes, their shared tensors placed alike."""
    from frontends import hf_config, read
    if input_shapes:
        raise PlanError("a plan with generation= takes its input shapes from the Generation, not input_shapes")
    exports = hf_config.is_config(model)  # a config is exported for each step's shapes, else read once
    whole = None if exports else read(model, options.weights)
    found = []
    for step in generation.ENTRIES:
        staged = replace(options, generation=options.generation.entries()[step])
        g = staged.generation
        graph = read(model, options.weights, step=(g.tokens, g.max_length)) if exports else whole
        pipeline = passes.pipeline(staged)
        found.append(passes.run(pipeline, graph, _context(staged, g.input_shapes(graph), pipeline)))
    graphs = generation.shared([graph for graph, _ in found])
    plans = [_planned(graph, facts, options, start) for graph, (_, facts) in zip(graphs, found)]
    return generation.GenerationPlan(options.generation, *plans, found[1][1]["kv_cache"]["caches"]).verify()


def compile_stages(model, input_shapes=None, options=None, *, stages=None, workers=1, **keywords):
    """Each pipeline stage's plan of a training step under `options.parallel` (pp stages; one plan without),
    as compile makes it, yielded stage by stage (the indices `stages`, in their order; default all): the
    passes before the cut run once for all of them. With `workers` > 1 (and fork, on Linux) the stages are
    planned in that many forked processes at once, as the planner is pure Python and a stage is independent
    of the others; not from a daemonic process (a `memplan fit` worker), which may have none."""
    from frontends import read
    start = time.perf_counter()
    options = _configured(CompileOptions.of(options, **keywords))
    parallel = options.parallel
    if not options.training or parallel is None or parallel.pp == 1:
        yield compile(model, input_shapes, options)
        return
    pipeline = passes.pipeline(options)
    cut = [p.name for p in pipeline].index("pipeline_stage")
    model = read(model, options.weights, options.training)
    whole, facts = passes.run(pipeline[:cut], model, _context(options, input_shapes, pipeline))

    def planned(stage):
        staged = replace(options, parallel=replace(parallel, stage=stage))
        steps = passes.pipeline(staged)
        context = replace(_context(staged, input_shapes, steps), facts=MappingProxyType(facts))
        graph, found = passes.run(steps[cut:], whole, context, STEP)
        return _planned(graph, found, staged, start)

    yield from forked.mapped(planned, list(range(parallel.pp) if stages is None else stages), workers)


def split(model, input_shapes=None, options=None, **keywords):
    """Check that compile can split `model` as `options.parallel` says, in the time of the passes alone: they run
    as far as the tensor-parallel split and the pipeline cut (not the planning) and raise what compile would
    raise there (memplan fit asks which sizes split a model before it plans their layouts)."""
    from frontends import read
    options = _configured(CompileOptions.of(options, **keywords))
    pipeline = passes.pipeline(options)
    names = [p.name for p in pipeline]
    last = max((names.index(n) for n in ("tensor_parallel", "pipeline_cut") if n in names), default=len(names) - 1)
    passes.run(pipeline[:last + 1], read(model, options.weights, options.training),
               _context(options, input_shapes, pipeline))


STEP = frozenset({passes.TYPED, passes.LOSS, passes.GRADIENTS, passes.UPDATES, passes.CUT})
"""What the training pipeline's graph is before the pipeline stage is made."""


def _configured(options):
    """`options` with its Config: the one given, else the environment's, read once for every pass and plan."""
    return options if options.config is not None else replace(options, config=Config.from_env())


def _context(options, input_shapes, pipeline):
    """The passes' Context of `options`, whose `measure` plans a candidate graph as the plan it becomes (the passes of
    `pipeline` after recomputation run on it: the rank's, the optimizer offloaded)."""
    later = [step for step in pipeline if step.name in ("data_parallel", "offload")]

    def measure(graph, facts):
        if later:  # a candidate of recomputation, planned as the plan it becomes: the rank's, the optimizer offloaded
            context = passes.Context(input_shapes, MappingProxyType(facts))
            graph, found = passes.run(later, graph, context, frozenset({passes.TYPED, passes.UPDATES}))
            facts = {**facts, **found}
        return planning.measure(graph, options.strategy, options.orders, options.config, tuple(options.fetch), facts)

    return passes.Context(input_shapes, measure=measure)


def _planned(graph, facts, options, start):
    """The verified Plan of the typed graph the passes made, with its facts and stats."""
    config = options.config
    fetch = tuple(options.fetch)
    _check_plannable(graph, fetch)
    plan = smallest_plan(graph, options.strategy, options.orders, config, fetch, facts, options.arena_limit)
    plan.training, plan.device, plan.rank = facts, str(options.device), options.rank
    plan.stats.update(_flops(graph), plan_seconds=time.perf_counter() - start, precision=options.precision.value,
                      **_counted(graph),
                      folded_transposes=sum(n.op == "Gemm" and n.name.endswith(FOLDED) for n in graph.nodes),
                      pretransposed=sum(n.op == "Gemm" and n.inputs[1].endswith(PRETRANSPOSED) for n in graph.nodes))
    if config.debug:
        unshared = sum(allocators.align(t.nbytes, ALIGNMENT) for t in plan.tensors.values())
        print(f"memplan: {options.strategy}, {plan.schedule} schedule: memory {unshared / 2**20:.2f} MiB -> "
              f"{plan.arena_bytes / 2**20:.2f} MiB", file=sys.stderr)
    return plan.verify()


def _check_plannable(graph, fetch):
    """No tensor holds strings, and every fetched name is a tensor of the graph."""
    strings = [t.name for t in graph.tensors.values() if t.dtype.kind in "OSU"]
    if strings:
        raise PlanError(f"tensors {', '.join(map(repr, strings[:5]))} hold strings, which have no place in a "
                        "byte arena: memplan plans numeric and bool tensors")
    missing = [name for name in fetch if name not in graph.tensors]
    if missing:
        raise PlanError(f"fetch names tensors the graph does not have: {', '.join(map(repr, missing))}")


def _counted(graph):
    """{stat: how many of the graph's nodes count in it} for each count an op's schema adds to (`Schema.stat`: the
    fused ops), 0 for those none of its nodes does."""
    counts = {s.stat: 0 for versions in ops.SCHEMAS.values() for _, s in versions if s.stat}
    for node in graph.nodes:
        stat = ops.of(node, graph.opsets).stat
        if stat:
            counts[stat] += 1
    return counts


def _flops(graph):
    """Forward (loss included), backward (optimizer included) and recomputation FLOPs, from the op schemas."""
    totals = {"forward_flops": 0, "backward_flops": 0, "recompute_flops": 0}
    for node in graph.nodes:
        key = "recompute_flops" if node.notes.recompute else "backward_flops" if not node.notes.forward \
            else "forward_flops"
        totals[key] += ops.node_flops(graph, node)
    return totals
