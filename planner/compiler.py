"""planner.compile: from a model to a verified Plan, one pass per line.

    typed graph -> schedule -> lifetimes -> in-place aliases -> workspaces -> buffers
                -> allocator offsets -> Plan -> verify
"""
import sys
import time

from . import allocators, workspace
from .config import Config
from .errors import MemplanError, PlanError
from .inplace import aliases
from .liveness import lifetimes
from .plan import ALIGNMENT, Plan, PlannedTensor, Step
from .schedule import schedule as make_schedule

STRATEGIES = {  # name: (allocator, in-place allowed)
    "naive": ("naive", False),
    "inplace": ("naive", True),
    "share": ("share", True),
    "bestfit": ("bestfit", True),
    "optimal": ("optimal", True),
}
SCHEDULES = ("file", "memory", "auto")


def compile(model, input_shapes=None, strategy="bestfit", schedule="auto", training=False, loss=None,
            optimizer=None, remat=None, memory_budget=None, config=None, fetch=()):
    """Plan `model` (a path, onnx.ModelProto, Symbol, typed Graph or "zoo:NAME") into one arena.

    `schedule="auto"` plans both the file's order and the memory-aware one and keeps the smaller
    arena. `fetch` names intermediate tensors the caller wants to read after the run; like graph
    outputs they live to the end and are never overwritten.
    """
    from . import load
    start = time.perf_counter()
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if schedule not in SCHEDULES:
        raise PlanError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if training or loss or optimizer or remat or memory_budget is not None:
        raise MemplanError("training graphs, rematerialisation and memory budgets are not available in this "
                           "version: it plans inference graphs")
    config = config or Config.from_env()
    graph = load(model, input_shapes)
    strings = [t.name for t in graph.tensors.values() if t.dtype.kind in "OSU"]
    if strings:
        raise PlanError(f"tensors {', '.join(map(repr, strings[:5]))} hold strings, which have no place in a "
                        "byte arena: memplan plans numeric and bool tensors")
    missing = [name for name in fetch if name not in graph.tensors]
    if missing:
        raise PlanError(f"fetch names tensors the graph does not have: {', '.join(map(repr, missing))}")
    orders = ("file", "memory") if schedule == "auto" else (schedule,)
    plans = [plan_graph(graph, strategy, order, config, tuple(fetch)) for order in orders]
    plan = min(plans, key=lambda p: p.arena_bytes)
    plan.stats["plan_seconds"] = time.perf_counter() - start
    if config.debug:
        unshared = sum(allocators.align(t.nbytes, ALIGNMENT) for t in plan.tensors.values())
        print(f"memplan: {strategy}, {plan.schedule} schedule: memory {unshared / 2**20:.2f} MiB -> "
              f"{plan.arena_bytes / 2**20:.2f} MiB", file=sys.stderr)
    return plan.verify()


def plan_graph(graph, strategy, order, config, fetch=()):
    """One Plan of a typed graph for one strategy and one schedule order."""
    name, inplace_allowed = STRATEGIES[strategy]
    held = (*graph.outputs, *fetch)
    steps = make_schedule(graph, order, held)
    life = lifetimes(graph, steps, held)
    root_of, views = aliases(graph, steps, held) if inplace_allowed and config.enable_inplace else ({}, set())
    scratch = workspace.requests(graph, steps, config.workspace_limit)
    places, spans, steps_out, ws = _tensors(graph, steps, life, root_of, views, scratch, config)
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
    return Plan(strategy, order, base + total, base + load, _breakdown(tensors, total, ws),
                tensors, tuple(steps_out), tuple(graph.inputs), tuple(graph.outputs),
                stats={"allocator": name, "steps": len(steps), "buffers": len(roots), "persistent_bytes": base,
                       "inplace": sum(1 for n in root_of if n not in views), "views": len(views),
                       "workspace": ws},
                data={t.name: t.data for t in graph.tensors.values() if t.kind in ("param", "const")})


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
    steps_out, ws = [], {"mode": config.workspace_mode, "limit": config.workspace_limit, "requests": len(scratch),
                         "largest": max(scratch.values(), default=0), "total_requested": sum(scratch.values())}
    slot_of = {}
    if config.workspace_mode == "pool" and scratch:
        slot_sizes, slot_of = workspace.pool(graph, steps, config.workspace_limit, config.temp_slots)
        for k, size in enumerate(slot_sizes):
            places[f"workspace:slot{k}"] = dict(name=f"workspace:slot{k}", shape=(size,), dtype="uint8",
                                                kind="workspace_slot", nbytes=size, offset=0, lifetime=None,
                                                alias_of=None, view=False)
        ws["slots"] = list(slot_sizes)
    for step, node in enumerate(steps):
        used = None
        if node.name in scratch:
            if config.workspace_mode == "pool":
                used = f"workspace:slot{slot_of[node.name]}"
            else:
                used = f"{node.name}:workspace"
                places[used] = dict(name=used, shape=(scratch[node.name],), dtype="uint8", kind="workspace",
                                    nbytes=scratch[node.name], offset=0, lifetime=(step, step), alias_of=None,
                                    view=False)
                spans[used] = (step, step)
        steps_out.append(Step(node.name, node.op, node.inputs, node.outputs, dict(node.attrs), used))
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
    if name == "optimal":
        return {"time_limit": config.time_limit}
    return {}


def _breakdown(tensors, transient, ws):
    """The arena by purpose: params (and consts), workspace, io (graph inputs and outputs), and the rest
    of the transient region, which activations need given the sharing. Pooled workspace slots sit in
    the persistent region; one-step workspace tensors share the transient one."""
    params = sum(allocators.align(t.nbytes) for t in tensors.values() if t.kind in ("param", "const")
                 and t.alias_of is None)
    if ws["mode"] == "tensor":
        scratch = shared = min(allocators.align(ws["largest"]), transient)
    else:
        scratch, shared = sum(allocators.align(t.nbytes) for t in tensors.values() if t.kind == "workspace_slot"), 0
    io = min(sum(allocators.align(t.nbytes) for t in tensors.values() if t.kind in ("input", "output")
                 and t.alias_of is None), transient - shared)
    return {"params": params, "io": io, "activations": transient - io - shared, "workspace": scratch}
