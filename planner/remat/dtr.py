"""A static simulation of Dynamic Tensor Rematerialization (Kirisame et al. 2021) under a budget: the
baseline the budget planner is compared with.

A training plan's steps run in order. Before a step runs, its inputs are made resident, recomputing
evicted ones (and, first, their own evicted inputs); to make room for its outputs, the resident
tensor with the smallest h = cost / (bytes x staleness) is evicted, cost being its producer's FLOPs
plus those of its evicted inputs' producers (DTR's evicted neighbourhood, one level deep). Only
forward tensors are evicted (recomputing a gradient would replay the backward pass); graph inputs and
the current step's tensors never are. A tensor, recomputed or not, is freed for good once no later
step reads it. Views are free.
"""
from dataclasses import dataclass

from .. import ops


@dataclass
class DtrResult:
    feasible: bool
    recompute_flops: int
    evictions: int
    peak: int


def simulate(plan, budget):
    """DTR's run of a training plan's steps with at most `budget` transient bytes resident."""
    steps, tensors = plan.steps, plan.tensors
    producer = {o: n for n in steps for o in n.outputs if o}
    cost = {n.name: ops.node_flops(plan, n) for n in steps}
    last = {}
    for k, node in enumerate(steps):
        for i in node.inputs:
            last[i] = k
    keep = set(plan.outputs) | {t.name for t in tensors.values() if t.role == "update"}
    forward = {o for n in steps if not n.phase for o in n.outputs if o and o not in keep}

    def size(t):
        return 0 if tensors[t].view else tensors[t].nbytes

    resident, touched = {}, {}
    pinned = set(plan.inputs)
    state = {"bytes": sum(size(t) for t in pinned), "peak": 0, "flops": 0, "evictions": 0, "clock": 0}
    state["peak"] = state["bytes"]
    evicted = set()

    def missing(t):
        return t and t not in resident and t not in pinned and t in producer

    def make_resident(tensors, busy):
        """Recompute the evicted `tensors`, each after its own evicted inputs (no recursion: chains of
        evictions can be long); False when the budget cannot hold what that needs."""
        stack, budget_left = [t for t in tensors if missing(t)], 100 * len(steps)
        while stack:
            budget_left -= 1
            if budget_left < 0:
                return False
            t = stack[-1]
            if not missing(t):
                stack.pop()
                continue
            node = producer[t]
            needed = [i for i in node.inputs if missing(i)]
            if needed:
                stack.extend(needed)
                continue
            stack.pop()
            if not run(node, busy | {i for i in node.inputs if i} | set(stack), recompute=True):
                return False
        return True

    def run(node, busy, recompute=False):
        state["clock"] += 1
        if recompute:
            state["flops"] += cost[node.name]
        for i in node.inputs:
            if i in resident:
                touched[i] = state["clock"]
        made = [o for o in node.outputs if o and o not in resident]
        if not evict(busy | set(node.outputs), sum(size(o) for o in made)):
            return False
        for o in made:
            resident[o] = size(o)
            touched[o] = state["clock"]
            state["bytes"] += resident[o]
            evicted.discard(o)
        state["peak"] = max(state["peak"], state["bytes"])
        return True

    def evict(busy, room=0):
        """Evict until `room` more bytes fit the budget; False when they cannot."""
        while state["bytes"] + room > budget:
            choices = [t for t in resident if t not in busy and resident[t] and t in forward]
            if not choices:
                return False
            victim = min(choices, key=lambda t: _h(t))
            state["bytes"] -= resident.pop(victim)
            evicted.add(victim)
            state["evictions"] += 1
        return True

    def _h(t):
        neighbourhood = cost[producer[t].name] + sum(cost[producer[i].name] for i in producer[t].inputs if i in evicted)
        return neighbourhood / (resident[t] * max(state["clock"] - touched[t], 1))

    feasible = True
    for k, node in enumerate(steps):
        busy = {i for i in node.inputs if i}
        feasible &= make_resident(busy, busy) and run(node, busy)
        if not feasible:
            break
        for t in [t for t in resident if last.get(t, -1) <= k and t not in keep]:
            state["bytes"] -= resident.pop(t)
    return DtrResult(feasible and state["peak"] <= budget, state["flops"], state["evictions"], state["peak"])

