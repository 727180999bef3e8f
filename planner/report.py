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


def workspace_modes(graph, config=None, schedule="auto"):
    """{mode: bestfit plan} for both workspace modes: MXNet's pooled slots and one-step tensors."""
    from .compiler import compile
    config = config or Config.from_env()
    return {mode: compile(graph, schedule=schedule, config=replace(config, workspace_mode=mode))
            for mode in ("pool", "tensor")}


def lower_bound(rows):
    """The LOAD row: the smallest lower bound among the plans that reuse memory in place."""
    return min(plan.lower_bound_bytes for label, plan in rows if plan.strategy != "naive")


def as_dict(rows, graph, modes):
    load, naive = lower_bound(rows), rows[0][1].arena_bytes
    return {"model": graph.name, "inputs": {n: list(graph.tensors[n].shape) for n in graph.inputs},
            "lower_bound_bytes": load,
            "workspace_modes": {m: {"arena_bytes": p.arena_bytes, "workspace_bytes": p.breakdown["workspace"],
                                    "slots": p.stats["workspace"].get("slots", [])} for m, p in modes.items()},
            "rows": [{"strategy": label, "arena_bytes": p.arena_bytes, "x_load": p.arena_bytes / load,
                      "saving_vs_naive": 1 - p.arena_bytes / naive, "plan_seconds": p.stats["plan_seconds"],
                      "schedule": p.schedule, "breakdown": p.breakdown} for label, p in rows]}


def format_table(rows, graph, modes):
    """The rows as an aligned text table, then the LOAD row, the best plan's breakdown and the
    bestfit arena under both workspace modes."""
    d = as_dict(rows, graph, modes)
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
    pool, tensor = d["workspace_modes"]["pool"], d["workspace_modes"]["tensor"]
    lines.append(f"workspace as {len(pool['slots'])} pooled slot(s) of {pool['workspace_bytes'] / 2**20:.2f} MiB: "
                 f"arena {pool['arena_bytes'] / 2**20:.2f} MiB; as one-step tensors: arena "
                 f"{tensor['arena_bytes'] / 2**20:.2f} MiB (bestfit)")
    return "\n".join(lines)
