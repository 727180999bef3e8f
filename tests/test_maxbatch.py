"""planner.maxbatch.largest: the largest batch whose size fits, found along the size's line, against a plain
doubling and bisection on sizes that grow linearly, faster, with stairs, or stop (no plan) past a batch."""
import math
import random

from planner.maxbatch import largest


def bisection(size, budget):
    lo, hi = 0, 1
    while hi <= 1 << 20 and size(hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= budget else (lo, mid)
    return lo


def test_the_answer_is_bisections_and_each_batch_is_planned_once():
    rng = random.Random(0)
    for _ in range(2000):
        a, c, stair, power = rng.uniform(0, 1e3), rng.uniform(0.1, 100), rng.randint(1, 50), rng.uniform(1, 1.3)
        cap = rng.choice([None, None, rng.randint(1, 4000)])

        def size(b):
            return math.inf if cap and b > cap else a + c * b ** power + 256 * (b // stair)
        budget, planned = rng.uniform(0, 2e5), []
        got, known = largest(lambda b: planned.append(b) or size(b), budget, start=rng.randint(1, 5000),
                             slope=rng.choice([None, c, 3 * c, c / 3]))
        assert got == bisection(size, budget)
        assert len(planned) == len(set(planned)) == len(known)


def test_a_linear_size_takes_a_few_plans():
    planned = []
    got, _ = largest(lambda b: planned.append(b) or 5e6 + 3e5 * b, 2e9)
    assert got == int((2e9 - 5e6) // 3e5) and len(planned) <= 5
