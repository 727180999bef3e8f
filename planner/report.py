"""`memplan report`: the arena each strategy needs for one model, beside the lower bound LOAD."""
from dataclasses import asdict, replace

from .config import Config

ROWS = (  # label, strategy, Config changes
    ("naive", "naive", {}),
    ("inplace", "inplace", {}),
    ("share", "share", {}),
    ("share (auto search)", "share", {"auto_search_match_range": True}),
    ("bestfit", "bestfit", {}),
    ("optimal", "optimal", {}),
)


def report(graph, config=None, time_limit=2.0, schedule="auto", strategies=None, **training):
    """One row per strategy for a typed graph: the plan, and its label. `optimal` searches for at
    most `time_limit` seconds. `training` (training=True, loss=, optimizer=, ...) plans training steps.
    `strategies` keeps only those rows, and always naive and bestfit, which the savings and the
    baselines are measured against."""
    from .compiler import compile
    config = config or Config.from_env()
    rows = []
    for label, strategy, changes in ROWS:
        if strategies is not None and strategy not in {*strategies, "naive", "bestfit"}:
            continue
        if strategy == "optimal":
            changes = {**changes, "time_limit": time_limit}
        if strategy == "share" and not changes and config.auto_search_match_range:
            changes = {"auto_search_match_range": False}
        plan = compile(graph, strategy=strategy, schedule=schedule, config=replace(config, **changes), **training)
        rows.append((label, plan))
    return rows


def workspace_modes(graph, config=None, schedule="auto", **training):
    """{mode: bestfit plan} for both workspace modes: MXNet's pooled slots and one-step tensors."""
    from .compiler import compile
    config = config or Config.from_env()
    return {mode: compile(graph, schedule=schedule, config=replace(config, workspace_mode=mode), **training)
            for mode in ("pool", "tensor")}


def update_modes(graph, config=None, schedule="auto", **training):
    """{update: bestfit plan} of a training step: each param updated as soon as its gradient is complete
    ("eager"), and every gradient first, then the optimizer ("after_backward", PyTorch's usual loop)."""
    from .compiler import compile
    return {mode: compile(graph, schedule=schedule, config=config, **{**training, "update": mode})
            for mode in ("eager", "after_backward")}


def remat_modes(graph, config=None, schedule="auto", memory_budget=None, **training):
    """{label: bestfit plan} of a training step without recomputation, under mirror and sublinear,
    and under `memory_budget` when given, by the budget planner and by the optimal solver (the error
    in place of a plan when none fits or the solver cannot answer)."""
    from .compiler import compile
    from .errors import InfeasibleBudgetError, PlanError
    modes = {"none": {"remat": None}, "mirror": {"remat": "mirror"}, "sublinear": {"remat": "sublinear"}}
    if memory_budget is not None:
        for remat in ("budget", "optimal"):
            modes[f"{remat}({mib(memory_budget)} MiB)"] = {"remat": remat, "memory_budget": memory_budget}
    plans = {}
    for label, options in modes.items():
        try:
            plans[label] = compile(graph, schedule=schedule, config=config, **{**training, **options})
        except (InfeasibleBudgetError, PlanError) as e:
            if options["remat"] not in ("budget", "optimal"):
                raise
            plans[label] = e
    return plans


def mib(nbytes):
    """Bytes in MiB for a label: whole MiB from 10 MiB up, else two decimals."""
    return f"{nbytes / 2**20:.0f}" if nbytes >= 10 * 2**20 else f"{nbytes / 2**20:.2f}"


def lower_bound(rows):
    """The LOAD row: the smallest lower bound among the plans that reuse memory in place."""
    return min(plan.lower_bound_bytes for label, plan in rows if plan.strategy != "naive")


def baselines(plan):
    """MXNet's Naive and Round pools replayed on `plan`'s schedule, and every buffer kept: what it saves."""
    from . import pools
    return {"naive_pool": asdict(pools.simulate(plan, "naive")), "round_pool": asdict(pools.simulate(plan, "round")),
            "keep_everything": pools.keep_everything(plan)}


def as_dict(rows, graph, modes, updates=None, remats=None, budget=None):
    """The report as plain data; with `budget`, DTR simulated under it on the plan without recomputation;
    the baselines on the bestfit row's plan."""
    load, naive = lower_bound(rows), rows[0][1].arena_bytes
    extra = {} if not updates else {"training": rows[0][1].training["optimizer"], "update_modes": {
        m: {"arena_bytes": p.arena_bytes, "breakdown": p.breakdown} for m, p in updates.items()},
        "forward_flops": rows[0][1].stats["forward_flops"], "backward_flops": rows[0][1].stats["backward_flops"]}
    if remats:
        step = rows[0][1].stats["forward_flops"] + rows[0][1].stats["backward_flops"]
        extra["remat"] = [{"remat": m, "error": str(p)} if isinstance(p, Exception) else
                          {"remat": m, "arena_bytes": p.arena_bytes, "x_load": p.arena_bytes / load,
                           "saved_bytes": p.breakdown["saved"], "recompute_flops": p.stats["recompute_flops"],
                           "recompute_share": p.stats["recompute_flops"] / step, "plan_seconds": p.stats["plan_seconds"],
                           **({"gap": p.training["remat"]["solver"]["gap"]} if "solver" in p.training["remat"] else {})}
                          for m, p in remats.items()]
        if budget is not None:
            from .remat import dtr
            none = remats["none"]
            result = dtr.simulate(none, budget - none.stats["persistent_bytes"])
            extra["dtr"] = {"budget_bytes": budget, "feasible": result.feasible, "evictions": result.evictions,
                            "recompute_flops": result.recompute_flops, "recompute_share": result.recompute_flops / step}
    return {"model": graph.name, "inputs": {n: list(graph.tensors[n].shape) for n in graph.inputs}, **extra,
            "lower_bound_bytes": load, "baselines": baselines(dict(rows)["bestfit"]),
            "workspace_modes": {m: {"arena_bytes": p.arena_bytes, "workspace_bytes": p.breakdown["workspace"],
                                    "slots": p.stats["workspace"].get("slots", [])} for m, p in modes.items()},
            "rows": [{"strategy": label, "arena_bytes": p.arena_bytes, "x_load": p.arena_bytes / load,
                      "saving_vs_naive": 1 - p.arena_bytes / naive, "plan_seconds": p.stats["plan_seconds"],
                      "schedule": p.schedule, "breakdown": p.breakdown} for label, p in rows]}


def format_table(rows, graph, modes, updates=None, remats=None, budget=None):
    """The rows as an aligned text table (for training with the breakdown in MiB as columns), then the
    LOAD row, the baselines (dynamic pools, keep everything), the best plan's breakdown, the bestfit arena
    under both workspace modes and, for training, under both update modes and each recomputation strategy."""
    d = as_dict(rows, graph, modes, updates, remats, budget)
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in d["inputs"].items())
    parts = list(d["rows"][0]["breakdown"]) if updates else []
    title = f"{graph.name}: {shapes}" + (f"; training step with {d['training']}, forward {d['forward_flops'] / 1e9:.2f} "
                                         f"GFLOP, backward {d['backward_flops'] / 1e9:.2f} GFLOP" if updates else "")
    lines = [title, f"{'strategy':<21} {'arena MiB':>11} {'x LOAD':>7} {'saving':>7} {'plan s':>7}  {'schedule':<8}"
             + "".join(f" {p:>11}" for p in parts)]
    for r in d["rows"]:
        lines.append(f"{r['strategy']:<21} {r['arena_bytes'] / 2**20:>11.2f} {r['x_load']:>7.3f} "
                     f"{r['saving_vs_naive']:>7.1%} {r['plan_seconds']:>7.2f}  {r['schedule']:<8}"
                     + "".join(f" {r['breakdown'][p] / 2**20:>11.2f}" for p in parts))
    lines.append(f"{'LOAD (lower bound)':<21} {d['lower_bound_bytes'] / 2**20:>11.2f} {1:>7.3f}")
    naive_pool, round_pool = d["baselines"]["naive_pool"], d["baselines"]["round_pool"]
    bestfit = next(r for r in d["rows"] if r["strategy"] == "bestfit")
    lines.append(f"dynamic pools on the same schedule: Naive {naive_pool['reserved_bytes'] / 2**20:.2f} MiB "
                 f"({naive_pool['device_allocs']} device allocations), Round {round_pool['reserved_bytes'] / 2**20:.2f} "
                 f"MiB ({round_pool['device_allocs']} device allocations); keep everything "
                 f"{d['baselines']['keep_everything'] / 2**20:.2f} MiB; the bestfit arena saves "
                 f"{1 - bestfit['arena_bytes'] / naive_pool['reserved_bytes']:.1%} against Naive")
    best = min(d["rows"], key=lambda r: r["arena_bytes"])
    parts = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in best["breakdown"].items())
    lines.append(f"smallest ({best['strategy']}): {parts}")
    pool, tensor = d["workspace_modes"]["pool"], d["workspace_modes"]["tensor"]
    lines.append(f"workspace as {len(pool['slots'])} pooled slot(s) of {pool['workspace_bytes'] / 2**20:.2f} MiB: "
                 f"arena {pool['arena_bytes'] / 2**20:.2f} MiB; as one-step tensors: arena "
                 f"{tensor['arena_bytes'] / 2**20:.2f} MiB (bestfit)")
    if updates:
        eager, after = d["update_modes"]["eager"], d["update_modes"]["after_backward"]
        lines.append(f"params updated as each gradient completes: arena {eager['arena_bytes'] / 2**20:.2f} MiB "
                     f"(gradients {eager['breakdown']['grads'] / 2**20:.2f} MiB at the peak); all gradients, then "
                     f"the step: {after['arena_bytes'] / 2**20:.2f} MiB (gradients "
                     f"{after['breakdown']['grads'] / 2**20:.2f} MiB) (bestfit)")
    if remats:
        lines.append(f"{'remat':<21} {'arena MiB':>11} {'x LOAD':>7} {'saved MiB':>11} {'recompute':>10} {'plan s':>7}")
        for r in d["remat"]:
            if "dtr" in d and r["remat"].startswith("optimal"):
                t = d["dtr"]
                lines.append(f"dtr({mib(t['budget_bytes'])} MiB), simulated on the plan without recomputation: "
                             + (f"recomputes {t['recompute_share']:.1%} of the step's FLOPs ({t['evictions']} "
                                "evictions)" if t["feasible"] else "does not fit"))
            if "error" in r:
                lines.append(f"{r['remat']:<21} {r['error']}")
                continue
            lines.append(f"{r['remat']:<21} {r['arena_bytes'] / 2**20:>11.2f} {r['x_load']:>7.3f} "
                         f"{r['saved_bytes'] / 2**20:>11.2f} {r['recompute_share']:>10.1%} {r['plan_seconds']:>7.2f}"
                         + (f"  gap {r['gap']:.1%}" if "gap" in r else ""))
    return "\n".join(lines)
