"""Budget-driven recomputation: the cheapest set of forward tensors to recompute (in FLOPs, from the
op schemas) such that the whole planned arena fits `budget` bytes.

Four families of candidates, each ordered from no recomputation to the most: Chen's checkpoint
splits at growing thresholds, alone and together with the mirror set (cheap ops, recomputed for
almost nothing), the mirror set with every k-th expensive output (STRIDES), and the droppable
tensors cheapest per byte first. Along a family the recompute cost grows while the arena first
falls; a bisection finds the least that fits, every candidate scored by the real planner. The
cheapest answer wins, then keeps back the dearest of its tensors that it can (REFINE). When no
candidate fits, the families are tried again with clones that serve only nearby readers (HORIZONS).
Every search stops on a count of plans, never on the clock: the same budget gives the same plan on a
busy machine as on a quiet one.
"""
import math

from .. import ops
from ..errors import InfeasibleBudgetError
from . import mirror, sublinear
from .recompute import droppable, recompute


REFINE = 48
"""The most dropped tensors, dearest first, that the planner tries to keep after all (one plan each, and no
more plans than the search made)."""

HORIZONS = (32, 16, 8, 6, 4, 2, 0)
"""When no candidate fits with clones that serve every later backward reader, how long (in nodes) a
clone serves them instead: each horizon is tried, in order, while the horizons have made fewer than
HORIZON_PLANS times the plans of the first search, and the cheapest fit wins."""
HORIZON_PLANS = 4
"""How many plans the horizons may make, in plans of the first search (HORIZONS)."""

FINAL_TRIES = 4
"""When no candidate fits, how many of the smallest (as searches place them) are planned to the end for the
least arena the error names: the strategy's allocator can place them tighter than the searches."""

STRIDES = (16, 8, 6, 4, 3, 2)
"""The third family: the mirror set and every k-th output of an expensive op (a convolution, a matrix
product), k from these, fewest first: each recomputed one is a single op away from a kept one."""


def recompute_flops(graph):
    """FLOPs of the recomputing clones in a rewritten graph."""
    return sum(ops.node_flops(graph, n) for n in graph.nodes if n.notes.recompute)


def plan_budget(graph, budget, score, steps=12, forced=frozenset(), final=None):
    """(drop set, horizon, arena bytes, recompute FLOPs) of the cheapest candidate fitting `budget`;
    InfeasibleBudgetError, with the smallest arena found, when none fits. `score(graph)` plans a
    rewritten graph and returns its arena bytes; `final(graph)`, the arena of its finished plan, where that
    can be smaller (FINAL_TRIES). Candidates first recompute each dropped tensor once
    for all its backward readers (horizon None); only when none of those fits, again for readers
    more than a horizon later (HORIZONS: more FLOPs, clones die sooner). Tensors in `forced` are
    dropped in every candidate."""
    evaluated = {}

    def evaluate(drop, horizon):
        key = (frozenset(drop) | forced, horizon)
        if key not in evaluated:
            rewritten = recompute(graph, key[0], horizon)
            evaluated[key] = (score(rewritten), recompute_flops(rewritten))
        return evaluated[key]

    if evaluate(set(), None)[0] <= budget:
        return set(forced), None, *evaluate(set(), None)
    answers = [(cost, drop, None) for cost, drop in _candidates(graph, budget, lambda d: evaluate(d, None), steps)]
    searched = len(evaluated)
    for horizon in HORIZONS if not answers else ():
        if len(evaluated) - searched >= HORIZON_PLANS * searched:
            break
        answers += [(cost, drop, horizon) for cost, drop in
                    _candidates(graph, budget, lambda d: evaluate(d, horizon), steps)]
    if not answers:
        smallest = sorted(evaluated, key=lambda key: evaluated[key][0])[:FINAL_TRIES if final else 0]
        raise InfeasibleBudgetError(budget, min([evaluated[key][0] for key in evaluated] +
                                                [final(recompute(graph, *key)) for key in smallest]))
    cost, drop, horizon = min(answers, key=lambda a: a[0])
    for t in sorted(drop, key=lambda t: (-_price(graph, t), t))[:min(REFINE, len(evaluated))]:
        arena, smaller = evaluate(drop - {t}, horizon)
        if arena <= budget and smaller < cost:
            cost, drop = smaller, drop - {t}
    return drop | forced, horizon, evaluate(drop, horizon)[0], cost


def _candidates(graph, budget, evaluate, steps):
    """[(recompute FLOPs, drop set)]: the least of each family that fits; `evaluate(drop)` gives
    (arena bytes, recompute FLOPs)."""
    cheap = mirror.mirror(graph)
    top = min(sublinear.thresholds(graph), key=lambda t: evaluate(sublinear.split(graph, t)[0])[0])
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
        lo, hi = min(sizes), top  # fits(hi) holds; bisect on a log scale of bytes
        for _ in range(steps):
            mid = int(math.sqrt(lo * hi))
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        drop = sublinear.split(graph, hi)[0] | extra
        answers.append((evaluate(drop)[1], drop))
    expensive = [o for n in graph.nodes if n.notes.forward for o in n.outputs
                 if o in candidates and o not in cheap]
    for stride in STRIDES:
        drop = cheap | {t for k, t in enumerate(expensive) if k % stride == stride - 1}
        if evaluate(drop)[0] <= budget:
            answers.append((evaluate(drop)[1], drop))
            break
    by_price = sorted(candidates, key=lambda t: (_price(graph, t), t))
    lo, hi = 0, len(by_price)  # the shortest prefix of the cheapest-per-byte tensors that fits
    if evaluate(set(by_price))[0] <= budget:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if evaluate(set(by_price[:mid]))[0] <= budget else (mid, hi)
        answers.append((evaluate(set(by_price[:hi]))[1], set(by_price[:hi])))
    return answers


def _price(graph, tensor):
    """FLOPs per byte of recomputing a tensor from its producer's inputs."""
    return ops.node_flops(graph, graph.producers[tensor]) / max(graph.tensors[tensor].nbytes, 1)
