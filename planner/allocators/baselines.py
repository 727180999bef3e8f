"""Other planners' offset assignment, re-implemented over the same intervals to compare plans with
(REFERENCE.md section 7); memplan's own strategies never use them.

- "first_fit": TFLite Micro's greedy planner: TFLite's order, the lowest gap that fits.
- "xla": XLA's GlobalDecreasingSizeBestFitHeap, the smaller of its two orders.
- "usmp": TVM USMP's greedy_by_size: size order, each buffer above every placed one it meets in
  time, no hole filling (before its hill climb).
- "exact_reuse": ONNX Runtime's planner: a freed buffer is reused only by a tensor of exactly its
  size, in the schedule's order; else a new buffer goes on top.
"""
import heapq

from . import allocator
from .bestfit import place, smallest


@allocator("first_fit")
def first_fit(sizes, starts, ends, alignment):
    return place(sizes, starts, ends, "tflite", gap=first_gap)


@allocator("xla")
def xla(sizes, starts, ends, alignment):
    return smallest(sizes, starts, ends, ("xla_spatial", "xla_temporal"))


@allocator("usmp")
def usmp(sizes, starts, ends, alignment):
    return place(sizes, starts, ends, "tflite", gap=lambda size, ranges: max((high for _, high in ranges), default=0))


@allocator("exact_reuse")
def exact_reuse(sizes, starts, ends, alignment):
    offsets, total, free, live = [0] * len(sizes), 0, {}, []
    for i in sorted(range(len(sizes)), key=lambda i: (starts[i], i)):
        while live and live[0][0] < starts[i]:
            _, j = heapq.heappop(live)
            free.setdefault(sizes[j], []).append(offsets[j])
        if not sizes[i]:
            continue
        if free.get(sizes[i]):
            offsets[i] = free[sizes[i]].pop()
        else:
            offsets[i], total = total, total + sizes[i]
        heapq.heappush(live, (ends[i], i))
    return offsets, total


def first_gap(size, ranges):
    """Lowest offset of the first gap of at least `size` bytes between byte ranges (sorted by start),
    else the top of the highest range."""
    top = 0
    for low, high in ranges:
        if low - top >= size:
            return top
        top = max(top, high)
    return top
