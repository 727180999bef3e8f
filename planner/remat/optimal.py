"""Optimal recomputation of a training step under a memory budget: Checkmate's integer program
(checkmate.py) over the step's nodes in file order, its schedule replayed as clones
(recompute.replay) and scored by the real planner.

Node k of the file is Checkmate's node k: its tensor is the bytes of its outputs that can be freed
(activations other than graph outputs and updates), its cost its FLOPs (+1, so free ops are not
recomputed for nothing). Where the planner writes an output over its input (in place, or as a view),
the input's bytes are freed before the output's are taken, when nothing reads the input later. Params, inputs, optimizer state, graph outputs and workspaces are the rest
of the arena: the solver gets the budget less what they took in the plan without recomputation, and
less any overshoot the real planner then measures (fragmentation, in-place sharing, workspaces).
As in every other strategy, only forward nodes are recomputed, and only by backward stages.
"""
import numpy as np

from .. import allocators, ops
from ..inplace import aliases
from ..errors import InfeasibleBudgetError, PlanError, say
from ..units import format_bytes
from . import checkmate
from .budget import plan_budget
from .recompute import droppable, replay

MAX_NODES = 200
"""The largest training step the solver is given: the program grows with the square of the nodes."""

TRIES = 4
"""How many schedules the solver proposes before giving up when the real planner finds each over budget
(fragmentation, aliasing the solver's accounting misses); each try asks for a peak below the last one
by the overshoot."""


def dag(graph):
    """The training step as Checkmate's plain data: (sizes, costs, deps, allowed, inplace), node k
    being the file's k-th node, allowed[t, i] whether stage t may compute forward node i again, and
    inplace {k: p} the nodes whose output the planner writes over (or views) node p's."""
    keep = droppable(graph)
    free = keep | {o for n in graph.nodes if not n.notes.forward for o in n.outputs}
    free -= {new for new, _ in graph.updates} | set(graph.outputs)
    root_of, _ = aliases(graph, graph.nodes)
    producer, sizes, costs, deps, inplace = {}, [], [], [], {}
    for k, node in enumerate(graph.nodes):
        deps.append(sorted({producer[i] for i in node.inputs if i in producer}))
        outputs = [o for o in node.outputs if o in free and graph.tensors[o].kind == "activation"]
        sizes.append(sum(allocators.align(graph.tensors[o].nbytes) for o in outputs))
        costs.append(ops.node_flops(graph, node) + 1)
        over = [producer[i] for o in outputs if o in root_of for i in node.inputs
                if i in producer and root_of.get(i, i) == root_of[o]]
        if over:
            inplace[k] = over[0]
        producer.update((o, k) for o in outputs)
    backward = np.array([not n.notes.forward for n in graph.nodes])
    forward = np.array([not b and any(o in keep for o in n.outputs) for b, n in zip(backward, graph.nodes)])
    return sizes, costs, deps, np.tril(np.outer(backward, forward), -1), inplace


def as_replay(graph, R):
    """recompute.replay's form of a schedule: before each node t, the forward nodes R[t] computes again."""
    nodes, keep = graph.nodes, droppable(graph)
    return {nodes[t].name: [(nodes[i], frozenset(o for o in nodes[i].outputs if o in keep))
                            for i in np.flatnonzero(R[t, :t])]
            for t in range(len(nodes)) if R[t, :t].any()}


def plan_optimal(graph, budget, score, time_limit=10.0, solver="milp"):
    """(rewritten graph, info) of the least recomputation fitting `budget` bytes that the solver finds
    within `time_limit` seconds per try; info holds the solver's status, gap, tries, the
    accounting that won and `cut_short_by_time`, whether a time limit stopped a try before the solver
    proved its answer (the plan may then differ on a machine more or less busy). Both accountings are solved, aliasing modelled ("aliased") and every output its
    own bytes ("separate"), as the real plan may fall on either side. InfeasibleBudgetError, with the
    smallest arena found, when no schedule fits."""
    optimal_flag, budget_flag = say("remat='optimal'", "--remat optimal"), say("remat='budget'", "--remat budget")
    if len(graph.nodes) > MAX_NODES:
        raise PlanError(f"{optimal_flag} solves training steps of up to {MAX_NODES} nodes; this one has "
                        f"{len(graph.nodes)}: use {budget_flag}")
    arena = score(graph)
    info = {"solver": solver, "tries": 0, "gap": 0.0, "status": "no recomputation needed"}
    if arena <= budget:
        return graph, info
    sizes, costs, deps, allowed, inplace = dag(graph)
    found, statuses = [], []
    for accounting, aliasing in (("aliased", inplace), ("separate", {})):
        problem = (sizes, costs, deps, allowed, aliasing)
        target = budget - (arena - checkmate.simulate(*checkmate.keep_all(deps), sizes, deps, aliasing))
        for _ in range(TRIES):
            solution = _solve(problem, target, time_limit, solver)
            info.update(tries=info["tries"] + 1)
            statuses.append(solution.status)
            if not solution.feasible:
                break
            rewritten = replay(graph, as_replay(graph, solution.R))
            used = score(rewritten)
            if used <= budget:
                found.append((solution.cost, rewritten, {"status": solution.status, "gap": solution.gap,
                                                         "accounting": accounting, "solver_budget": target,
                                                         "solver_peak": solution.peak}))
                break
            target = min(target, solution.peak) - (used - budget)
    if found:
        _, rewritten, best = min(found, key=lambda f: f[0])
        return rewritten, {**info, **best, "cut_short_by_time": any(map(_timed_out, statuses))}
    if any(map(_timed_out, statuses)):
        raise PlanError(f"the {solver} solver found no schedule fitting {format_bytes(budget)} within {time_limit:g} s "
                        f"({say('MEMPLAN_TIME_LIMIT', '--time-limit')}); allow it more time or use {budget_flag}")
    smallest = _smallest(graph, score, (sizes, costs, deps, allowed, {}), time_limit, solver)
    if smallest > budget:
        raise InfeasibleBudgetError(budget, smallest)
    raise PlanError(f"each schedule the solver found for {format_bytes(budget)} came out over it in the real plan "
                    f"(fragmentation, aliasing), and the cheapest proof is out of reach; {budget_flag} fits it")


def _smallest(graph, score, problem, time_limit, solver, steps=6):
    """The smallest arena found: the budget planner's, or that of the solver's schedules as its budget
    is bisected between Checkmate's lower bound and the peak without recomputation."""
    try:
        plan_budget(graph, 0, score)
    except InfeasibleBudgetError as e:
        smallest = e.minimum
    sizes, _, deps, _, aliasing = problem
    lo = checkmate.min_budget(sizes, deps)
    hi = checkmate.simulate(*checkmate.keep_all(deps), sizes, deps, aliasing)
    for _ in range(steps):
        mid = (lo + hi) // 2
        solution = _solve(problem, mid, time_limit, solver)
        if not solution.feasible:
            lo = mid
            continue
        hi = mid
        smallest = min(smallest, score(replay(graph, as_replay(graph, solution.R))))
    return smallest


def _timed_out(status):
    """Whether a solver's status says its time limit stopped it (HiGHS's message; CP-SAT's FEASIBLE or UNKNOWN)."""
    return "time limit" in status.lower() or status in ("FEASIBLE", "UNKNOWN")


def _solve(problem, budget, time_limit, solver):
    sizes, costs, deps, allowed, inplace = problem
    return checkmate.solve(sizes, costs, deps, budget, time_limit, solver, allowed, inplace)
