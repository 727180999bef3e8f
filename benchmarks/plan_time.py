"""Planning time against graph size: `planner.compile` (bestfit, auto schedule: both orders planned)
on graphs of about 1k to 100k nodes, and the growth fitted as time ~ nodes^k (least squares on logs).

    python benchmarks/plan_time.py [--sizes 1000 3000 10000 30000 100000] [--repeat 3]

Two families: a chain alternating Relu and Add (every tensor dies at the next node), and residual
towers (zoo resnet_deep inference at growing depth: skip connections keep tensors alive longer).
"""
import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

import planner
from frontends import zoo

sys.path.insert(0, str(Path(__file__).parent))
from load_time import chain  # noqa: E402

NODES_PER_DEPTH = 7
"""resnet_deep inference has about this many nodes per unit of depth."""


def seconds(model, shapes, repeat):
    """(fastest compile in seconds, the plan's steps)."""
    best, steps = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        plan = planner.compile(model, shapes)
        best, steps = min(best, time.perf_counter() - start), len(plan.steps)
    return best, steps


def growth(points):
    """k of time ~ nodes^k, fitted on logs."""
    nodes, times = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(nodes, times, 1)[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000, 30000, 100000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}; fastest of {args.repeat}")
    print(f"{'graph':<12} {'nodes':>8} {'compile s':>10} {'us/node':>8}")
    for family in ("chain", "residual"):
        points = []
        for size in args.sizes:
            if family == "chain":
                model, shapes = chain(size), {"x": (32, 64)}
            else:
                model = zoo.build("resnet_deep", depth=max(2, size // NODES_PER_DEPTH), channels=8, resolution=8)
                shapes = {"input": (4, 3, 8, 8)}
            took, steps = seconds(model, shapes, args.repeat)
            points.append((steps, took))
            print(f"{family:<12} {steps:>8,} {took:>10.3f} {1e6 * took / steps:>8.1f}", flush=True)
        print(f"{family}: compile time grows as nodes^{growth(points):.2f}")


if __name__ == "__main__":
    main()
