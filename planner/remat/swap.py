"""Swapping: a forward value the backward pass reads is copied to the host arena after its last forward reader and
back before its first backward reader, so that the device holds it only at its ends (MegEngine's swap, Capuchin's
and POET's "swap" choice, PyTorch's save_on_cpu).

The copies are placed by time (planner.timing): on the step order the planner chose, a value's copy out starts
when it is made and runs on the link while later steps compute, one copy at a time (a FIFO); its SwapOut stands
at the first step the copy is done by (and after the last forward reader), where its device bytes are freed. The
copies back are placed as late as they can start and still be done when their first backward reader starts, the
latest-read first; a SwapIn stands at the step its copy starts, where its device bytes are taken. A graph holding
copies runs in the order they were placed by (planner.schedule: a `timed` op pins it).

`simulate` runs the time model over a graph in its order, the compute and the two directions of the link side by
side: a reader waits for its copy back, a SwapOut for its copy out. `plan_swap` swaps the values with the most time
to spare first (idle time less both copies), the fewest that bring the arena within the budget (where no copies
that overlap the compute do, the steps wait for them); `plan_hybrid`
chooses per value to keep, recompute or swap, whichever costs least per byte saved, and keeps the cheapest in
modeled time of that, swapping alone and recomputing alone.
"""
import bisect
import math
from dataclasses import dataclass, replace

from ..errors import InfeasibleBudgetError
from ..ir import Annotations, Node, Phase
from ..schedule import followed, schedule
from ..timing import runs_on_host
from .recompute import droppable, recompute

HOST, BACK = "/host", "/swapped"
"""Suffixes of a swapped value's host copy and of its copy back on the device."""
MIN_BYTES = 4096
"""Values smaller than this are not swapped: a copy's launch costs more than their bytes save."""
STEPS = 12
"""Bisection steps of a search over how many candidates to take."""


@dataclass(frozen=True)
class Window:
    """A saved value's span in a step order: the step that `made` it, its `last_forward` and `first_backward`
    readers, and the modeled seconds from the end of the one to the start of the other (`idle`)."""

    name: str
    nbytes: int
    made: int
    last_forward: int
    first_backward: int
    idle: float

    def spare(self, model):
        """Seconds the value waits beyond the time both its copies take; below 0, the copies cannot all overlap."""
        return self.idle - 2 * model.transfer(self.nbytes)


def times(graph, steps, model):
    """(start, end) seconds of each step of `steps` run back to back by the time model, no copies waiting."""
    starts, t = [], 0.0
    for node in steps:
        starts.append(t)
        t += model.seconds(graph, node)
    return starts, starts[1:] + [t]


def windows(graph, steps, model):
    """The Window of each value a forward step makes and a later step of the backward pass (or a recomputation)
    reads, of at least MIN_BYTES, read by no forward step after its first backward reader; not a graph output or
    an update, which are held."""
    index = {node.name: k for k, node in enumerate(steps)}
    starts, ends = times(graph, steps, model)
    held = set(graph.outputs) | {new for new, _ in graph.updates}
    found = []
    for k, node in enumerate(steps):
        if not node.notes.forward:
            continue
        for name in node.outputs:
            t = graph.tensors.get(name) if name else None
            if t is None or t.kind != "activation" or t.host or name in held or t.nbytes < MIN_BYTES:
                continue
            readers = [(index[r.name], r.notes.forward) for r in graph.consumers.get(name, ())]
            late = [i for i, forward in readers if not forward]
            if not late:
                continue
            last = max([k] + [i for i, forward in readers if forward])
            first = min(late)
            if first > last + 1:
                found.append(Window(name, t.nbytes, k, last, first, starts[first] - ends[last]))
    return found


def place(graph, steps, chosen, model, stall=False):
    """The graph with the values named in `chosen` swapped (see the module docstring): each a SwapOut to its host
    copy (name + HOST) and a SwapIn to its copy back (name + BACK), which every reader from the SwapIn on reads. The
    order is `steps` scheduled again for memory with the copies in it (a backward step reading a copy back runs as
    late as it can), then the copies placed in it by time. A value whose copy back would have to start before its
    copy out is done is not swapped; unless `stall`: then each SwapOut stands right after its value's last forward
    reader, each copy back starts its own copy's time before its reader (not before the backward pass), as if the
    link were free, and the steps wait for the copies (simulate) rather than hold the values longer."""
    wins = [w for w in windows(graph, steps, model) if w.name in chosen]
    if not wins:
        return graph
    order = _memory_order(graph, steps, wins)
    starts, ends = times(graph, order, model)
    wins = {w.name: w for w in windows(graph, order, model) if w.name in chosen}
    backward = next((k for k, node in enumerate(order) if not node.notes.forward), len(order)) if stall else 0
    while True:
        out_at, in_at, free = {}, {}, 0.0
        for w in sorted(wins.values(), key=lambda w: (w.made, w.name)):
            free = max(ends[w.made], free) + model.transfer(w.nbytes)
            out_at[w.name] = w.last_forward + 1 if stall else max(w.last_forward + 1, bisect.bisect_left(starts, free))
        later = math.inf
        for w in sorted(wins.values(), key=lambda w: (-w.first_backward, w.name)):
            later = min(starts[w.first_backward], math.inf if stall else later) - model.transfer(w.nbytes)
            in_at[w.name] = min(max(bisect.bisect_right(starts, later) - 1, out_at[w.name] + stall, backward),
                                w.first_backward)
        late = {name for name in wins if in_at[name] <= out_at[name]}
        if not late:
            return _with_copies(graph, order, {name: (out_at[name], in_at[name]) for name in wins})
        wins = {name: w for name, w in wins.items() if name not in late}


def _memory_order(graph, steps, wins):
    """The nodes of `steps` in the memory-aware order (planner.schedule) of the graph with the copies of `wins` at
    their values' ends, the copies left out: where the copy back takes device bytes, the backward steps reading it
    move as late as they can. An optimizer that runs after the whole backward pass in `steps` stays there."""
    rewritten = _with_copies(graph, steps, {w.name: (w.last_forward + 1, w.first_backward) for w in wins})
    index = {node.name: k for k, node in enumerate(steps)}
    body = max(k for k, node in enumerate(steps) if node.notes.phase is not Phase.OPTIMIZER)
    last = {node.name for node in steps[body + 1:]}
    order = schedule(rewritten, "memory", graph.outputs, last)
    return tuple(steps[index[node.name]] for node in order if node.name in index)


def _with_copies(graph, order, at):
    """The graph in `order` with a SwapOut before step `at[name][0]` and a SwapIn before step `at[name][1]` of each
    value named in `at` (its copies out first), the readers from its SwapIn on reading its copy back."""
    before, tensors = {}, dict(graph.tensors)
    for name in sorted(at, key=lambda n: (at[n][0], n)):
        t = graph.tensors[name]
        tensors[name + HOST] = replace(t, name=name + HOST, host=True)
        tensors[name + BACK] = replace(t, name=name + BACK)
        before.setdefault(at[name][0], []).append(Node("SwapOut", (name,), (name + HOST,), name=f"swap_out/{name}",
                                                       domain="memplan"))
    for name in sorted(at, key=lambda n: (at[n][1], n)):
        before.setdefault(at[name][1], []).append(Node("SwapIn", (name + HOST,), (name + BACK,), name=f"swap_in/{name}",
                                                       notes=Annotations(phase=Phase.BACKWARD), domain="memplan"))
    nodes, back = [], {}
    for k, node in enumerate(order):
        for copy in before.get(k, ()):
            nodes.append(copy)
            if copy.op == "SwapIn":
                back[copy.inputs[0][:-len(HOST)]] = copy.outputs[0]
        if any(i in back for i in node.inputs):
            node = replace(node, inputs=tuple(back.get(i, i) for i in node.inputs))
        nodes.append(node)
    return replace(graph, nodes=tuple(nodes), tensors=tensors)


def simulate(graph, model):
    """(seconds, compute seconds) of one run of `graph` in its order by the time model: the device's compute, the
    host's (an offloaded optimizer's steps, whose tensors all lie in the host arena; the device's own where the
    device is the host: DeviceModel.on_host), and the copies out and back each on its own direction of the link, one
    at a time, each of the four beside the others; a SwapOut waits for its
    copy to be done, a step for the copies and host steps that make what it reads, and the run for all of them."""
    swapped = {n.inputs[0]: n for n in graph.nodes if n.op == "SwapOut" and n.domain == "memplan"}
    t = compute = out_free = in_free = host_free = 0.0
    ready = {}  # when a copy or a host step has made a tensor
    for node in graph.nodes:
        if node.domain == "memplan" and node.op == "SwapOut":
            t = max(t, ready.get(node.outputs[0], t))  # nothing to wait for where the run begins with the value
            continue
        after = max([0.0] + [ready[i] for i in node.inputs if i in ready])
        if node.domain == "memplan" and node.op == "SwapIn":
            in_free = max(t, in_free, after) + model.transfer(graph.tensors[node.outputs[0]].nbytes)
            ready[node.outputs[0]] = in_free
            continue
        seconds = model.seconds(graph, node)
        if not model.on_host and runs_on_host(node, graph.tensors):
            host_free = max(host_free, after) + seconds
            ready.update((o, host_free) for o in node.outputs if o)
            continue
        t = max(t, after) + seconds
        compute += seconds
        for name in node.outputs:
            if name in swapped:
                out_free = max(t, out_free) + model.transfer(graph.tensors[name].nbytes)
                ready[swapped[name].outputs[0]] = out_free
    return max(t, in_free, host_free), compute


def swapped(graph):
    """The names of the values a graph swaps."""
    return sorted(n.inputs[0] for n in graph.nodes if n.domain == "memplan" and n.op == "SwapOut")


def plan_swap(graph, budget, measure, model):
    """(graph, arena bytes) of the fewest values swapped, those with the most time to spare first (Window.spare),
    that bring the arena within `budget` bytes; `measure(graph)` plans a candidate (planning.Measured).
    InfeasibleBudgetError, with the smallest arena found, when swapping every candidate does not fit."""
    measured = measure(graph)
    arena = measured.fitting(budget)
    if arena <= budget:
        return graph, arena
    steps = _order(graph, measured)
    ranked = [w.name for w in sorted(windows(graph, steps, model), key=lambda w: (-w.spare(model), w.name))]
    try:
        return _least_prefix(ranked, lambda names: place(graph, steps, set(names), model), budget, measure, measured)
    except InfeasibleBudgetError:
        return _least_prefix(ranked, lambda names: place(graph, steps, set(names), model, stall=True), budget,
                             measure, measured)


def plan_hybrid(graph, budget, measure, model):
    """(graph, arena bytes) of keep, recompute or swap chosen per value: each saved value is swapped where its copies
    cost less modeled time than computing it again (its producer's seconds), else recomputed where it can be;
    values are taken cheapest per byte first, the fewest that fit `budget`. InfeasibleBudgetError when none do."""
    measured = measure(graph)
    arena = measured.fitting(budget)
    if arena <= budget:
        return graph, arena
    steps = _order(graph, measured)
    can_drop = droppable(graph)
    costs = []
    for w in windows(graph, steps, model):
        swap = max(0.0, -w.spare(model))
        again = model.seconds(graph, graph.producers[w.name]) if w.name in can_drop else math.inf
        costs.append((min(swap, again) / w.nbytes, -w.spare(model), w.name, swap <= again))
    costs.sort()
    swaps = {name for _, _, name, swap in costs if swap}

    def build(names):
        """The values named recomputed or swapped as chosen, those `place` declines to swap recomputed instead."""
        drop = set(names) - swaps
        for _ in range(2):
            rewritten = recompute(graph, drop)
            order = _order(rewritten, measure(rewritten)) if drop else steps
            placed = place(rewritten, order, set(names) & swaps, model)
            declined = (set(names) & swaps & can_drop) - set(swapped(placed)) - drop
            if not declined:
                break
            drop |= declined
        return placed

    return _least_prefix([name for _, _, name, _ in costs], build, budget, measure, measured)


def _order(graph, measured):
    """The nodes of `graph` in the order of `measured`'s chosen plan, which the passes after recomputation made of it
    (their collectives and offloaded copies left out; an update they moved off the param's bytes, back after the
    param's readers)."""
    nodes = {node.name: node for node in graph.nodes}
    return list(followed(graph, [nodes[step.name] for step in measured.chosen().steps if step.name in nodes]))


def _least_prefix(ranked, build, budget, measure, unswapped):
    """(graph, arena) of `build(ranked[:k])` for the least k whose arena fits `budget`, by bisection; where none
    does, InfeasibleBudgetError with the least of the arenas planned to the end of all of them and of the
    `unswapped` graph's (planning.Measured)."""
    def fitted(k):
        graph = build(ranked[:k])
        return graph, measure(graph).fitting(budget)

    best = fitted(len(ranked))
    if best[1] > budget:
        raise InfeasibleBudgetError(budget, min(measure(best[0]).final_arena(), unswapped.final_arena()))
    lo, hi = 0, len(ranked)
    for _ in range(STEPS):
        if hi - lo <= 1:
            break
        mid = (lo + hi) // 2
        found = fitted(mid)
        if found[1] <= budget:
            hi, best = mid, found
        else:
            lo = mid
    return best
