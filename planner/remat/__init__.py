"""Rematerialisation: which forward tensors a training step recomputes in backward instead of
keeping, by strategy; every strategy ends in the same rewrite (recompute.recompute).

- "mirror": MXNet's mirror, every cheap op recomputed (mirror.py);
- "sublinear": Chen et al.'s checkpoints with memonger's threshold search, scored by real plans
  (sublinear.py);
- "budget": the least recomputation (in FLOPs) whose plan fits `memory_budget` (budget.py).

Nodes annotated `force_mirroring` are recomputed under every strategy, as in MXNet.
"""
import sys

from ..errors import PlanError
from . import budget, mirror, sublinear
from .recompute import recompute

REMATS = ("mirror", "sublinear", "budget")


def rematerialize(graph, remat, score, memory_budget=None):
    """The training graph with the strategy's recomputation, and what was decided: {"remat",
    "recomputed" (tensor names), "search" [(threshold, arena bytes)], "budget"}. `score(graph)` plans
    a candidate graph and returns its arena bytes."""
    if remat is not None and remat not in REMATS:
        raise PlanError(f"unknown remat {remat!r}; choose one of {', '.join(REMATS)}")
    if (remat == "budget") != (memory_budget is not None):
        raise PlanError("remat='budget' and memory_budget= go together")
    info = {"remat": remat}
    drop = mirror.mirror(graph, enabled=remat == "mirror")
    if remat == "budget":
        info["budget"] = memory_budget
        drop = budget.plan_budget(graph, memory_budget, score)[0] | drop
    if remat == "sublinear":
        forced = drop
        chosen, _, info["search"] = sublinear.search(graph, lambda d: score(recompute(graph, d | forced)),
                                                     progress=_progress)
        drop = chosen | forced
    info["recomputed"] = sorted(drop)
    return recompute(graph, drop), info


def _progress(done, total):
    """A one-line progress bar on a terminal's stderr."""
    if sys.stderr.isatty():
        bar = "#" * (20 * done // total)
        print(f"\rmemplan: sublinear search [{bar:<20}] {done}/{total}", end="\n" if done == total else "",
              file=sys.stderr, flush=True)
