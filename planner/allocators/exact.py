"""Exact offset search in the spirit of MiniMalloc (Moffitt, ASPLOS 2023), in plain Python.

A feasibility search decides whether every interval fits under a capacity. LOAD is tried first
(0.6 of the effort), then the capacity is bisected between the proven lower bound and the best plan
found (best fit's to begin with); a range left unproven by probes that ran out of effort is bisected
again with more. The answer is never worse than best fit and, when the probes end in "fits" at the
bound or "no" below it, proven optimal.

The search stops on a count, never on the clock, so that a plan is the same on a busy machine as on
a quiet one: its effort is the nodes it visits, each weighted by the intervals left to place there
(what a node costs), about a million a second on the 2-core box.

The feasibility search is a depth-first search over *canonical* solutions: intervals are placed in
non-decreasing order of offset, each at the lowest offset its placed neighbours allow (its
`floor`). At each node the unplaced intervals are tried in order of (floor, preorder rank), and
- canonical pruning: a child may not come before its parent in that order;
- dominance: an interval whose floor is at or above the lowest top any unplaced interval could
  reach leaves a gap that interval could fill, so it (and every later one) is skipped;
- inference: time is cut into sections (runs of steps with the same live set). Everything left
  goes at the current offset or above, so a section whose unplaced bytes do not fit there must
  lie in the lifetime of the interval placed next; the unplaced intervals of a section stack
  above the lowest of their floors; and every floor plus its size stays under the capacity;
- hatless pruning: if a failed interval touches no unplaced interval, no sibling does better;
- dynamic decomposition: when no unplaced interval crosses a section boundary any more, the two
  sides are searched one after the other, and a side that fails fails the placement that split.
The preorder rotates between six heuristics (MiniMalloc's three, by steps and by sections) under
a node limit that doubles (its round robin), so one unlucky order does not eat the effort.
"""
import sys
from dataclasses import dataclass, field

import numpy as np

from . import allocator, lower_bound
from .bestfit import bestfit

# MiniMalloc's default preorders: Width (steps), Area, Total (the fullest section's bytes), descending;
# and the same by sections spanned (C) and bytes x sections (B), which solve other instances fast
HEURISTICS = ("WAT", "TAW", "TWA", "CBT", "TBC", "TCB")
EFFORT_PER_SECOND = 1_000_000
"""About the effort of a second on the 2-core box: what a time limit in seconds stands for."""
EFFORT = 10 * EFFORT_PER_SECOND
"""The `exact` allocator's effort by default."""
AUTO_EFFORT = 2 * EFFORT_PER_SECOND
"""The "auto" strategy's at most: about 2 s, where the search proves LOAD on the zoo's and held-out models'
plans in a tenth of it (benchmarks/plan_quality.py); a plan of more than 2,000 buffers, which one probe could
not place within it, is best fit's."""
AUTO_PLACEMENTS = 8
"""The "auto" strategy's effort is at most that of placing every buffer this many times (n (n + 1) / 2 each):
proving LOAD took at most 3.5 on those plans, and a plan whose LOAD does not fit costs no more."""


class _OutOfEffort(Exception):
    pass


class _NodeLimit(Exception):
    pass


@dataclass
class ExactResult:
    """What `exact_search` found: the offsets and total, LOAD, the proven lower bound on any
    arena, whether the total is proven optimal, best fit's total, and the search's nodes and effort."""
    offsets: list
    total: int
    load: int
    lower: int
    optimal: bool
    bestfit: int
    nodes: int = 0
    effort: int = 0
    probes: list = field(default_factory=list)  # (capacity, "fits" | "no" | "out of effort")

    @property
    def gap(self):
        """How far the total may be above the optimum, as a fraction of the proven lower bound."""
        return self.total / self.lower - 1 if self.lower else 0.0


@allocator("exact")
def exact(sizes, starts, ends, alignment, effort=EFFORT):
    """The smallest arena the exact search finds within `effort`; never worse than best fit."""
    result = exact_search(sizes, starts, ends, alignment, effort)
    return result.offsets, result.total


@allocator("auto")
def auto(sizes, starts, ends, alignment, effort=AUTO_EFFORT, initial=None, report=None):
    """Best fit (or the `initial` plan), then the exact search within `effort` where that is above LOAD: never
    larger than best fit, and the same on every machine. `report`, a dict when given, is filled as the
    `optimal` allocator's is: {"by": "exact" or "bestfit", "optimal", "lower_bytes", "load_bytes", "gap",
    "effort"}."""
    live = sum(1 for size in sizes if size)
    result = exact_search(sizes, starts, ends, alignment, min(effort, AUTO_PLACEMENTS * live * (live + 1) // 2),
                          initial)
    if report is not None:
        report.update(by="bestfit" if result.total == result.bestfit else "exact", optimal=result.optimal,
                      lower_bytes=result.lower, load_bytes=result.load, gap=result.gap, effort=result.effort)
    return result.offsets, result.total


def exact_search(sizes, starts, ends, alignment=256, effort=EFFORT, initial=None):
    """Search offsets for (aligned) `sizes` within `effort` (see the module); `initial` is a known plan
    (offsets, total), best fit's by default. Returns an ExactResult. Where one probe could not place
    every interval within the effort, no probe is made."""
    offsets, total = initial or bestfit(sizes, starts, ends, alignment)
    offsets = list(offsets)
    load = lower_bound(sizes, starts, ends, alignment)
    result = ExactResult(offsets, total, load, load, total <= load, total)
    live = [i for i, size in enumerate(sizes) if size]
    if result.optimal or len(live) <= 1:
        result.optimal, result.lower = True, total
        return result
    if len(live) * (len(live) + 1) // 2 > effort:
        return result
    problem = _Problem([sizes[i] for i in live], [starts[i] for i in live], [ends[i] for i in live])
    lo, hi = load, total  # lo: the lowest capacity left to try; hi: a plan of that total exists
    first, rounds = True, 0
    while True:
        left = effort - result.effort
        if left <= 0:
            break
        if lo >= hi:  # probes out of effort left a range unproven: bisect it again, with more effort
            if result.lower >= hi or left < 0.1 * effort:
                break
            lo, rounds = result.lower, rounds + 1
        if first:  # LOAD first: on real models the optimum is usually there
            capacity, budget = lo, 0.6 * left
        else:
            steps = max(1, (hi - lo) // alignment).bit_length()
            capacity = lo + ((hi - lo) // alignment - 1) // 2 * alignment
            budget = min(left, max(left / steps * 2 ** rounds, 0.05 * effort))
        outcome, found = problem.fits(capacity, int(budget))
        result.nodes += problem.nodes
        result.effort += problem.effort
        if outcome == "fits":
            top = max(o + s for o, s in zip(found, problem.sizes))
            offsets = [0] * len(sizes)
            for i, offset in zip(live, found):
                offsets[i] = offset
            result.offsets, result.total, hi = offsets, top, top
        elif outcome == "no":
            lo = result.lower = capacity + alignment
        else:
            lo = capacity + alignment  # unproven: look higher, but the lower bound stays
        result.probes.append((capacity, outcome))
        first = False
    result.lower = min(result.lower, result.total)
    result.optimal = result.lower >= result.total
    return result


class _Problem:
    """Intervals (non-empty, aligned) cut into sections and partitions, ready for `fits`."""

    def __init__(self, sizes, starts, ends):
        n = len(sizes)
        self.sizes = sizes
        self.widths = [e - s + 1 for s, e in zip(starts, ends)]  # lifetimes in steps, for the preorders
        bounds = sorted(set(starts) | {e + 1 for e in ends})
        index = {b: k for k, b in enumerate(bounds)}
        self.first = [index[s] for s in starts]  # sections [first, last) of each interval
        self.last = [index[e + 1] for e in ends]
        self.sections = len(bounds) - 1
        self.members = [[] for _ in range(self.sections)]  # the intervals live in each section
        for i in range(n):
            for s in range(self.first[i], self.last[i]):
                self.members[s].append(i)
        s_arr, e_arr = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        self.overlaps = []
        for i in range(n):
            hit = np.flatnonzero((s_arr <= ends[i]) & (e_arr >= starts[i]))
            self.overlaps.append([j for j in hit.tolist() if j != i])
        # partitions: runs of sections no interval crosses between
        order = sorted(range(n), key=lambda i: self.first[i])
        self.partitions, reach = [], -1
        for i in order:
            if self.first[i] >= reach:
                self.partitions.append([])
            self.partitions[-1].append(i)
            reach = max(reach, self.last[i])
        self.nodes = self.effort = 0

    def fits(self, capacity, effort):
        """("fits", offsets) when every interval fits under `capacity`, ("no", None) when none can,
        ("out of effort", None) when `effort` was spent first."""
        self.nodes = self.effort = 0
        sizes = self.sizes
        if max(sizes) > capacity:
            return "no", None
        totals = [0] * self.sections
        for i, size in enumerate(sizes):
            for s in range(self.first[i], self.last[i]):
                totals[s] += size
        if max(totals) > capacity:
            return "no", None
        offsets = [0] * len(sizes)
        limit = sys.getrecursionlimit()  # the search recurses once per placement (and group)
        sys.setrecursionlimit(max(limit, 3 * len(sizes) + 1000))
        try:
            for part in self.partitions:
                outcome = self._fits_partition(part, capacity, effort, totals, offsets)
                if outcome != "fits":
                    return outcome, None
        except RecursionError:
            return "out of effort", None
        finally:
            sys.setrecursionlimit(limit)
        return "fits", offsets

    def _fits_partition(self, part, capacity, effort, totals, offsets):
        """Round robin over the preorders with a doubling node limit (MiniMalloc's), within what is left of
        `effort`."""
        if len(part) == 1:
            offsets[part[0]] = 0
            return "fits"
        ranks = [self._preorder(part, totals, h) for h in HEURISTICS]
        limit = len(part)
        while True:
            limit *= 2
            for rank in ranks:
                search = _Search(self, part, rank, capacity, effort - self.effort, limit, totals)
                try:
                    found = search.run()
                except _NodeLimit:
                    continue
                except _OutOfEffort:
                    return "out of effort"
                finally:
                    self.nodes, self.effort = self.nodes + search.nodes, self.effort + search.effort
                if found is None:
                    return "no"
                for i in part:
                    offsets[i] = found[i]
                return "fits"

    def _preorder(self, part, totals, heuristic):
        """{interval: rank} under a heuristic: W lifetime in steps, A area (bytes x steps), C sections
        spanned, B bytes x sections, T the fullest section's bytes, each descending; ties by index."""
        first, last, sizes, widths = self.first, self.last, self.sizes, self.widths
        keys = {
            "W": lambda i: -widths[i],
            "A": lambda i: -widths[i] * sizes[i],
            "C": lambda i: -(last[i] - first[i]),
            "B": lambda i: -(last[i] - first[i]) * sizes[i],
            "T": lambda i: -max(totals[first[i]:last[i]]),
        }
        order = sorted(part, key=lambda i: tuple(keys[c](i) for c in heuristic) + (i,))
        return {i: r for r, i in enumerate(order)}


class _Search:
    """One depth-first feasibility search of a partition under a capacity and a node limit."""

    def __init__(self, problem, part, rank, capacity, effort, limit, totals):
        self.sizes, self.first, self.last = problem.sizes, problem.first, problem.last
        self.overlaps, self.members = problem.overlaps, problem.members
        self.capacity, self.allowed, self.limit = capacity, effort, limit
        self.total = list(totals)  # unplaced bytes per section
        self.placed = 4 * capacity + 1  # the floor of a placed interval: above everything
        self.floor = [self.placed] * len(problem.sizes)  # lowest offset each unplaced interval may take
        for i in part:
            self.floor[i] = 0
        self.pending = set(part)
        self.radix = len(problem.sizes)  # sort key of a candidate: floor * radix + rank
        self.rank = [0] * self.radix
        self.by_rank = [0] * self.radix
        for i, r in rank.items():
            self.rank[i], self.by_rank[r] = r, i
        self.offsets = {}
        self.begin, self.end = min(problem.first[i] for i in part), max(problem.last[i] for i in part)
        self.nodes, self.effort, self.solution = 0, 0, None
        self.queue = []  # groups left: (set, begin, end, code)
        self.free = [len(o) for o in problem.overlaps]  # unplaced neighbours of each interval
        self.cuts = [0] * len(totals)  # unplaced intervals live on both sides of each section boundary
        for i in part:
            for s in range(problem.first[i], problem.last[i] - 1):
                self.cuts[s] += 1

    def run(self):
        """{interval: offset} of a solution, or None when none exists."""
        return self.solution if self._search(-1, 0) == 1 else None

    def _search(self, low, depth):
        """1 when the pending intervals (and the queued groups) fit, 0 when not, or the code of the
        decomposition to return to when a queued group cannot fit whatever came before it."""
        pending, floor, rank, sizes, radix = self.pending, self.floor, self.rank, self.sizes, self.radix
        self.nodes += 1
        self.effort += len(pending) + 1
        if self.nodes > self.limit:
            raise _NodeLimit
        if self.effort > self.allowed:
            raise _OutOfEffort
        if not pending:
            return self._next_group(depth)
        keys = sorted([floor[i] * radix + rank[i] for i in pending])
        ceiling = min([floor[i] + sizes[i] for i in pending])
        capacity, total, begin, end, placed = self.capacity, self.total, self.begin, self.end, self.placed
        first, last, overlaps, offsets, by_rank = self.first, self.last, self.overlaps, self.offsets, self.by_rank
        members, cuts, code, free = self.members, self.cuts, depth + 2, self.free
        hot_offset = hot_lo = hot_hi = -1
        for key in keys:
            if key <= low:
                continue  # canonical: placements come in (offset, rank) order
            i = by_rank[key % radix]
            offset = floor[i]
            if offset >= ceiling:
                break  # dominance: it would leave a gap some unplaced interval fills; so would all later
            if offset != hot_offset:  # sections too full for everything left to go at `offset` or above
                hot_offset, over = offset, capacity - offset
                hot = [s for s, t in enumerate(total[begin:end], begin) if t > over]
                hot_lo, hot_hi = (hot[0], hot[-1] + 1) if hot else (end, begin)
            a, b = first[i], last[i]
            if a > hot_lo or b < hot_hi or offset + max(total[a:b]) > capacity:
                # it must be live in every such section, or those stay too full; and its own
                # sections' unplaced bytes must stack above it
                if not free[i]:
                    break  # hatless (below)
                continue
            size = sizes[i]
            height = offset + size
            floor[i] = placed
            pending.remove(i)
            offsets[i] = offset
            raised, ok, lo, hi = [], True, a, b
            for j in overlaps[i]:
                f = floor[j]
                if f < height:
                    raised.append((j, f))
                    floor[j] = height
                    if height + sizes[j] > capacity:
                        ok = False
                        break
                    if first[j] < lo:
                        lo = first[j]
                    if last[j] > hi:
                        hi = last[j]
            for s in range(a, b):
                total[s] -= size
            # every unplaced interval goes at `offset` or above, so each section must fit its bytes
            # there: outside its sections by the hot check, inside by `offset + bytes` (`height +
            # bytes left`) above
            if ok and raised:
                # a section's unplaced intervals stack above the lowest of their floors. That lowest
                # floor is now at most max(before, height), and before + bytes fitted (checked when
                # it last rose; bytes only fall), so only sections with height + bytes over need a look
                fetch, over = floor.__getitem__, capacity - height
                for s in range(lo, hi):
                    t = total[s]
                    if t > over and min(map(fetch, members[s])) + t > capacity:
                        ok = False
                        break
            split = False
            for s in range(a, b - 1):
                cuts[s] -= 1
                if not cuts[s]:
                    split = True
            if ok:
                for j in overlaps[i]:
                    free[j] -= 1
                groups = self._groups(pending) if split and pending else ()
                if len(groups) > 1:  # nothing unplaced crosses a cut: solve the sides separately
                    self.queue += [(g, gb, ge, code) for g, gb, ge in reversed(groups[1:])]
                    self.pending, self.begin, self.end = groups[0]
                    ok = self._search(-1, depth + 1)
                    self.pending, self.begin, self.end = pending, begin, end
                    del self.queue[len(self.queue) - len(groups) + 1:]
                else:
                    ok = self._search(key, depth + 1)
                for j in overlaps[i]:
                    free[j] += 1
            for s in range(a, b - 1):
                cuts[s] += 1
            for s in range(a, b):
                total[s] += size
            for j, f in raised:
                floor[j] = f
            del offsets[i]
            floor[i] = offset
            pending.add(i)
            if ok == 1:
                return 1
            if ok and ok != code:
                return ok  # a later group failed whatever is chosen here: back to its decomposition
            if not free[i]:
                break  # hatless: nothing unplaced felt this interval; no sibling does better
        return 0

    def _next_group(self, depth):
        """At a leaf: search the next queued group, or record the solution when none is left."""
        if not self.queue:
            self.solution = dict(self.offsets)
            return 1
        entry = self.queue.pop()
        saved = self.pending, self.begin, self.end
        self.pending, self.begin, self.end = entry[0], entry[1], entry[2]
        found = self._search(-1, depth + 1)
        self.pending, self.begin, self.end = saved
        self.queue.append(entry)
        return found if found else entry[3]

    def _groups(self, pending):
        """The pending intervals split where no pending interval crosses: [(set, begin, end)]."""
        first, last = self.first, self.last
        groups, reach = [], -1
        for j in sorted(pending, key=first.__getitem__):
            if first[j] >= reach:
                groups.append([set(), first[j], 0])
            group = groups[-1]
            group[0].add(j)
            reach = group[2] = max(reach, last[j])
        return groups
