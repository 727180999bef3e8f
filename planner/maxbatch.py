"""The largest batch whose plan fits a memory budget: doubling, then bisection on the batch size."""
from .errors import InfeasibleBudgetError

LIMIT = 1 << 20
"""No search goes past this batch."""


def largest(fits, progress=None):
    """The largest batch b >= 1 with fits(b), or 0 when batch 1 does not fit; memory must grow with b.
    `progress(b)` is called before each plan."""
    lo, hi = 0, 1
    while hi <= LIMIT and _call(fits, hi, progress):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _call(fits, mid, progress) else (lo, mid)
    return lo


def table(compile_at, budget, rows, progress=None):
    """[(label, largest batch, its plan or None)] for each (label, compile options) row; `compile_at(b,
    **options)` plans the model at batch b. A plan fits when its arena is at most `budget` bytes."""
    out = []
    for label, options in rows:
        plans = {}

        def fits(batch):
            try:
                plans[batch] = compile_at(batch, **options)
            except InfeasibleBudgetError:
                return False
            return plans[batch].arena_bytes <= budget

        batch = largest(fits, progress and (lambda b: progress(label, b)))
        out.append((label, batch, plans.get(batch)))
    return out


def _call(fits, batch, progress):
    if progress:
        progress(batch)
    return fits(batch)

