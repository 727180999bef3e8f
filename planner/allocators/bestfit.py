"""Greedy best fit in one arena: TFLite's greedy-by-size (lite/arena_planner.cc) and XLA's
GlobalDecreasingSizeBestFitHeap, which differ only in the order intervals are placed.

Each interval, in order, goes into the smallest gap left by the already placed intervals that share
a step with it, or above the highest of them. Only the union of those intervals' byte ranges
matters, which `_Neighbours` collects without looking at intervals far away in time.
"""
import math
from bisect import bisect_left
from statistics import median

import numpy as np

from . import allocator

ORDERS = {  # name: sort key of interval i; ties by index
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
    return smallest(sizes, starts, ends, ORDERS)


def smallest(sizes, starts, ends, orders, gap=None):
    """The placement of the least total among `orders` (ties: the first). An order stops as soon as its top
    reaches the best total so far, as the top only grows: it could not win."""
    best = None
    for order in orders:
        placed = place(sizes, starts, ends, order, gap, below=math.inf if best is None else best[1])
        if placed is not None:
            best = placed
    return best


def place(sizes, starts, ends, order, gap=None, below=math.inf):
    """Offsets of (aligned) intervals placed in the order `ORDERS[order]`, each where `gap(size, sorted
    byte ranges of its placed neighbours)` says (default best_gap), and the total; None as soon as the
    total would reach `below`. Empty intervals occupy nothing and stay at offset 0."""
    key, gap = ORDERS[order], gap or best_gap
    offsets, top = [0] * len(sizes), 0
    neighbours = _Neighbours(starts, ends)
    for i in sorted(range(len(sizes)), key=lambda i: key(sizes, starts, ends, i)):
        if sizes[i]:
            offsets[i] = gap(sizes[i], sorted(neighbours.ranges(i)))
            neighbours.add(i, offsets[i], offsets[i] + sizes[i])
            if offsets[i] + sizes[i] > top:
                top = offsets[i] + sizes[i]
                if top >= below:
                    return None
    return offsets, top


def best_gap(size, ranges):
    """Lowest offset of the smallest gap of at least `size` bytes between byte ranges (sorted by
    start), else the top of the highest range (TFLite's best fit)."""
    best, snuggest, top = None, None, 0
    for low, high in ranges:
        gap = low - top
        if gap >= size and (best is None or gap < snuggest):
            best, snuggest = top, gap
            if gap == size:
                break
        if high > top:  # not max(): this is the innermost loop
            top = high
    return top if best is None else best


class _Neighbours:
    """Placed intervals indexed by time, answering "which byte ranges are taken during [start, end]".

    Steps are cut into buckets about one typical lifetime wide. A short interval is listed in each
    bucket it touches; a long one only in its two end buckets, and its inner buckets get its byte
    range merged into the covering nodes of a segment tree over buckets, so stacked long intervals
    cost one range. A long query scans all placed intervals at once with NumPy.
    """
    LONG = 8  # buckets an interval must touch to count as long

    def __init__(self, starts, ends):
        steps, ranks = np.unique(np.concatenate([starts, ends]).astype(np.int64), return_inverse=True)
        n = len(starts)
        self.start, self.end = ranks[:n].tolist(), ranks[n:].tolist()  # steps compressed to ranks
        self.width = max(1, int(median(e - s + 1 for s, e in zip(self.start, self.end)))) if n else 1
        count = (len(steps) - 1) // self.width + 1
        self.buckets = [[] for _ in range(count)]
        self.leaves = 1 << (count - 1).bit_length()
        self.covering = {}  # tree node -> merged [(low, high)] of long intervals covering its buckets
        self.low, self.high = [0] * n, [0] * n
        self.placed_start = np.full(n, len(steps), dtype=np.int64)  # unplaced: after every step
        self.placed_end = np.asarray(ranks[n:], dtype=np.int64)
        self.placed_low, self.placed_high = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)

    def ranges(self, i):
        """Byte ranges (unsorted, maybe overlapping) of the placed intervals sharing a step with `i`."""
        s, e = self.start[i], self.end[i]
        first, last = s // self.width, e // self.width
        if last - first >= self.LONG:
            return self._scan(s, e)
        start, end, low, high = self.start, self.end, self.low, self.high
        found = [(low[j], high[j]) for b in range(first, last + 1) for j in self.buckets[b]
                 if start[j] <= e and end[j] >= s]
        left, right = first + self.leaves, last + self.leaves
        while left and self.covering:
            for node in range(left, right + 1):
                found += self.covering.get(node, ())
            left, right = left >> 1, right >> 1
        return found

    def add(self, i, low, high):
        """Record interval `i` as placed at bytes [low, high)."""
        s, e = self.start[i], self.end[i]
        first, last = s // self.width, e // self.width
        self.low[i], self.high[i] = low, high
        self.placed_start[i], self.placed_low[i], self.placed_high[i] = s, low, high
        if last - first < self.LONG:
            for bucket in self.buckets[first:last + 1]:
                bucket.append(i)
            return
        self.buckets[first].append(i)
        self.buckets[last].append(i)
        left, right = first + 1 + self.leaves, last + self.leaves  # inner buckets, half open
        while left < right:
            if left & 1:
                _merge(self.covering.setdefault(left, []), low, high)
                left += 1
            if right & 1:
                right -= 1
                _merge(self.covering.setdefault(right, []), low, high)
            left, right = left >> 1, right >> 1

    def _scan(self, s, e):
        """The union of byte ranges of all placed intervals sharing a step with [s, e], by NumPy."""
        hit = np.flatnonzero((self.placed_start <= e) & (self.placed_end >= s))
        if not len(hit):
            return []
        order = np.argsort(self.placed_low[hit], kind="stable")
        low, high = self.placed_low[hit][order], np.maximum.accumulate(self.placed_high[hit][order])
        new = np.flatnonzero(low[1:] > high[:-1]) + 1  # a range starting above all before it
        return list(zip(low[np.r_[0, new]].tolist(), high[np.r_[new - 1, -1]].tolist()))


def _merge(ranges, low, high):
    """Add [low, high) to sorted, disjoint, non-touching `ranges` in place."""
    i = bisect_left(ranges, (low,))
    if i and ranges[i - 1][1] >= low:
        i -= 1
    j = bisect_left(ranges, (high + 1,))
    if i < j:
        low, high = min(low, ranges[i][0]), max(high, ranges[j - 1][1])
    ranges[i:j] = [(low, high)]
