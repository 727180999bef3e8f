"""Exact offset assignment with OR-Tools CP-SAT, seeded by best fit.

Each interval is a rectangle: fixed in time, free in space (offsets in units of the alignment).
`AddNoOverlap2D` keeps rectangles apart and the solver minimises the arena top, starting from the
best-fit plan as a hint and upper bound and from LOAD as a lower bound.
"""
from ..errors import require
from . import allocator, lower_bound
from .bestfit import bestfit


@allocator("optimal")
def optimal(sizes, starts, ends, alignment, time_limit=10.0, num_workers=2, seed=0):
    """The smallest arena CP-SAT finds within `time_limit` seconds; never worse than best fit."""
    cp_model = require("ortools.sat.python.cp_model", 'strategy "optimal"', "OR-Tools", "solver")
    offsets, total = bestfit(sizes, starts, ends, alignment)
    load = lower_bound(sizes, starts, ends, alignment)
    if total == load or sum(1 for size in sizes if size) <= 1:
        return offsets, total
    model, offset_vars, top = _model(cp_model, sizes, starts, ends, alignment, offsets, total, load)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    status = solver.Solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE) or solver.Value(top) * alignment >= total:
        return offsets, total
    solved = [solver.Value(var) * alignment if var is not None else 0 for var in offset_vars]
    return solved, solver.Value(top) * alignment


def _model(cp_model, sizes, starts, ends, alignment, hint, total, load):
    """The CP-SAT model: one offset variable per non-empty interval (None for empty ones) and the top."""
    model = cp_model.CpModel()
    top = model.NewIntVar(-(-load // alignment), total // alignment, "top")
    offset_vars, x_boxes, y_boxes = [], [], []
    for i, size in enumerate(sizes):
        if not size:
            offset_vars.append(None)
            continue
        units = size // alignment
        offset = model.NewIntVar(0, total // alignment - units, f"offset{i}")
        model.AddHint(offset, hint[i] // alignment)
        model.Add(top >= offset + units)
        x_boxes.append(model.NewFixedSizeIntervalVar(starts[i], ends[i] - starts[i] + 1, f"time{i}"))
        y_boxes.append(model.NewFixedSizeIntervalVar(offset, units, f"space{i}"))
        offset_vars.append(offset)
    model.AddNoOverlap2D(x_boxes, y_boxes)
    model.AddHint(top, total // alignment)
    model.Minimize(top)
    return model, offset_vars, top
