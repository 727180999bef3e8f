"""Rematerialisation: which forward tensors a training step recomputes in backward instead of
keeping, by strategy; every strategy ends in the same rewrite (recompute.recompute).

- "mirror": MXNet's mirror, every cheap op recomputed (mirror.py);
- "sublinear": Chen et al.'s checkpoints with memonger's threshold search, scored by real plans
  (sublinear.py), or MegEngine's threshold samples and genetic search (megengine.py);
- "budget": the least recomputation (in FLOPs) whose plan fits `memory_budget` (budget.py);
- "optimal": the same by Checkmate's integer program, for steps of up to optimal.MAX_NODES nodes
  (optimal.py, checkmate.py), to measure how far the heuristics are from the best;
- "selective" and "full": Megatron-LM's, each attention core or each transformer layer recomputed from
  what enters it (layers.py), to check planned activations against Korthikanti et al.'s formulas.

Nodes annotated `force_mirroring` are recomputed under every strategy but optimal, as in MXNet.
"""
from functools import partial

from .. import progress
from ..config import Config
from ..errors import PlanError, say
from . import budget, layers, megengine, mirror, optimal, sublinear
from .recompute import SUFFIX, droppable, recompute

REMATS = ("mirror", "sublinear", "budget", "optimal", *layers.STRATEGIES)


def rematerialize(graph, remat, measure, memory_budget=None, config=None):
    """The training graph with the strategy's recomputation, and what was decided: {"remat",
    "recomputed" (tensor names), "search" [(threshold, arena bytes or None)], "budget", "solver" (optimal's
    status, gap and seconds), "fallback" (mirror's plan was larger than none's, so none's was kept: both
    arenas), selective's and full's "attention", "fused" and "layers" (layers.rematerialize)}. `measure(graph)`
    plans a candidate graph as far as its buffers (planning.Measured); `config` holds the searches' knobs."""
    config = config or Config()

    def score(candidate):
        return measure(candidate).arena()

    def fitting(candidate):  # a search's arena, or the plan's where only the plan's can fit the budget
        measured = measure(candidate)
        arena = measured.arena()
        return measured.final_arena() if arena > memory_budget >= measured.load else arena

    if remat is not None and remat not in REMATS:
        raise PlanError(f"unknown remat {remat!r}; choose one of {', '.join(REMATS)}")
    if (remat in ("budget", "optimal")) != (memory_budget is not None):
        raise PlanError(say("memory_budget= goes with remat='budget' or remat='optimal', and they need it",
                            "--budget SIZE goes with --remat budget or --remat optimal (the default with --budget)"))
    info = {"remat": remat}
    if remat == "optimal":
        rewritten, info["solver"] = optimal.plan_optimal(graph, memory_budget, fitting, config.time_limit,
                                                         config.remat_solver)
        info.update(budget=memory_budget, recomputed=sorted({o.rsplit(SUFFIX, 1)[0] for n in rewritten.nodes
                                                             if n.notes.recompute for o in n.outputs if o}))
        return rewritten, info
    drop = mirror.mirror(graph, enabled=remat == "mirror")
    if remat in layers.STRATEGIES:
        rewritten, decided = layers.rematerialize(graph, remat)
        return recompute(rewritten, drop), {**info, **decided}
    if remat == "mirror":
        drop, fallback = _no_larger_than_none(graph, drop, measure)
        info.update({"fallback": fallback} if fallback else {})
    if remat == "budget":
        info["budget"] = memory_budget
        drop, info["horizon"], _, _ = budget.plan_budget(graph, memory_budget, fitting, forced=frozenset(drop),
                                                         final=lambda candidate: measure(candidate).final_arena())
        info["recomputed"] = sorted(drop)
        return recompute(graph, drop, info["horizon"]), info
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
