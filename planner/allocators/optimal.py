"""Exact placement with OR-Tools CP-SAT: one rectangle per interval (steps x bytes) under
`AddNoOverlap2D`, the arena's top minimised. Seeded with bestfit's answer as a hint and an upper
bound, so it never returns worse; it stops at `time_limit` seconds with the best found.
"""
from . import ALLOCATORS, allocator, lower_bound
from ..errors import MissingDependencyError


@allocator("optimal")
def optimal(sizes, starts, ends, alignment, time_limit=10.0, workers=2, seed=0):
    best = ALLOCATORS["bestfit"](sizes, starts, ends, alignment)
    load = lower_bound(sizes, starts, ends, alignment)
    if len(sizes) < 2 or best[1] == load:
        return best
    try:
        from ortools.sat.python import cp_model
    except ImportError:
        raise MissingDependencyError('strategy "optimal" needs OR-Tools: pip install "memplan[solver]"') from None
    units = [s // alignment for s in sizes]
    top_bound = best[1] // alignment
    model = cp_model.CpModel()
    top = model.NewIntVar(load // alignment, top_bound, "top")
    offsets, time_boxes, space_boxes = [], [], []
    for i, u in enumerate(units):
        off = model.NewIntVar(0, max(top_bound - u, 0), f"o{i}")
        model.Add(off + u <= top)
        model.AddHint(off, best[0][i] // alignment)
        offsets.append(off)
        time_boxes.append(model.NewFixedSizeIntervalVar(starts[i], ends[i] - starts[i] + 1, f"t{i}"))
        space_boxes.append(model.NewFixedSizeIntervalVar(off, u, f"s{i}"))
    model.AddNoOverlap2D(time_boxes, space_boxes)
    model.Minimize(top)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or solver.Value(top) * alignment >= best[1]:
        return best
    placed = [solver.Value(o) * alignment for o in offsets]
    return placed, max((p + s for p, s in zip(placed, sizes)), default=0)
