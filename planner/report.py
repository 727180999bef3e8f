"""`memplan report`: the arena each strategy needs for one model, beside the lower bound LOAD."""
from dataclasses import replace

from .config import Config

ROWS = (  # label, strategy, Config changes
    ("naive", "naive", {}),
    ("inplace", "inplace", {}),
    ("share", "share", {}),
    ("share (auto search)", "share", {"auto_search_match_range": True}),
    ("bestfit", "bestfit", {}),
    ("optimal", "optimal", {}),
)


def report(graph, config=None, time_limit=2.0, schedule="auto"):
    """One row per strategy for a typed graph: the plan, and its label. `optimal` searches for at
    most `time_limit` seconds."""
    from .compiler import compile
    config = config or Config.from_env()
    rows = []
    for label, strategy, changes in ROWS:
        if strategy == "optimal":
            changes = {**changes, "time_limit": time_limit}
        if strategy == "share" and not changes and config.auto_search_match_range:
            changes = {"auto_search_match_range": False}
        plan = compile(graph, strategy=strategy, schedule=schedule, config=replace(config, **changes))
        rows.append((label, plan))
    return rows


def lower_bound(rows):
    """The LOAD row: the smallest lower bound among the plans that reuse memory in place."""
    return min(plan.lower_bound_bytes for label, plan in rows if plan.strategy != "naive")


def as_dict(rows, graph):
    load, naive = lower_bound(rows), rows[0][1].arena_bytes
    return {"model": graph.name, "inputs": {n: list(graph.tensors[n].shape) for n in graph.inputs},
            "lower_bound_bytes": load,
            "rows": [{"strategy": label, "arena_bytes": p.arena_bytes, "x_load": p.arena_bytes / load,
                      "saving_vs_naive": 1 - p.arena_bytes / naive, "plan_seconds": p.stats["plan_seconds"],
                      "schedule": p.schedule, "breakdown": p.breakdown} for label, p in rows]}


def format_table(rows, graph):
    """The rows as an aligned text table, then the LOAD row and the best plan's breakdown."""
    d = as_dict(rows, graph)
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in d["inputs"].items())
    lines = [f"{graph.name}: {shapes}",
             f"{'strategy':<21} {'arena MiB':>11} {'x LOAD':>7} {'saving':>7} {'plan s':>7}  schedule"]
    for r in d["rows"]:
        lines.append(f"{r['strategy']:<21} {r['arena_bytes'] / 2**20:>11.2f} {r['x_load']:>7.3f} "
                     f"{r['saving_vs_naive']:>7.1%} {r['plan_seconds']:>7.2f}  {r['schedule']}")
    lines.append(f"{'LOAD (lower bound)':<21} {d['lower_bound_bytes'] / 2**20:>11.2f} {1:>7.3f}")
    best = min(d["rows"], key=lambda r: r["arena_bytes"])
    parts = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in best["breakdown"].items())
    lines.append(f"smallest ({best['strategy']}): {parts}")
    return "\n".join(lines)
