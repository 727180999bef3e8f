"""The largest batch whose plan fits a memory budget. A plan's arena grows about linearly with the batch,
so the search extrapolates and interpolates along that line from the plans it has made, checks the batch
after each answer the line gives, and bisects where the line misleads it."""
import math

from .errors import InfeasibleBudgetError, MemplanError

LIMIT = 1 << 20
"""No search goes past this batch."""


def largest(size, budget, progress=None, start=1, slope=None):
    """The largest batch b >= 1 whose `size(b)` (arena bytes; math.inf where none is planned) is at most
    `budget`, or 0 when batch 1 does not fit; sizes must grow with b. `start` is a first guess and `slope`
    the bytes a batch adds (from a search like this one), until two plans that fit give their own.
    `progress(b)` is called before each plan. Returns (batch, {batch: size} of the plans made)."""
    known = {}

    def fits(batch):
        if batch not in known:
            if progress:
                progress(batch)
            known[batch] = size(batch)
        return known[batch] <= budget

    lo, hi, guess = 0, None, min(max(start, 1), LIMIT)
    while hi is None:
        if not fits(guess):
            hi = guess
        elif guess == LIMIT:
            return LIMIT, known
        else:
            lo, guess = guess, min(_beyond(known, guess, budget, slope), LIMIT)
    while hi - lo > 1:
        width, guess = hi - lo, _between(known, lo, hi, budget)
        if fits(guess):
            lo = guess
            if lo + 1 < hi:
                lo, hi = (lo + 1, hi) if fits(lo + 1) else (lo, lo + 1)
        else:
            hi = guess
        if hi - lo > max(width // 2, 1):  # the line misled: halve once
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, known


def line_slope(known, budget):
    """Bytes per batch along the two largest batches of `known` that fit; None with fewer than two."""
    fitting = sorted(b for b, s in known.items() if s <= budget)[-2:]
    if len(fitting) < 2:
        return None
    (a, b) = fitting
    return (known[b] - known[a]) / (b - a)


def _beyond(known, lo, budget, slope):
    """One past the batch that the line through the plans that fit (or `slope` from `lo`) says fits last,
    and at least `lo` + 1; twice `lo` without a line."""
    slope = line_slope(known, budget) or slope
    if not slope or slope <= 0:
        return 2 * lo
    return max(lo + math.floor((budget - known[lo]) / slope) + 1, lo + 1)


def _between(known, lo, hi, budget):
    """The batch in (lo, hi) the line between the two says fits last; the middle where one has no plan."""
    low, high = known.get(lo, 0.0), known[hi]
    if not math.isfinite(high) or high <= low:
        return (lo + hi) // 2
    return min(max(lo + math.floor((budget - low) * (hi - lo) / (high - low)), lo + 1), hi - 1)


def table(compile_at, budget, rows, progress=None, failed=None):
    """[(label, largest batch, its plan)] for each (label, compile options) row (a row fitting no batch: its plan at
    batch 1, over the budget, or None where there is none, as a budget-driven recomputation that cannot meet it
    makes); `compile_at(b,
    **options)` plans the model at batch b. A plan fits when its arena is at most `budget` bytes. Each
    row's search starts from the row before it: its answer, and its bytes per batch. A row whose planning
    fails (a MemplanError other than no fit) is left out and (label, error) appended to `failed` where it
    is a list; it is raised where `failed` is None."""
    out, start, slope = [], 1, None
    for label, options in rows:
        plans = {}

        def size(batch):
            try:
                plans[batch] = compile_at(batch, **options)
            except InfeasibleBudgetError:
                return math.inf
            return plans[batch].arena_bytes

        try:
            batch, known = largest(size, budget, progress and (lambda b: progress(label, b)), start, slope)
        except MemplanError as e:
            if failed is None:
                raise
            failed.append((label, e))
            continue
        out.append((label, batch, plans.get(batch or 1)))
        start, slope = max(batch, 1), line_slope(known, budget) or slope
    return out
