"""Exact offset assignment: the exact search (exact.py) first, within the effort of half the time limit
(a count, the same on a busy machine), then OR-Tools CP-SAT as a second opinion for the time limit, when it
is installed and the search has not proved its plan optimal; the best plan wins.

Each interval is a rectangle: fixed in time, free in space (offsets in units of the alignment).
`AddNoOverlap2D` keeps rectangles apart and the solver minimises the arena top, starting from the
exact search's plan as a hint and upper bound and from its proven lower bound.

`report`, a dict when given, is filled with what was proved: {"by": "exact" | "cpsat" | None,
"optimal": bool, "lower_bytes": the proven lower bound, "load_bytes": LOAD, "gap": total / lower - 1,
"cpsat": CP-SAT's status name or why it did not run, "cut_short_by_time": whether CP-SAT's time limit
stopped it before it proved its plan optimal (a plan that may then differ from run to run)}; bytes of the
intervals given, so in a Plan (stats["allocator_proof"]) without the persistent bytes below them.
"""
from ..errors import MissingDependencyError, require
from . import allocator
from .exact import EFFORT_PER_SECOND, exact_search


@allocator("optimal")
def optimal(sizes, starts, ends, alignment, time_limit=10.0, num_workers=2, seed=0, report=None):
    """The smallest arena the exact search (the effort of half `time_limit`) and CP-SAT (`time_limit` seconds)
    find; never worse than best fit."""
    result = exact_search(sizes, starts, ends, alignment, int(EFFORT_PER_SECOND * time_limit / 2))
    offsets, total, lower = result.offsets, result.total, result.lower
    by, cpsat = ("exact" if result.optimal else None), "not needed"
    if not result.optimal:
        try:
            cp_model = require("ortools.sat.python.cp_model", 'CP-SAT', "OR-Tools", "solver")
        except MissingDependencyError:
            cp_model, cpsat = None, "OR-Tools not installed"
    cut_short = False
    if not result.optimal and cp_model is not None:
        model, offset_vars, top = _model(cp_model, sizes, starts, ends, alignment, offsets, total, lower)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = float(time_limit)
        solver.parameters.num_workers = num_workers
        solver.parameters.random_seed = seed
        status = solver.Solve(model)
        cpsat, cut_short = solver.StatusName(status), status != cp_model.OPTIMAL
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            lower = max(lower, int(solver.BestObjectiveBound()) * alignment)
            if solver.Value(top) * alignment < total:
                offsets = [solver.Value(var) * alignment if var is not None else 0 for var in offset_vars]
                total = solver.Value(top) * alignment
            if status == cp_model.OPTIMAL:
                by = "cpsat"
    if report is not None:
        lower = min(lower, total)
        report.update(by=by, optimal=lower == total, lower_bytes=lower, load_bytes=result.load,
                      gap=total / lower - 1 if lower else 0.0, cpsat=cpsat, cut_short_by_time=cut_short)
    return offsets, total


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
