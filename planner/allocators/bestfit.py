"""Greedy best fit in one arena: TFLite's greedy-by-size (lite/arena_planner.cc) and XLA's
GlobalDecreasingSizeBestFitHeap, which differ only in the order intervals are placed.

Each interval, in order, goes into the smallest gap left by the already placed intervals that share
a step with it, or above the highest of them. Placed intervals are indexed in buckets of steps so a
placement only looks at its neighbours in time.
"""
from statistics import median

from . import allocator

ORDERS = {  # name: sort key of interval i, ties broken by index
    "tflite": lambda size, start, end, i: (-size[i], start[i], i),
    "xla_spatial": lambda size, start, end, i: (-size[i], start[i] - end[i], i),
    "xla_temporal": lambda size, start, end, i: (start[i] - end[i], -size[i], i),
}


@allocator("greedy_by_size")
def greedy_by_size(sizes, starts, ends, alignment):
    """TFLite's order alone: size descending, then earlier start."""
    return place(sizes, starts, ends, "tflite")


@allocator("bestfit")
def bestfit(sizes, starts, ends, alignment):
    """The smallest of the TFLite, XLA spatial and XLA temporal orders (ties: the first)."""
    return min((place(sizes, starts, ends, order) for order in ORDERS), key=lambda plan: plan[1])


def place(sizes, starts, ends, order):
    """Best-fit offsets of (aligned) intervals placed in the order `ORDERS[order]`, and the total."""
    key = ORDERS[order]
    n = len(sizes)
    offsets, total = [0] * n, 0
    if not n:
        return offsets, total
    first, width = min(starts), _bucket_width(starts, ends)
    buckets = [[] for _ in range((max(ends) - first) // width + 1)]  # ids placed, per span of steps
    for i in sorted(range(n), key=lambda i: key(sizes, starts, ends, i)):
        s, e = starts[i], ends[i]
        lo, hi = (s - first) // width, (e - first) // width
        near = buckets[lo] if lo == hi else set().union(*buckets[lo:hi + 1])
        near = sorted((j for j in near if starts[j] <= e and ends[j] >= s), key=offsets.__getitem__)
        offsets[i] = offset = _best_gap(sizes[i], near, offsets, sizes)
        total = max(total, offset + sizes[i])
        for bucket in buckets[lo:hi + 1]:
            bucket.append(i)
    return offsets, total


def _best_gap(size, near, offsets, sizes):
    """Lowest offset of the smallest gap of at least `size` bytes between the intervals `near`
    (sorted by offset), else the top of the highest of them."""
    best, best_gap, top = None, None, 0
    for j in near:
        gap = offsets[j] - top
        if gap >= size and (best is None or gap < best_gap):
            best, best_gap = top, gap
            if gap == size:
                break
        top = max(top, offsets[j] + sizes[j])
    return top if best is None else best


def _bucket_width(starts, ends):
    """Steps per bucket: about a typical lifetime, so most intervals touch one or two buckets."""
    return max(1, int(median(e - s + 1 for s, e in zip(starts, ends))))
