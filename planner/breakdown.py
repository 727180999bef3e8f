"""What the arena holds, by purpose: one category per planned tensor (the report's breakdown and the
timeline picture's colours both read it), the arena's breakdown at its fullest step, and a plan's account
of itself as text (`describe`, Plan.report).

Each field has one definition, whatever the strategy:

- params: params and consts (persistent), and new param values made out of place in a training step;
- optimizer: optimizer state (persistent; training steps only);
- kv_cache: a generation step's static key/value cache (persistent; planner/passes/kv_cache.py);
- workspace: the pooled scratch slots (persistent), or the one-step workspaces live at the fullest step;
- io, saved, grads, activations: the transient buffers live at the fullest step, each counted once in
  the category of the tensor holding it then: graph inputs and outputs; forward values a backward step
  reads; parameter gradients; every other value (recomputed ones included);
- free: the arena's bytes that hold nothing at that step, what the placement loses (arena - LOAD).

The fullest step is the first step where the transient buffers hold the most bytes (LOAD's step). The host
arena's tensors (swapped-out copies, an offloaded optimizer's state) are not the device arena's and count in
none of these.
"""
import numpy as np

from .allocators import align
from .units import format_bytes

FIELDS = {"param": "params", "optimizer": "optimizer", "cache": "kv_cache", "workspace": "workspace", "io": "io", "saved": "saved",
          "gradient": "grads", "activation": "activations", "recomputed": "activations"}
"""The breakdown field of each category."""
TRAINING_ONLY = ("optimizer", "saved", "grads")


def category(tensor):
    """The category of a planned tensor: a key of FIELDS."""
    if tensor.kind in ("param", "const"):
        return "param"
    if tensor.kind == "state":
        return "cache" if tensor.role == "cache" else "optimizer"
    if tensor.kind in ("workspace", "workspace_slot"):
        return "workspace"
    if tensor.kind in ("input", "output"):
        return "io"
    return {"saved": "saved", "gradient": "gradient", "update": "param", "recomputed": "recomputed"}.get(
        tensor.role, "activation")


def fields(training, cache=False):
    """The breakdown's fields, in the order the report shows them: kv_cache for a plan with a KV cache alone."""
    names = dict.fromkeys(FIELDS.values())
    return [f for f in (*names, "free") if (training or f not in TRAINING_ONLY) and (cache or f != "kv_cache")]


def breakdown(tensors, nsteps, arena_bytes, training):
    """({field: bytes} of the arena, summing to `arena_bytes` (see the module docstring); the fullest step)."""
    tensors = on_device(tensors)
    parts = dict.fromkeys(fields(training, any(t.role == "cache" for t in tensors.values())), 0)
    for t in tensors.values():
        if t.lifetime is None and t.alias_of is None:
            parts[FIELDS[category(t)]] += align(t.nbytes)
    step, live = _live_at_fullest_step(tensors, nsteps)
    for name, nbytes in live.items():
        if nbytes:
            parts[FIELDS[name]] += nbytes
    parts["free"] = arena_bytes - sum(parts.values())
    return parts, step


def by_dtype(plan):
    """{element type: bytes} of the arena at its fullest step: the persistent buffers and the transient
    ones live then (the precision of what it holds)."""
    tensors = on_device(plan.tensors)
    step, live = _live_at_fullest_step(tensors, len(plan.steps), key=lambda t: str(t.dtype))
    for t in tensors.values():
        if t.lifetime is None and t.alias_of is None:
            live[str(t.dtype)] = live.get(str(t.dtype), 0) + align(t.nbytes)
    return {dtype: nbytes for dtype, nbytes in sorted(live.items(), key=lambda item: -item[1]) if nbytes}


def peak(plan, fields):
    """(the most bytes the transient buffers of these breakdown `fields` hold at one step, that step): a
    training step's activation memory, say, with its parameter gradients left out."""
    names, live = _timeline(on_device(plan.tensors), len(plan.steps), category)
    total = live[[k for k, name in enumerate(names) if FIELDS[name] in fields]].sum(axis=0)
    step = int(np.argmax(total))
    return int(total[step]), step


def on_device(tensors):
    """The planned tensors of the device arena alone, not the host arena's."""
    return {name: t for name, t in tensors.items() if not t.host}


def _live_at_fullest_step(tensors, nsteps, key=category):
    """The fullest step and {key: bytes} of the transient buffers live then, by `key` of each tensor (its
    category)."""
    names, live = _timeline(tensors, nsteps, key)
    step = int(np.argmax(live.sum(axis=0)))
    return step, {name: int(live[k, step]) for k, name in enumerate(names)}


def _timeline(tensors, nsteps, key):
    """(keys, bytes live at each step under each key): every transient buffer by `key` of each tensor. A
    buffer shared in place or by a view counts its aligned bytes once, under the member that last took it
    over."""
    names = list(dict.fromkeys((*FIELDS, *(key(t) for t in tensors.values())) if key is category else
                               (key(t) for t in tensors.values())))
    live = np.zeros((len(names), nsteps + 2), np.int64)
    groups = {}
    for t in tensors.values():
        if t.lifetime is not None:
            groups.setdefault(t.alias_of or t.name, []).append(t)
    for root, members in groups.items():
        if tensors[root].lifetime is None:
            continue
        members.sort(key=lambda t: t.lifetime)
        size = align(tensors[root].nbytes)
        end = max(t.lifetime[1] for t in members)
        for k, t in enumerate(members):
            stop = members[k + 1].lifetime[0] - 1 if k + 1 < len(members) else end
            row = names.index(key(t))
            live[row, t.lifetime[0]] += size
            live[row, max(stop, t.lifetime[0]) + 1] -= size
    return names, np.cumsum(live, axis=1)


def fullest_step_line(label, plan):
    """`plan`'s breakdown at its fullest step, and the graph inputs already freed by then."""
    step = plan.stats["fullest_step"]
    at = f"step {step} of {len(plan.steps)}" + (f", {plan.steps[step].op} {plan.steps[step].name!r}"
                                                if step < len(plan.steps) else "")
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in plan.breakdown.items())
    line = f"{label} at its fullest step ({at}): {parts}"
    freed = sum(plan.tensors[n].nbytes for n in plan.inputs if plan.tensors[n].lifetime[1] < step)
    if freed * 100 >= plan.arena_bytes:
        line += f"; the graph inputs' {format_bytes(freed)} are free by then (their bytes are reused once read)"
    return line


def dtype_line(plan):
    """What the plan's arena holds at its fullest step, by element type."""
    return f"{plan.strategy} at its fullest step, by element type: " + ", ".join(
        f"{dtype} {format_bytes(nbytes)}" for dtype, nbytes in by_dtype(plan).items())


def describe(plan):
    """One plan's report as text (Plan.report): what was planned, the arena against LOAD, the breakdown at the
    fullest step and by element type, and for a training step what trains and what is recomputed."""
    stats = plan.stats
    lines = [f"{plan.strategy} plan, {plan.schedule} schedule, {stats.get('precision', 'fp32')} (device "
             f"{plan.device}): arena {format_bytes(plan.arena_bytes)}, LOAD {format_bytes(plan.lower_bound_bytes)} "
             f"(x {plan.arena_bytes / max(plan.lower_bound_bytes, 1):.3f}); {len(plan.steps)} steps, "
             f"{len(plan.tensors)} tensors", fullest_step_line(plan.strategy, plan), dtype_line(plan)]
    if plan.trains:
        t = plan.training
        remat = (t.get("remat") or {}).get("remat")
        lines.append(f"training step with {t['optimizer']}: {len(t['params'])} params trained, forward "
                     f"{stats['forward_flops'] / 1e9:.2f} GFLOP, backward {stats['backward_flops'] / 1e9:.2f} GFLOP"
                     + (f"; {remat} recomputes {stats['recompute_flops'] / 1e9:.2f} GFLOP" if remat else ""))
    return "\n".join(lines)
