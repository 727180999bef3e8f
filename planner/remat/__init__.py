"""Rematerialisation: which forward tensors a training step recomputes in backward instead of
keeping, by strategy; every strategy ends in the same rewrite (recompute.recompute).

- "mirror": MXNet's mirror, every cheap op recomputed (mirror.py);
- "sublinear": Chen et al.'s checkpoints with memonger's threshold search, scored by real plans
  (sublinear.py), or MegEngine's threshold samples and genetic search (megengine.py);
- "budget": the least recomputation (in FLOPs) whose plan fits `memory_budget` (budget.py);
- "optimal": the same by Checkmate's integer program, for steps of up to optimal.MAX_NODES nodes
  (optimal.py, checkmate.py), to measure how far the heuristics are from the best;
- "selective" and "full": Megatron-LM's, each attention core or each transformer layer recomputed from
  what enters it (layers.py), to check planned activations against Korthikanti et al.'s formulas;
- "swap": the fewest saved values copied to host memory and back, placed by a time model, whose arena fits
  `memory_budget` (swap.py); "hybrid": keep, recompute or swap chosen per value by cost, or swapping alone, or
  recomputing alone ("budget"), whichever fits in the least modeled time (Capuchin, POET).

Nodes annotated `force_mirroring` are recomputed under every strategy but optimal, as in MXNet.
"""
from functools import partial

from .. import progress, timing
from ..config import Config
from ..errors import InfeasibleBudgetError, PlanError, say
from . import budget, layers, megengine, mirror, optimal, sublinear, swap
from .recompute import SUFFIX, droppable, recompute

REMATS = ("mirror", "sublinear", "budget", "optimal", *layers.STRATEGIES, "swap", "hybrid")
BUDGETED = ("budget", "optimal", "swap", "hybrid")
"""The strategies that take a memory_budget, and need one."""


def rematerialize(graph, remat, measure, memory_budget=None, config=None, device="any"):
    """The training graph with the strategy's recomputation, and what was decided: {"remat",
    "recomputed" (tensor names), "search" [(threshold, arena bytes or None)], "budget", "solver" (optimal's
    status, gap and seconds), "fallback" (mirror's plan was larger than none's, so none's was kept: both
    arenas), selective's and full's "attention", "fused" and "layers" (layers.rematerialize), swap's and
    hybrid's "swapped", "time" (swap_time), "chosen" (which search's graph), "candidates" ({search: modeled
    seconds} of those that fit) and "base_seconds" (the step without recomputation or copies)}. `measure(graph)` plans a candidate graph as far as its buffers
    (planning.Measured); `config` holds the searches' knobs and the time model's (for a plan of `device`)."""
    config = config or Config()

    def score(candidate):
        return measure(candidate).arena()

    if remat is not None and remat not in REMATS:
        raise PlanError(f"unknown remat {remat!r}; choose one of {', '.join(REMATS)}")
    if (remat in BUDGETED) != (memory_budget is not None):
        raise PlanError(say("memory_budget= goes with remat='budget', 'optimal', 'swap' or 'hybrid', and they need it",
                            "--budget SIZE goes with --remat budget, optimal, swap or hybrid (budget is the default "
                            "with --budget)"))
    info = {"remat": remat}
    if remat in ("swap", "hybrid"):
        model = timing.device_model(config.device_model, device, config.link_bandwidth)
        return _swapping(graph, remat, measure, memory_budget, model)
    if remat == "optimal":
        rewritten, info["solver"] = optimal.plan_optimal(graph, memory_budget, _fitting(measure, memory_budget),
                                                         config.time_limit, config.remat_solver)
        info.update(budget=memory_budget, recomputed=_recomputed(rewritten))
        return rewritten, info
    drop = mirror.mirror(graph, enabled=remat == "mirror")
    if remat in layers.STRATEGIES:
        rewritten, decided = layers.rematerialize(graph, remat)
        return recompute(rewritten, drop), {**info, **decided}
    if remat == "mirror":
        drop, fallback = _no_larger_than_none(graph, drop, measure)
        info.update({"fallback": fallback} if fallback else {})
    if remat == "budget":
        rewritten, decided = _budget(graph, memory_budget, measure, drop)
        return rewritten, {**info, **decided}
    if remat == "sublinear":
        forced = drop
        chosen, _, info["search"] = sublinear.search(graph, lambda d: measure(recompute(graph, d | forced)),
                                                     progress=partial(progress.show, "sublinear search"))
        if config.sublinear_search == "megengine":
            candidates = droppable(graph)

            def scored(kept):
                rewritten = recompute(graph, (candidates - kept) | forced)
                return score(rewritten), budget.recompute_flops(rewritten)

            kept, info["search"] = megengine.search(
                graph, scored, config.sublinear_thresh_nr_try, config.sublinear_genetic_nr_iter,
                config.sublinear_genetic_pool_size, config.sublinear_lower_bound_mb * 2**20, config.sublinear_workers,
                seeds=[frozenset(candidates - chosen)], progress=partial(progress.show, "sublinear search"))
            chosen = candidates - kept
        drop = chosen | forced
    info["recomputed"] = sorted(drop)
    return recompute(graph, drop), info


def _fitting(measure, memory_budget):
    """A search's score of a candidate: its arena as searches place it, or its plan's where only the plan's can fit
    the budget."""
    return lambda candidate: measure(candidate).fitting(memory_budget)


def _budget(graph, memory_budget, measure, forced=frozenset()):
    """(graph, {"budget", "horizon", "recomputed"}) of remat="budget": the least recomputation fitting the budget."""
    drop, horizon, _, _ = budget.plan_budget(graph, memory_budget, _fitting(measure, memory_budget),
                                             forced=frozenset(forced),
                                             final=lambda candidate: measure(candidate).final_arena())
    return recompute(graph, drop, horizon), {"budget": memory_budget, "horizon": horizon, "recomputed": sorted(drop)}


def _swapping(graph, remat, measure, memory_budget, model):
    """remat="swap" or "hybrid" (see the module docstring): the graph and what was decided, with the modeled "time"
    of the step (swap_time)."""
    searches = {"swap": lambda: swap.plan_swap(graph, memory_budget, measure, model)[0]}
    if remat == "hybrid":
        searches["hybrid"] = lambda: swap.plan_hybrid(graph, memory_budget, measure, model)[0]
        searches["recompute"] = lambda: _budget(graph, memory_budget, measure)[0]
    found, least = {}, None
    for name, search in searches.items():
        try:
            found[name] = search()
        except InfeasibleBudgetError as e:
            least = e if least is None or e.minimum < least.minimum else least
    if not found:
        raise least
    times = {name: swap_time(rewritten, model) for name, rewritten in found.items()}
    chosen = min(times, key=lambda name: (times[name]["seconds"], name))
    rewritten = found[chosen]
    return rewritten, {"remat": remat, "budget": memory_budget, "chosen": chosen, "swapped": swap.swapped(rewritten),
                       "recomputed": _recomputed(rewritten), "time": times[chosen],
                       "candidates": {name: t["seconds"] for name, t in times.items()},
                       "base_seconds": swap.simulate(graph, model)[0]}


def _recomputed(graph):
    """The names of the forward values a rewritten graph recomputes."""
    return sorted({o.rsplit(SUFFIX, 1)[0] for n in graph.nodes if n.notes.recompute for o in n.outputs if o})


def swap_time(graph, model):
    """{"seconds", "compute_seconds", "model", "link"}: a run of the graph by the time model (swap.simulate), with
    the device model's name and its link's bytes a second."""
    seconds, compute = swap.simulate(graph, model)
    return {"seconds": seconds, "compute_seconds": compute, "model": model.name, "link": model.link}


def _no_larger_than_none(graph, drop, measure):
    """(drop set, fallback): mirror's `drop`, or none's (the forced mirroring alone) where mirror's plan is
    larger, with both arenas; recomputing cheap ops can lengthen what their inputs live."""
    forced = mirror.mirror(graph, enabled=False)
    if forced == drop:
        return drop, None
    mirrored, kept = (measure(recompute(graph, d)).final_arena() for d in (drop, forced))
    if mirrored <= kept:
        return drop, None
    return forced, {"to": "none", "mirror_arena_bytes": mirrored, "none_arena_bytes": kept}
