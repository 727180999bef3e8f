"""Recomputation against keeping everything, for one training step (momentum SGD).

    python benchmarks/remat.py [--model resnet_deep] [--batch 32] [--time [--backend cupy]] [--budget MIB ...]
                               [--max-batch GIB]

Per strategy: the arena, its transient part (activations, gradients and workspace: the arena less
params and optimizer state), that part against no recomputation, the activations saved for backward
at the peak, the recomputed FLOPs as a share of the step's forward + backward FLOPs, and the plan
time. `--budget` adds a row per budget (MiB) planned with memory_budget=, and DTR simulated under
the same budget on the plan without recomputation. `--time` also runs three
steps on the NumPy backend (`--backend cupy`: on the GPU) and prints the median step time.
`--max-batch G` instead finds, per strategy, the largest batch whose arena fits G GiB (doubling, then
bisection).
Targets (Chen et al.): sublinear transient <= 1/4 of none with <= 35% extra FLOPs; mirror 30-50% less.
"""
import argparse
import statistics
import time

import numpy as np

import planner
from frontends import zoo
from planner import maxbatch
from planner.remat import dtr

MiB = 2 ** 20


def shapes(name, batch):
    return {"resnet_deep": {"input": (batch, 3, 32, 32)}, "resnet50": {"input": (batch, 3, 224, 224)}}[name]


def step_seconds(plan, backend):
    """Median of three training steps on `backend`, after a warm-up one (each returns its loss, so a
    GPU step has finished when it is timed)."""
    from executor import Executor
    ex = Executor(plan, backend=backend)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(plan.tensors[n].shape, dtype=np.float32) for n in plan.inputs
             if plan.tensors[n].dtype == "float32"}
    feeds[plan.training["labels"]] = rng.integers(0, 10, plan.tensors[plan.training["labels"]].shape)
    times = []
    for _ in range(4):
        start = time.perf_counter()
        ex.train_step(feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def arena(model, name, batch, remat):
    return planner.compile(model, shapes(name, batch), training=True, optimizer="momentum", remat=remat).arena_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet_deep", choices=["resnet_deep", "resnet50"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--time", action="store_true", help="also time training steps")
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"], help="where --time runs the steps")
    parser.add_argument("--budget", type=float, nargs="*", default=[], metavar="MIB",
                        help="also plan under each of these budgets (MiB)")
    parser.add_argument("--max-batch", type=float, default=None, metavar="GIB",
                        help="the largest batch fitting GIB GiB per strategy, instead of the table")
    args = parser.parse_args()
    model = zoo.build(args.model)
    if args.max_batch:
        print(f"{args.model}: largest training batch (momentum SGD) whose arena fits {args.max_batch:g} GiB")
        base = None
        for remat in (None, "mirror", "sublinear"):
            batch, _ = maxbatch.largest(lambda b: arena(model, args.model, b, remat), int(args.max_batch * 2**30))
            base = base or batch
            print(f"{remat or 'none':<10} {batch:>6} {batch / base:>6.2f}x", flush=True)
        return
    print(f"{args.model}, batch {args.batch}, training step with momentum SGD")
    print(f"{'remat':<10} {'arena MiB':>10} {'transient MiB':>14} {'x none':>7} {'saved MiB':>10} "
          f"{'recompute':>10} {'plan s':>7}" + (f" {'step s':>7}" if args.time else ""))
    base = none = None
    rows = [(remat or "none", {"remat": remat}) for remat in (None, "mirror", "sublinear")]
    rows += [(f"{mib:g} MiB", {"memory_budget": int(mib * MiB)}) for mib in args.budget]
    for label, options in rows:
        try:
            plan = planner.compile(model, shapes(args.model, args.batch), training=True, optimizer="momentum",
                                   **options)
        except planner.InfeasibleBudgetError as e:
            print(f"{label:<10} does not fit: {e}")
            continue
        none = none or plan
        transient = plan.arena_bytes - plan.breakdown["params"] - plan.breakdown["optimizer"]
        base = base or transient
        share = plan.stats["recompute_flops"] / (plan.stats["forward_flops"] + plan.stats["backward_flops"])
        print(f"{label:<10} {plan.arena_bytes / MiB:>10,.1f} {transient / MiB:>14,.1f} {transient / base:>7.3f} "
              f"{plan.breakdown['saved'] / MiB:>10,.1f} {share:>10.1%} {plan.stats['plan_seconds']:>7.1f}"
              + (f" {step_seconds(plan, args.backend):>7.2f}" if args.time else ""), flush=True)
    for mib in args.budget:
        result = dtr.simulate(none, int(mib * MiB) - none.stats["persistent_bytes"])
        flops = none.stats["forward_flops"] + none.stats["backward_flops"]
        print(f"dtr {mib:g} MiB: " + (f"recomputes {result.recompute_flops / flops:.1%} of the step's FLOPs "
                                      f"({result.evictions} evictions)" if result.feasible else "does not fit"))


if __name__ == "__main__":
    main()
