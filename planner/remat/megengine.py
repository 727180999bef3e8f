"""MegEngine's sublinear-memory search (seq_sublinear_memory.cpp): threshold samples, then an optional
seeded genetic search over the checkpoints, candidates scored by the real planner in parallel
worker processes. Knobs: MGB_SUBLINEAR_MEMORY_THRESH_NR_TRY, _GENETIC_NR_ITER, _GENETIC_POOL_SIZE,
_LOWER_BOUND_MB and _WORKERS (planner.Config)."""
import multiprocessing
import random

from . import sublinear
from .recompute import droppable

_SCORE = None
"""The scoring function, set before the worker processes fork so that they inherit it."""


def _score(kept):
    return _SCORE(kept)


def search(graph, score, nr_try=10, nr_iter=0, pool_size=20, lower_bound=0, workers=1, seeds=(), seed=0,
           progress=None):
    """The checkpoints (tensors kept for backward; every other forward tensor is recomputed) with the
    best score, and [(checkpoint count, score)] of everything tried. `score(kept)` returns a sortable
    (arena bytes, recompute FLOPs). Plans whose arena is at most `lower_bound` bytes count as equally
    good in memory, so that the least recomputation among them wins. `seeds` are checkpoint sets to
    start the population with."""
    global _SCORE
    candidates = droppable(graph)
    order = [t for n in graph.nodes if n.notes.forward for t in n.outputs if t in candidates]
    total = sum(graph.tensors[t].nbytes for t in order)
    _SCORE = score
    seen, tried = {}, []

    def key(result):
        arena, flops = result
        return (max(arena, lower_bound), flops)

    def evaluate(candidates):
        fresh = list(dict.fromkeys(c for c in candidates if c not in seen))
        if workers > 1 and len(fresh) > 1:
            with multiprocessing.get_context("fork").Pool(min(workers, len(fresh))) as pool:
                results = pool.map(_score, fresh)
        else:
            results = [score(c) for c in fresh]
        for kept, result in zip(fresh, results):
            seen[kept] = result
            tried.append((len(kept), result))
        if progress:
            progress(len(seen), None)

    def kept_at(threshold):
        return frozenset(order) - sublinear.split(graph, threshold)[0]

    thresholds = [total / 2 ** k for k in range(1, nr_try + 1)] + [total * i / (nr_try + 1) for i in range(1, nr_try + 1)]
    firsts = {t: kept_at(t) for t in thresholds}
    evaluate([*firsts.values(), *seeds])
    best = min(firsts.values(), key=lambda kept: key(seen[kept]))
    centre = max(t for t, kept in firsts.items() if kept == best)
    evaluate([kept_at(centre * (0.5 + 1.5 * i / max(nr_try - 1, 1))) for i in range(nr_try)])
    rng = random.Random(seed)
    for _ in range(nr_iter):
        pool = sorted(seen, key=lambda kept: key(seen[kept]))[:pool_size]
        children = []
        for _ in range(pool_size):
            if rng.random() < 0.5 and len(pool) > 1:
                a, b = rng.sample(pool, 2)
                cut = rng.randrange(len(order))
                children.append(frozenset(t for t in order[:cut] if t in a) | frozenset(t for t in order[cut:] if t in b))
            else:
                children.append(_mutate(_mutate(rng.choice(pool), order, rng), order, rng))
        evaluate(children)
    best = min(seen, key=lambda kept: key(seen[kept]))
    return best, tried


def _mutate(kept, order, rng):
    """Insert, remove or move one checkpoint."""
    kept = set(kept)
    choice = rng.randrange(3)
    if choice == 0 or not kept:
        kept.add(rng.choice(order))
    elif choice == 1:
        kept.discard(rng.choice(sorted(kept)))
    else:
        t = rng.choice(sorted(kept))
        k = order.index(t) + rng.choice((-1, 1))
        kept.discard(t)
        kept.add(order[min(max(k, 0), len(order) - 1)])
    return frozenset(kept)
