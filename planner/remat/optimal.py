"""Optimal recomputation of a training step under a memory budget: Checkmate's integer program
(checkmate.py) over the step's nodes in file order, its schedule replayed as clones
(recompute.replay) and scored by the real planner.

Node k of the file is Checkmate's node k: its tensor is the bytes of its outputs that can be freed
(activations other than graph outputs and updates), its cost its FLOPs (+1, so free ops are not
recomputed for nothing). Params, inputs, optimizer state, graph outputs and workspaces are the rest
of the arena: the solver gets the budget less what they took in the plan without recomputation, and
less any overshoot the real planner then measures (fragmentation, in-place sharing, workspaces).
As in every other strategy, only forward nodes are recomputed, and only by backward stages.
"""
import numpy as np

from .. import allocators, ops
from ..errors import InfeasibleBudgetError, PlanError
from . import checkmate
from .budget import plan_budget
from .recompute import droppable, replay

MAX_NODES = 200
"""The largest training step the solver is given: the program grows with the square of the nodes."""

TRIES = 4
"""How many times the solver's budget is lowered by the real planner's overshoot before giving up."""


def dag(graph):
    """The training step as Checkmate's plain data: (sizes, costs, deps, allowed), node k being the
    file's k-th node and allowed[t, i] whether stage t may compute forward node i again."""
    free = droppable(graph) | {o for n in graph.nodes if "phase" in n.meta for o in n.outputs}
    free -= {new for new, _ in graph.updates} | set(graph.outputs)
    producer, sizes, costs, deps = {}, [], [], []
    for k, node in enumerate(graph.nodes):
        deps.append(sorted({producer[i] for i in node.inputs if i in producer}))
        outputs = [o for o in node.outputs if o in free and graph.tensors[o].kind == "activation"]
        sizes.append(sum(allocators.align(graph.tensors[o].nbytes) for o in outputs))
        costs.append(ops.node_flops(graph, node) + 1)
        producer.update((o, k) for o in outputs)
    backward = np.array(["phase" in n.meta for n in graph.nodes])
    forward = ~backward & (np.array(sizes) > 0)
    return sizes, costs, deps, np.tril(np.outer(backward, forward), -1)


def as_replay(graph, R):
    """recompute.replay's form of a schedule: before each node t, the forward nodes R[t] computes again."""
    nodes, keep = graph.nodes, droppable(graph)
    return {nodes[t].name: [(nodes[i], frozenset(o for o in nodes[i].outputs if o in keep))
                            for i in np.flatnonzero(R[t, :t])]
            for t in range(len(nodes)) if R[t, :t].any()}


def plan_optimal(graph, budget, score, time_limit=10.0, solver="milp"):
    """(rewritten graph, info) of the least recomputation fitting `budget` bytes that the solver finds
    within `time_limit` seconds per try; info holds the solver's status, gap, seconds and the bytes it
    was given. InfeasibleBudgetError, with the smallest arena found, when the solver proves no
    schedule fits."""
    if len(graph.nodes) > MAX_NODES:
        raise PlanError(f"remat='optimal' solves training steps of up to {MAX_NODES} nodes; this one has "
                        f"{len(graph.nodes)}: use remat='budget'")
    arena = score(graph)
    info = {"solver": solver, "tries": 0, "seconds": 0.0, "gap": 0.0, "status": "no recomputation needed"}
    if arena <= budget:
        return graph, info
    sizes, costs, deps, allowed = dag(graph)
    kept = checkmate.simulate(np.eye(len(sizes), dtype=bool), _held(deps), sizes, deps)
    target = budget - (arena - kept)
    for _ in range(TRIES):
        solution = checkmate.solve(sizes, costs, deps, target, time_limit, solver, allowed)
        info.update(tries=info["tries"] + 1, seconds=info["seconds"] + solution.seconds, status=solution.status,
                    gap=solution.gap, solver_budget=target)
        if not solution.feasible:
            break
        rewritten = replay(graph, as_replay(graph, solution.R))
        arena = score(rewritten)
        if arena <= budget:
            return rewritten, {**info, "solver_peak": solution.peak}
        target -= arena - budget
    if "time limit" in info["status"].lower():
        raise PlanError(f"the {solver} solver found no schedule fitting {budget} bytes within {time_limit:g} s "
                        f"(MEMPLAN_TIME_LIMIT); allow it more time or use remat='budget'")
    smallest = _smallest(graph, score, (sizes, costs, deps, allowed), kept, time_limit, solver)
    if smallest > budget:
        raise InfeasibleBudgetError(budget, smallest)
    raise PlanError(f"the solver found no schedule fitting {budget} bytes by Checkmate's accounting, which "
                    "counts views and in-place outputs as tensors of their own; remat='budget' finds one")


def _smallest(graph, score, problem, kept, time_limit, solver, steps=6):
    """The smallest arena found: the budget planner's, or that of the solver's schedules as its budget
    is bisected between Checkmate's lower bound and `kept` (the peak without recomputation)."""
    try:
        plan_budget(graph, 0, score)
    except InfeasibleBudgetError as e:
        smallest = e.minimum
    sizes, costs, deps, allowed = problem
    lo, hi = checkmate.min_budget(sizes, deps), kept
    for _ in range(steps):
        mid = (lo + hi) // 2
        solution = checkmate.solve(sizes, costs, deps, mid, time_limit, solver, allowed)
        if not solution.feasible:
            lo = mid
            continue
        hi = mid
        smallest = min(smallest, score(replay(graph, as_replay(graph, solution.R))))
    return smallest


def _held(deps):
    """S of the schedule without recomputation: each tensor held from its node to its last reader."""
    n = len(deps)
    last = list(range(n))
    for k, ins in enumerate(deps):
        for i in ins:
            last[i] = max(last[i], k)
    t = np.arange(n)[:, None]
    return (t > np.arange(n)) & (t <= np.array(last))

