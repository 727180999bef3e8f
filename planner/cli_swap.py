"""`memplan report --training --swap`: a training step under one budget kept whole, recomputing, swapping to host
memory, and keeping, recomputing or swapping chosen together (planner/remat/swap.py), with each plan's device and
host arenas and its step's modeled time (planner.timing); `memplan calibrate`, that time model measured here."""
import json
from dataclasses import asdict

from . import timing
from .config import Config

from .errors import InfeasibleBudgetError, MemplanError
from .outputs import as_csv, check_output, emit
from .units import format_bytes

ROWS = (("none", None, None), ("recompute", "budget", None), ("swap", "swap", None), ("hybrid", "hybrid", None),
        ("offload", None, "optimizer"), ("offload + hybrid", "hybrid", "optimizer"))
"""Each row's label, remat and offload."""
CHOSEN = {"hybrid": "per value", "swap": "swap alone", "recompute": "recompute alone"}
"""How a hybrid row names the search whose plan it kept."""


def report(args, load, config, training):
    """Print the rows (ROWS) at --budget (default half of the arena without recomputation) for the graph
    `load(args)` reads, once the flags are checked."""
    from .compiler import compile
    check_output(args.output)
    if not args.training:
        raise MemplanError("--swap compares ways to fit a training step: give --training too")
    if training.get("remat"):
        raise MemplanError("--swap plans every way side by side: leave --remat out")
    if args.precision == "all":
        raise MemplanError("--swap compares one precision: give one --precision")
    graph = load(args)
    options = {**training, "strategy": "auto", "schedule": args.schedule, "config": config,
               **({} if args.precision == "fp32" else {"precision": args.precision})}
    budget = options.pop("memory_budget")
    none = compile(graph, **{**options, "memory_budget": None})
    budget = none.arena_bytes // 2 if budget is None else budget
    plans = {}
    for label, remat, offload in ROWS[1:]:
        try:
            plans[label] = compile(graph, **{**options, "remat": remat, "offload": offload,
                                             "memory_budget": budget if remat else None})
        except InfeasibleBudgetError as e:
            plans[label] = e
    rows = _rows(none, plans, budget)
    emit(args, json.dumps({"budget_bytes": budget, "rows": rows}, indent=1) if args.json else
         as_csv(rows) if args.csv else _table(rows, budget, none))
    return 0


def _rows(none, plans, budget):
    """One dict per plan: arenas, what it swaps and recomputes, and its modeled step against keeping everything
    (the hybrid search models each of the others' steps)."""
    decided = next((p.training["remat"] for p in (plans["hybrid"], plans["offload + hybrid"])
                    if not isinstance(p, Exception)), {})
    offloaded = plans["offload"]
    base = decided.get("base_seconds") or (None if isinstance(offloaded, Exception) else
                                          offloaded.training["offload"]["base_seconds"])
    seconds = {"none": base, "recompute": decided.get("candidates", {}).get("recompute")}
    rows = []
    for label, plan in {"none": none, **plans}.items():
        if isinstance(plan, Exception):
            rows.append({"remat": label, "error": str(plan)})
            continue
        remat = plan.training.get("remat") or {}
        time = (plan.training.get("offload") or remat).get("time")
        step = time["seconds"] if time else seconds.get(label)
        rows.append({"remat": label + (f" ({CHOSEN[remat['chosen']]})" if label.endswith("hybrid") else ""),
                     "arena_bytes": plan.arena_bytes, "x_none": plan.arena_bytes / none.arena_bytes,
                     "host_arena_bytes": plan.host_arena_bytes, "swapped": len(remat.get("swapped", ())),
                     "recomputed": len(remat.get("recomputed", ())), "step_seconds": step,
                     "overhead": None if step is None or seconds["none"] is None else step / seconds["none"] - 1,
                     "model": (time["model"], time["link"]) if time else None})
    return rows


def _table(rows, budget, none):
    model = next((r["model"] for r in rows if r.get("model")), None)
    width = max(len(r["remat"]) for r in rows) + 2
    lines = [f"budget {format_bytes(budget)} ({budget / none.arena_bytes:.2f}x the arena keeping everything)"
             + (f"; time model {model[0]}, host link {model[1] / 1e9:g} GB/s each way" if model else ""),
             f"{'remat':<{width}} {'arena':>13} {'x none':>7} {'host arena':>13} {'swapped':>8} {'recomputed':>10} "
             f"{'modeled step':>13} {'overhead':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['remat']:<{width}} {r['error']}")
            continue
        step = "-" if r["step_seconds"] is None else f"{r['step_seconds'] * 1e3:.1f} ms"
        overhead = "-" if r["overhead"] is None else f"{r['overhead']:.1%}"
        lines.append(f"{r['remat']:<{width}} {format_bytes(r['arena_bytes']):>13} {r['x_none']:>7.3f} "
                     f"{format_bytes(r['host_arena_bytes']):>13} {r['swapped']:>8} {r['recomputed']:>10} "
                     f"{step:>13} {overhead:>9}")
    if model:
        lines.append("modeled step: the step's time by the device model (memplan.timing; --device-model, --link), the "
                     "copies to and from the host overlapping the compute where they can; overhead against keeping "
                     "everything")
    return "\n".join(lines)


def calibrate(args):
    """Measure the backend's device model (planner.timing.calibrate) and print it, or write it to -o."""
    from executor import backends
    backend = backends.get(args.backend)
    model = timing.calibrate(backend.xp, backend.synchronize, args.name or backend.NAME,
                             Config.from_env().link_bandwidth)
    if args.output:
        model.to_json(args.output)
        print(f"wrote {args.output}: --device-model {args.output} (MEMPLAN_DEVICE_MODEL) plans by it")
    else:
        print(json.dumps(asdict(model), indent=1))
    return 0
