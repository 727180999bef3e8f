"""Budget-driven recomputation: the cheapest set of forward tensors to recompute (in FLOPs, from the
op schemas) such that the whole planned arena fits `budget` bytes.

Three families of candidates, each ordered from no recomputation to the most: Chen's checkpoint
splits at growing thresholds, alone and together with the mirror set (cheap ops, recomputed for
almost nothing), and the mirror set with every k-th expensive output (STRIDES). Along a family the recompute cost grows with the threshold while the arena first
falls; a bisection (on a log scale of bytes) over thresholds up to the memory-minimising one finds
the smallest that fits, every candidate scored by the real planner. The cheapest answer wins.
"""
import math

from .. import ops
from ..errors import InfeasibleBudgetError
from . import mirror, sublinear
from .recompute import droppable, recompute


STRIDES = (16, 8, 6, 4, 3, 2)
"""The third family: the mirror set and every k-th output of an expensive op (a convolution, a matrix
product), k from these, fewest first: each recomputed one is a single op away from a kept one."""


def recompute_flops(graph):
    """FLOPs of the recomputing clones in a rewritten graph."""
    return sum(ops.node_flops(graph, n) for n in graph.nodes if n.meta.get("recompute"))


def plan_budget(graph, budget, score, steps=12):
    """(drop set, arena bytes, recompute FLOPs) of the cheapest candidate fitting `budget`;
    InfeasibleBudgetError, with the smallest arena found, when none fits. `score(graph)` plans a
    rewritten graph and returns its arena bytes."""
    cheap = mirror.mirror(graph)
    evaluated = {}

    def evaluate(drop):
        key = frozenset(drop)
        if key not in evaluated:
            rewritten = recompute(graph, drop)
            evaluated[key] = (score(rewritten), recompute_flops(rewritten))
        return evaluated[key]

    if evaluate(set())[0] <= budget:
        return set(), *evaluate(set())
    _, _, tried = sublinear.search(graph, lambda d: evaluate(d)[0])
    top = min(tried, key=lambda tried_one: tried_one[1])[0]
    candidates = droppable(graph)
    sizes = [graph.tensors[t].nbytes for t in candidates if graph.tensors[t].nbytes]
    answers = []
    for extra in (set(), cheap):
        def fits(threshold):
            return evaluate(sublinear.split(graph, threshold)[0] | extra)[0] <= budget
        if fits(0):
            answers.append((evaluate(extra)[1], extra))
            continue
        if not fits(top):
            continue
        lo, hi = math.log(min(sizes)), math.log(top)  # fits(e^hi) holds; bisect on a log scale of bytes
        for _ in range(steps):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if fits(int(math.exp(mid))) else (mid, hi)
        drop = sublinear.split(graph, int(math.exp(hi)))[0] | extra
        answers.append((evaluate(drop)[1], drop))
    expensive = [o for n in graph.nodes if "phase" not in n.meta for o in n.outputs
                 if o in candidates and o not in cheap]
    for stride in STRIDES:
        drop = cheap | {t for k, t in enumerate(expensive) if k % stride == stride - 1}
        if evaluate(drop)[0] <= budget:
            answers.append((evaluate(drop)[1], drop))
            break
    if not answers:
        raise InfeasibleBudgetError(budget, min(arena for arena, _ in evaluated.values()))
    cost, drop = min(answers, key=lambda a: a[0])
    return drop, evaluate(drop)[0], cost
