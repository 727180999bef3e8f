"""The exact allocator against best fit on MiniMalloc's benchmark CSVs (or the zoo's intervals).

    python benchmarks/minimalloc.py DIR [--time-limit 20]      # DIR of id,lower,upper,size CSVs
    python benchmarks/minimalloc.py --zoo [--batch 32]         # the zoo models' transient buffers

The CSVs (google/minimalloc's benchmarks/challenging) are not vendored: clone that repository and
pass the directory. `upper` is exclusive; the capacity is 1,048,576 bytes. Offsets are aligned to
the sizes' greatest common divisor, so nothing is rounded. Per instance: buffers, LOAD, best fit
and exact as multiples of LOAD, whether exact fits the capacity, whether it proved optimality,
and seconds (best fit and the exact search); then the averages. The zoo rows have no capacity.
"""
import argparse
import csv
import math
import os
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), os.path.dirname(os.path.abspath(__file__))]

from planner.allocators import lower_bound  # noqa: E402
from planner.allocators.bestfit import bestfit  # noqa: E402
from planner.allocators.exact import EFFORT_PER_SECOND, exact_search  # noqa: E402

CAPACITY = 1_048_576


def read_csv(path):
    """(sizes, starts, ends) with inclusive ends."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return ([int(r["size"]) for r in rows], [int(r["lower"]) for r in rows], [int(r["upper"]) - 1 for r in rows])


def zoo_cases(batch=1):
    """(name, sizes, starts, ends, alignment) of each zoo model's transient buffers as best fit plans them
    (MobileNetV2's blocks as exported, not fused: the instances stay those of the table)."""
    import planner
    from frontends import zoo
    from plan_quality import _image, buffers, shapes
    for name in zoo.NAMES:
        model = zoo.build(name)
        graph = planner.load(model, shapes(name, batch) or {"input": (batch, *_image(model))})
        yield (name, *buffers(planner.compile(graph, strategy="bestfit", inverted_residual=False)), 256)


def solve(sizes, starts, ends, alignment, time_limit, capacity=CAPACITY):
    """One row: buffers, LOAD, best fit / LOAD, exact / LOAD, fits, optimal, seconds, and the check."""
    began = time.monotonic()
    _, fit = bestfit([-(-s // alignment) * alignment for s in sizes], starts, ends, alignment)
    result = exact_search([-(-s // alignment) * alignment for s in sizes], starts, ends, alignment,
                          int(EFFORT_PER_SECOND * time_limit))
    seconds = time.monotonic() - began
    load = lower_bound(sizes, starts, ends, alignment)
    _verify(sizes, starts, ends, result.offsets, result.total)
    fits = None if capacity is None else result.total <= capacity
    return len(sizes), load, fit / load, result.total / load, fits, result.optimal, seconds


def _verify(sizes, starts, ends, offsets, total):
    for i in range(len(sizes)):
        assert 0 <= offsets[i] and offsets[i] + sizes[i] <= total
        for j in range(i):
            if starts[i] <= ends[j] and starts[j] <= ends[i] and sizes[i] and sizes[j]:
                assert offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i], (i, j)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", help="a directory of id,lower,upper,size CSVs")
    parser.add_argument("--time-limit", type=float, default=20.0,
                        help="the search's effort per instance, in seconds of the 2-core box (default 20)")
    parser.add_argument("--zoo", action="store_true", help="the zoo models instead of CSVs")
    parser.add_argument("--batch", type=int, default=1, help="the zoo models' batch (default 1)")
    args = parser.parse_args()
    if args.zoo:
        cases = zoo_cases(args.batch)
    elif args.dir:
        def cases():
            for file in sorted(f for f in os.listdir(args.dir) if f.endswith(".csv")):
                sizes, starts, ends = read_csv(os.path.join(args.dir, file))
                yield file.split(".")[0], sizes, starts, ends, math.gcd(*sizes) or 1
        cases = cases()
    else:
        parser.error("give a directory of CSVs or --zoo")
    print(f"{'instance':<22}{'buffers':>8}{'LOAD':>15}{'bestfit':>9}{'exact':>8}{'fits':>6}{'optimal':>9}{'s':>7}")
    rows = []
    for name, sizes, starts, ends, alignment in cases:
        row = solve(sizes, starts, ends, alignment, args.time_limit, None if args.zoo else CAPACITY)
        rows.append(row)
        n, load, fit, found, fits, optimal, seconds = row
        print(f"{name:<22}{n:>8}{load:>15,}{fit:>9.3f}{found:>8.3f}{'-' if fits is None else 'yes' if fits else 'no':>6}"
              f"{'yes' if optimal else 'no':>9}{seconds:>7.1f}", flush=True)
    if rows:
        mean = lambda k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
        print(f"{'average':<22}{'':>8}{'':>15}{mean(2):>9.3f}{mean(3):>8.3f}{sum(bool(r[4]) for r in rows):>6}"
              f"{sum(r[5] for r in rows):>9}{mean(6):>7.1f}")


if __name__ == "__main__":
    main()
