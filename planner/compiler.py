"""planner.compile: from a model to a verified Plan. The passes of a pipeline (planner.passes) make the
typed graph of inference or of a training step; planning it is one step per line:

    typed graph -> schedule -> lifetimes -> in-place aliases -> workspaces -> buffers
                -> allocator offsets -> Plan -> verify
"""
import sys
import time
from dataclasses import replace
from types import MappingProxyType

from . import allocators, ops, passes, workspace
from .breakdown import breakdown
from .config import Config
from .errors import PlanError
from .inplace import aliases
from .ir import Phase
from .liveness import lifetimes
from .options import SCHEDULES, STRATEGIES, CompileOptions
from .plan import ALIGNMENT, Plan, PlannedTensor, Step
from .passes.fold_transpose import SUFFIX as FOLDED
from .passes.pretranspose import SUFFIX as PRETRANSPOSED
from .schedule import schedule as make_schedule

__all__ = ["compile", "compile_stages", "plan_graph", "CompileOptions", "STRATEGIES", "SCHEDULES"]


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
    `remat` ("mirror", "sublinear", "budget", see planner.remat) recomputes forward tensors in backward
    instead of keeping them; `memory_budget` (bytes) asks for the least recomputation whose arena fits
    it (remat="budget"; InfeasibleBudgetError when none does). MXNET_BACKWARD_DO_MIRROR=1 means "mirror".

    `precision` ("fp32", "fp16", "bf16", "amp-fp16", "amp-bf16", see planner.precision) plans in that
    type. The graph rewrites (planner/passes/) are on by default; False keeps the exported form:
    `fuse_attention`, `fuse_norm`, `fuse_activation`, `fold_transpose`, and for inference `fold_batchnorm`,
    `fuse_conv`, `pretranspose`, and (not in plans for a CUDA `device`) `inverted_residual`, `winograd` and
    `batch_conv`.
    plan.stats counts the fused ops.
    """
    from frontends import read
    start = time.perf_counter()
    options = CompileOptions.of(options, **keywords)
    pipeline = passes.TRAINING if options.training else passes.INFERENCE
    graph, facts = passes.run(pipeline, read(model), _context(options, input_shapes))
    return _planned(graph, facts, options, start)


def compile_stages(model, input_shapes=None, options=None, **keywords):
    """Each pipeline stage's plan of a training step under `options.parallel` (pp stages; one plan without),
    as compile makes it, yielded stage by stage: the passes before the cut run once for all of them."""
    from frontends import read
    start = time.perf_counter()
    options = CompileOptions.of(options, **keywords)
    parallel = options.parallel
    if not options.training or parallel is None or parallel.pp == 1:
        yield compile(model, input_shapes, options)
        return
    cut = passes.TRAINING.index(passes.pipeline_stage)
    whole, facts = passes.run(passes.TRAINING[:cut], read(model), _context(options, input_shapes))
    for stage in range(parallel.pp):
        staged = replace(options, parallel=replace(parallel, stage=stage))
        context = replace(_context(staged, input_shapes), facts=MappingProxyType(facts))
        graph, found = passes.run(passes.TRAINING[cut:], whole, context, STEP)
        yield _planned(graph, found, staged, start)


STEP = frozenset({passes.TYPED, passes.LOSS, passes.GRADIENTS, passes.UPDATES})
"""What the training pipeline's graph is before the pipeline cut."""


def _context(options, input_shapes):
    """The passes' Context of `options`, whose `score` plans a candidate graph as the rank's plan."""
    config = options.config or Config.from_env()

    def score(graph, facts):
        if options.parallel is not None:  # a candidate of recomputation, scored as the rank's plan it becomes
            context = passes.Context(options, input_shapes, config, MappingProxyType(facts))
            graph, found = passes.run([passes.data_parallel], graph, context, frozenset({passes.TYPED, passes.UPDATES}))
            facts = {**facts, **found}
        return min(plan_graph(graph, options.strategy, order, config, tuple(options.fetch), facts).arena_bytes
                   for order in options.orders)

    return passes.Context(options, input_shapes, config, score=score)


def _planned(graph, facts, options, start):
    """The verified Plan of the typed graph the passes made, with its facts and stats."""
    config = options.config or Config.from_env()
    fetch = tuple(options.fetch)
    _check_plannable(graph, fetch)
    plans = [plan_graph(graph, options.strategy, order, config, fetch, facts) for order in options.orders]
    plan = min(plans, key=lambda p: p.arena_bytes)
    plan.training, plan.device, plan.rank = facts, options.device, options.rank
    plan.stats.update(_flops(graph), plan_seconds=time.perf_counter() - start, precision=options.precision,
                      fused_attention=sum(n.op == "ScaledDotProductAttention" for n in graph.nodes),
                      fused_activation=sum(n.op == "BiasActivation" and n.domain == "memplan" for n in graph.nodes),
                      fused_norm=sum(n.op == "AddLayerNormalization" and n.domain == "memplan" for n in graph.nodes),
                      fused_conv=sum(n.op == "FusedConv" and n.domain == "com.microsoft" for n in graph.nodes),
                      winograd=sum(n.op == "WinogradConv" and n.domain == "memplan" for n in graph.nodes),
                      batched_conv=sum(n.op == "BatchedConv" and n.domain == "memplan" for n in graph.nodes),
                      inverted_residual=sum(n.op == "InvertedResidual" and n.domain == "memplan" for n in graph.nodes),
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


def plan_graph(graph, strategy, order, config, fetch=(), training=None):
    """One Plan of a typed graph for one strategy and one schedule order."""
    name, inplace_allowed = STRATEGIES[strategy]
    held = (*graph.outputs, *fetch)
    last = {n.name for n in graph.nodes if n.notes.assign}
    if training and training["update"] == "after_backward":
        last |= {n.name for n in graph.nodes if n.notes.phase is Phase.OPTIMIZER}
    steps = make_schedule(graph, order, held, last)
    life = lifetimes(graph, steps, held)
    root_of, views = aliases(graph, steps, held, writes=inplace_allowed and config.enable_inplace)
    root_of.update(graph.updates)
    scratch = workspace.layouts(graph, steps, config.workspace_limit)
    places, spans, steps_out, ws = _tensors(graph, steps, life, root_of, views, scratch, config)
    for tensor, role in _roles(graph, training).items():
        places[tensor]["role"] = role
    persistent = [t for t in places.values() if t["lifetime"] is None and t["alias_of"] is None]
    base = 0
    for t in persistent:
        t["offset"], base = base, base + allocators.align(t["nbytes"], ALIGNMENT)
    roots = [n for n, t in places.items() if t["lifetime"] is not None and t["alias_of"] is None]
    sizes = [places[n]["nbytes"] for n in roots]
    starts, ends = [spans[n][0] for n in roots], [spans[n][1] for n in roots]
    options = _allocator_options(name, config, steps, starts, ends)
    offsets, total = allocators.allocate(name, sizes, starts, ends, ALIGNMENT, **options)
    for n, offset in zip(roots, offsets):
        places[n]["offset"] = base + offset
    for t in places.values():
        if t["alias_of"] is not None:
            t["offset"] = places[t["alias_of"]]["offset"]
    tensors = {n: PlannedTensor(**t) for n, t in places.items()}
    load = allocators.lower_bound(sizes, starts, ends, ALIGNMENT)
    parts, fullest = breakdown(tensors, len(steps_out), base + total, bool(training))
    return Plan(strategy, order, base + total, base + load, parts,
                tensors, tuple(steps_out), tuple(graph.inputs), tuple(graph.outputs),
                stats={"allocator": name, "steps": len(steps), "buffers": len(roots), "persistent_bytes": base,
                       "inplace": sum(1 for n in root_of if n not in views), "views": len(views),
                       "workspace": ws, "fullest_step": fullest,
                       **({"allocator_proof": options["report"]} if "report" in options else {})},
                data={t.name: t.data for t in graph.tensors.values() if t.kind in ("param", "const")},
                opsets=dict(graph.opsets))


def _tensors(graph, steps, life, root_of, views, scratch, config):
    """Each tensor's place as a dict (offset filled in later), each buffer's span of steps, the steps,
    and the workspace summary."""
    places, spans = {}, {}
    for t in graph.tensors.values():
        root = root_of.get(t.name)
        places[t.name] = dict(name=t.name, shape=t.shape, dtype=str(t.dtype), kind=t.kind, nbytes=t.nbytes,
                              offset=0, lifetime=life.get(t.name), alias_of=root, view=t.name in views)
        if t.name in life:
            key = root or t.name
            first, last = life[t.name]
            lo, hi = spans.get(key, (first, last))
            spans[key] = (min(lo, first), max(hi, last))
    asked = [layout.nbytes for layout in scratch.values()]
    steps_out, ws = [], {"mode": config.workspace_mode, "limit": config.workspace_limit, "requests": len(asked),
                         "largest": max(asked, default=0), "total_requested": sum(asked)}
    slot_of = {}
    if config.workspace_mode == "pool" and scratch:
        asked = {name: layout.nbytes for name, layout in scratch.items()}
        slot_sizes, slot_of = workspace.pool(steps, asked, config.temp_slots)
        for k, size in enumerate(slot_sizes):
            places[f"workspace:slot{k}"] = dict(name=f"workspace:slot{k}", shape=(size,), dtype="uint8",
                                                kind="workspace_slot", nbytes=size, offset=0, lifetime=None,
                                                alias_of=None, view=False)
        ws["slots"] = list(slot_sizes)
    for step, node in enumerate(steps):
        used, layout = None, scratch.get(node.name)
        if layout is not None:
            if config.workspace_mode == "pool":
                used = f"workspace:slot{slot_of[node.name]}"
            else:
                used = f"{node.name}:workspace"
                places[used] = dict(name=used, shape=(layout.nbytes,), dtype="uint8", kind="workspace",
                                    nbytes=layout.nbytes, offset=0, lifetime=(step, step), alias_of=None, view=False)
                spans[used] = (step, step)
        phase = "recompute" if node.notes.recompute else "" if node.notes.forward else node.notes.phase.value
        steps_out.append(Step(node.name, node.op, node.inputs, node.outputs, ops.of(node, graph.opsets).normalize(node),
                              used, phase, node.domain, layout.slices if layout else (), graph.opsets.get(node.domain)))
    return places, spans, steps_out, ws


def _allocator_options(name, config, steps, starts, ends):
    """Settings each allocator takes from the Config; `share` colours nodes when several temp slots
    allow concurrent workers (MXNet's GetExecNumMatchColor)."""
    if name == "share":
        options = {"match_range": config.match_range, "auto_search": config.auto_search_match_range}
        if config.temp_slots > 1 and steps:
            color = workspace.color_nodes(steps, config.temp_slots, {node.name: 1 for node in steps})
            last = len(steps) - 1  # held tensors end after the last step; their blocks are never reused
            options["colors"] = ([color[steps[s].name] for s in starts], [color[steps[min(e, last)].name] for e in ends])
        return options
    if name == "optimal":  # `report` comes back filled with what the search proved
        return {"time_limit": config.time_limit, "report": {}}
    return {}


def _roles(graph, training):
    """{tensor: role} of a training graph (see plan.ROLES): gradients, updates, and activations of the
    forward pass that a backward node reads."""
    if not training:
        return {}
    roles = {g: "gradient" for g in training["grads"].values() if graph.tensors[g].kind == "activation"}
    roles.update((new, "update") for new, _ in graph.updates)
    roles.update((o, "recomputed") for n in graph.nodes if n.notes.recompute for o in n.outputs if o)
    forward = {o for n in graph.nodes if n.notes.forward for o in n.outputs}
    for node in graph.nodes:
        if node.notes.phase is Phase.BACKWARD:
            roles.update((i, "saved") for i in node.inputs if i in forward and graph.tensors[i].kind == "activation"
                         and roles.get(i) != "update")
    return roles


def _flops(graph):
    """Forward (loss included), backward (optimizer included) and recomputation FLOPs, from the op schemas."""
    totals = {"forward_flops": 0, "backward_flops": 0, "recompute_flops": 0}
    for node in graph.nodes:
        key = "recompute_flops" if node.notes.recompute else "backward_flops" if not node.notes.forward \
            else "forward_flops"
        totals[key] += ops.node_flops(graph, node)
    return totals
