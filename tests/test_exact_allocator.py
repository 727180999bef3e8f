"""The exact allocator: optimal against brute force on small random interval sets, never worse than
best fit on larger ones, and its plans checked by the shared conflict checker."""
import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.allocators import allocate, lower_bound
from planner.allocators.bestfit import bestfit
from planner.allocators.exact import exact_search
from planner.allocators.optimal import optimal
from test_allocators import U, check, run


def brute_force(sizes, starts, ends):
    """The smallest arena over every placement order, each interval at its lowest free offset: an
    optimal plan sorted by offset is one of these (push every interval down as far as it goes)."""
    best = None
    for order in itertools.permutations(range(len(sizes))):
        offsets = {}
        for i in order:
            taken = sorted((offsets[j], offsets[j] + sizes[j]) for j in offsets
                           if starts[i] <= ends[j] and starts[j] <= ends[i])
            offset = 0
            for low, high in taken:
                if low - offset >= sizes[i]:
                    break
                offset = max(offset, high)
            offsets[i] = offset
        top = max(offsets[i] + sizes[i] for i in offsets)
        best = top if best is None else min(best, top)
    return best


def random_intervals(rng, n, steps=8, units=6):
    sizes = [rng.randint(1, units) * U for _ in range(n)]
    starts = [rng.randrange(steps) for _ in range(n)]
    ends = [s + rng.randrange(steps // 2 + 1) for s in starts]
    return sizes, starts, ends


def test_matches_brute_force_on_small_sets():
    rng = random.Random(21)
    for _ in range(150):
        sizes, starts, ends = random_intervals(rng, rng.randint(1, 7))
        result = exact_search(sizes, starts, ends, U, effort=5_000_000)
        check(sizes, starts, ends, result.offsets, result.total)
        assert result.optimal
        assert result.total == brute_force(sizes, starts, ends), (sizes, starts, ends)


def test_never_worse_than_bestfit_on_larger_sets():
    rng = random.Random(7)
    for n in (20, 40, 80):
        for _ in range(3):
            sizes, starts, ends = random_intervals(rng, n, steps=30, units=40)
            _, fit = bestfit(sizes, starts, ends, U)
            offsets, total = run("exact", sizes, starts, ends, effort=500_000)
            assert lower_bound(sizes, starts, ends, U) <= total <= fit


def test_alignment_and_empty_intervals():
    sizes, starts, ends = [300, 0, 1000, 5, 0], [0, 0, 1, 2, 3], [2, 4, 3, 4, 3]
    offsets, total = run("exact", sizes, starts, ends, alignment=512, effort=2_000_000)
    assert all(o % 512 == 0 for o in offsets)
    assert total == lower_bound(sizes, starts, ends, 512)


def test_running_out_of_effort_returns_bestfit_or_better():
    rng = random.Random(3)
    sizes, starts, ends = random_intervals(rng, 150, steps=60, units=200)
    _, fit = bestfit(sizes, starts, ends, U)
    result = exact_search(sizes, starts, ends, U, effort=10_000)
    check(sizes, starts, ends, result.offsets, result.total)
    assert result.total <= fit and result.lower <= result.total
    assert result.optimal == (result.lower == result.total)


def test_optimal_keeps_the_best_and_records_it():
    rng = random.Random(5)
    sizes, starts, ends = random_intervals(rng, 12, steps=10, units=8)
    offsets, total = optimal(sizes, starts, ends, U, time_limit=2.0)
    check(sizes, starts, ends, offsets, total)
    assert total == exact_search(sizes, starts, ends, U, effort=1_000_000).total


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=6))
def test_hypothesis_small_sets_are_optimal(rows):
    sizes = [r[0] * U for r in rows]
    starts = [r[1] for r in rows]
    ends = [r[1] + r[2] for r in rows]
    offsets, total = allocate("exact", sizes, starts, ends, U, effort=5_000_000)
    check(sizes, starts, ends, offsets, total)
    assert total == brute_force(sizes, starts, ends)


def test_many_intervals_recurse_deeper_than_the_default_limit():
    # 1,500 intervals in one staircase, each overlapping the next: best fit misses LOAD, so the
    # search places all of them, one recursion level each; the recursion limit is restored
    import sys
    rng = random.Random(11)
    n = 1500
    sizes = [rng.randint(1, 4) * U for _ in range(n)]
    starts = list(range(n))
    ends = [s + rng.randint(1, 3) for s in starts]
    limit = sys.getrecursionlimit()
    result = exact_search(sizes, starts, ends, U, effort=3_000_000)
    check(sizes, starts, ends, result.offsets, result.total)
    assert result.bestfit > result.load and result.probes[0] == (result.load, "fits")
    assert sys.getrecursionlimit() == limit
