"""The budget planner against Checkmate's optimum, and the solver's time against graph size.

    python benchmarks/remat_optimal.py [--time-limit 60] [--solver milp|cpsat] [--sizes]

Table 1: small training steps (Adam), each under budgets between its arena without recomputation
and less; per budget the recomputed FLOPs of remat="budget" and remat="optimal" (both planned and
verified by the real planner), the solver's gap, the optimal plan's time (both accountings, every
try), and the ratio of the two FLOPs. Below it: the worst and
geometric-mean ratio over the budgets both fit, and how many only the solver fits (it may recompute
a node more than once; one drop set cannot). Target: within 10% of optimal on graphs of <= 60 nodes.
`--sizes` adds table 2: the solver's time on deeper and deeper MLPs at 80% of their arena.
"""
import argparse
import math
import time

import numpy as np

import planner
from frontends import symbol as sym
from frontends import zoo
from planner.config import Config

SHARES = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7)


def cnn(depth=3, channels=4, resolution=32, classes=10):
    """Conv-Relu blocks on a wide image, then global pooling and a dense layer: activations dominate."""
    rng = np.random.default_rng(0)
    x, cin = sym.var("input", ("batch", 3, resolution, resolution)), 3
    for k in range(depth):
        w = sym.param(f"conv{k}.weight", rng.standard_normal((channels, cin, 3, 3)).astype(np.float32) * 0.1)
        x, cin = sym.relu(sym.conv2d(x, w, pad=1)), channels
    x = sym.flatten(sym.pooling(x, "global_avg"))
    return sym.dense(x, sym.param("fc.weight", rng.standard_normal((classes, channels)).astype(np.float32) * 0.1))


CASES = {  # name: (model, input shapes)
    "mlp 64x3, batch 512": (lambda: zoo.build("mlp", in_features=64, hidden=(64,) * 3, classes=10), {"input": (512, 64)}),
    "mlp 64x4, batch 512": (lambda: zoo.build("mlp", in_features=64, hidden=(64,) * 4, classes=10), {"input": (512, 64)}),
    "mlp 256x4, batch 2048": (lambda: zoo.build("mlp", in_features=256, hidden=(256,) * 4, classes=10),
                              {"input": (2048, 256)}),
    "cnn 3 convs, batch 64": (lambda: cnn(3), {"input": (64, 3, 32, 32)}),
    "cnn 4 convs, batch 64": (lambda: cnn(4), {"input": (64, 3, 32, 32)}),
}


def compile_step(model, shapes, config, **kw):
    return planner.compile(model, shapes, training=True, optimizer="adam", config=config, **kw)


def attempt(model, shapes, config, remat, budget):
    """(plan or None, seconds, the smallest budget when none fits)."""
    start = time.perf_counter()
    try:
        plan = compile_step(model, shapes, config, remat=remat, memory_budget=budget)
        return plan, time.perf_counter() - start, None
    except planner.InfeasibleBudgetError as e:
        return None, time.perf_counter() - start, e.minimum


def versus(config):
    print(f"{'graph':<24} {'nodes':>5} {'budget':>7} {'budget MiB':>10} {'heuristic GFLOP':>15} {'optimal GFLOP':>13} "
          f"{'gap':>6} {'plan s':>8} {'ratio':>6}")
    ratios, only_optimal, both_fail = [], 0, 0
    for name, (build, shapes) in CASES.items():
        model = build()
        none = compile_step(model, shapes, config)
        for share in SHARES:
            budget = int(share * none.arena_bytes)
            heuristic, _, low = attempt(model, shapes, config, "budget", budget)
            best, seconds, best_low = attempt(model, shapes, config, "optimal", budget)
            h = f"{heuristic.stats['recompute_flops'] / 1e9:.4f}" if heuristic else f"none (>= {low / 2**20:.2f} MiB)"
            o = f"{best.stats['recompute_flops'] / 1e9:.4f}" if best else f"none ({best_low / 2**20:.2f})"
            gap = f"{best.training['remat']['solver']['gap']:.1%}" if best else "-"
            ratio = "-"
            if heuristic and best:
                hf, of = heuristic.stats["recompute_flops"], best.stats["recompute_flops"]
                r = 1.0 if hf == of else hf / of if of else math.inf
                ratios.append(r)
                ratio = f"{r:.3f}"
            only_optimal += bool(best and not heuristic)
            both_fail += not best and not heuristic
            print(f"{name:<24} {len(none.steps):>5} {share:>7.0%} {budget / 2**20:>10.2f} {h:>15} {o:>13} {gap:>6} "
                  f"{seconds:>8.2f} {ratio:>6}")
    finite = [r for r in ratios if math.isfinite(r)]
    print(f"\nbudgets both fit: {len(ratios)}; heuristic/optimal recompute FLOPs: worst {max(ratios):.3f}, "
          f"geometric mean {math.exp(sum(map(math.log, finite)) / len(finite)):.3f}; within 10%: "
          f"{sum(r <= 1.1 for r in ratios)}/{len(ratios)}; only optimal fits: {only_optimal}; neither: {both_fail}")


def sizes(config):
    print(f"\n{'MLP hidden layers':>17} {'nodes':>5} {'plan s':>8} {'gap':>6}  status")
    for depth in (2, 4, 6, 8, 10, 12):
        model, shapes = zoo.build("mlp", in_features=64, hidden=(64,) * depth, classes=10), {"input": (512, 64)}
        none = compile_step(model, shapes, config)
        plan, seconds, low = attempt(model, shapes, config, "optimal", int(0.8 * none.arena_bytes))
        solver = plan.training["remat"]["solver"] if plan else {"gap": math.inf, "status": f"infeasible, >= {low}"}
        print(f"{depth:>17} {len(none.steps):>5} {seconds:>8.2f} {solver['gap']:>6.1%}  {solver['status'][:60]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve (MEMPLAN_TIME_LIMIT)")
    ap.add_argument("--solver", choices=("milp", "cpsat"), default="milp")
    ap.add_argument("--sizes", action="store_true", help="also time the solver against graph size")
    args = ap.parse_args()
    config = Config.from_env(time_limit=args.time_limit, remat_solver=args.solver)
    versus(config)
    if args.sizes:
        sizes(config)


if __name__ == "__main__":
    main()
