"""Rematerialisation: which forward tensors a training step recomputes in backward instead of
keeping, by strategy; every strategy ends in the same rewrite (recompute.recompute).

- "mirror": MXNet's mirror, every cheap op recomputed (mirror.py);
- "sublinear": Chen et al.'s checkpoints with memonger's threshold search, scored by real plans
  (sublinear.py), or MegEngine's threshold samples and genetic search (megengine.py);
- "budget": the least recomputation (in FLOPs) whose plan fits `memory_budget` (budget.py);
- "optimal": the same by Checkmate's integer program, for steps of up to optimal.MAX_NODES nodes
  (optimal.py, checkmate.py), to measure how far the heuristics are from the best.

Nodes annotated `force_mirroring` are recomputed under every strategy but optimal, as in MXNet.
"""
import sys

from ..config import Config
from ..errors import PlanError, say
from . import budget, megengine, mirror, optimal, sublinear
from .recompute import SUFFIX, droppable, recompute

REMATS = ("mirror", "sublinear", "budget", "optimal")


def rematerialize(graph, remat, measure, memory_budget=None, config=None):
    """The training graph with the strategy's recomputation, and what was decided: {"remat",
    "recomputed" (tensor names), "search" [(threshold, arena bytes or None)], "budget", "solver" (optimal's
    status, gap and seconds)}. `measure(graph)` plans a candidate graph as far as its buffers
    (planning.Measured); `config` holds the searches' knobs."""
    config = config or Config()

    def score(candidate):
        return measure(candidate).arena()

    if remat is not None and remat not in REMATS:
        raise PlanError(f"unknown remat {remat!r}; choose one of {', '.join(REMATS)}")
    if (remat in ("budget", "optimal")) != (memory_budget is not None):
        raise PlanError(say("memory_budget= goes with remat='budget' or remat='optimal', and they need it",
                            "--budget SIZE goes with --remat budget or --remat optimal (the default with --budget)"))
    info = {"remat": remat}
    if remat == "optimal":
        rewritten, info["solver"] = optimal.plan_optimal(graph, memory_budget, score, config.time_limit,
                                                         config.remat_solver)
        info.update(budget=memory_budget, recomputed=sorted({o.rsplit(SUFFIX, 1)[0] for n in rewritten.nodes
                                                             if n.notes.recompute for o in n.outputs if o}))
        return rewritten, info
    drop = mirror.mirror(graph, enabled=remat == "mirror")
    if remat == "budget":
        info["budget"] = memory_budget
        drop, info["horizon"], _, _ = budget.plan_budget(graph, memory_budget, score, forced=frozenset(drop))
        info["recomputed"] = sorted(drop)
        return recompute(graph, drop, info["horizon"]), info
    if remat == "sublinear":
        forced = drop
        chosen, _, info["search"] = sublinear.search(graph, lambda d: measure(recompute(graph, d | forced)),
                                                     progress=_progress)
        if config.sublinear_search == "megengine":
            candidates = droppable(graph)

            def scored(kept):
                rewritten = recompute(graph, (candidates - kept) | forced)
                return score(rewritten), budget.recompute_flops(rewritten)

            kept, info["search"] = megengine.search(
                graph, scored, config.sublinear_thresh_nr_try, config.sublinear_genetic_nr_iter,
                config.sublinear_genetic_pool_size, config.sublinear_lower_bound_mb * 2**20, config.sublinear_workers,
                seeds=[frozenset(candidates - chosen)], progress=_progress)
            chosen = candidates - kept
        drop = chosen | forced
    info["recomputed"] = sorted(drop)
    return recompute(graph, drop), info


def _progress(done, total):
    """A one-line progress bar (a count when the total is not known) on a terminal's stderr."""
    if sys.stderr.isatty():
        bar = "" if total is None else f"[{'#' * (20 * done // total):<20}] "
        print(f"\rmemplan: sublinear search {bar}{done}" + ("" if total is None else f"/{total}"),
              end="\n" if done == total else "", file=sys.stderr, flush=True)
