"""Chen et al.'s sublinear-memory training (memonger): walk the forward pass keeping a checkpoint
whenever the bytes since the last one pass a threshold, recompute everything else, and search the
threshold with every candidate scored by the real planner."""
import math

from ..planning import smallest
from .recompute import droppable


def split(graph, threshold):
    """Chen et al.'s greedy split (their Alg. 3): (tensors to drop, bytes kept at the checkpoints,
    the largest segment's bytes). Nodes sharing a `mirror_stage` annotation are kept or dropped
    together: one checkpoint in a stage keeps the whole stage."""
    candidates = droppable(graph)
    drop, stage_kept, stages = set(), set(), {}
    kept = largest = temp = 0
    for node in (n for n in graph.nodes if n.notes.forward):
        outs = [o for o in node.outputs if o in candidates]
        if not outs:
            continue
        size = sum(graph.tensors[o].nbytes for o in outs)
        temp += size
        stage = node.notes.mirror_stage
        if stage is not None:
            stages.setdefault(stage, []).extend(outs)
        if temp > threshold:
            kept, largest, temp = kept + size, max(largest, temp), 0
            if stage is not None:
                stage_kept.add(stage)
        else:
            drop.update(outs)
    for stage in stage_kept:
        drop.difference_update(stages[stage])
    return drop, kept, max(largest, temp)


def thresholds(graph, trials=6, rounds=3):
    """memonger's thresholds: `rounds` from 0, each next one sqrt(kept * largest / 2) of the split at the
    one before, then `trials` on a grid up to the last guess * sqrt(2)."""
    found, threshold, smallest = [], 0, None
    for _ in range(rounds):
        found.append(threshold)
        _, kept, largest = split(graph, threshold)
        smallest = largest if smallest is None else min(smallest, largest)
        threshold = int(math.sqrt(kept * largest / 2))
    step = int((threshold * math.sqrt(2) - smallest) / trials)
    return found + [smallest + k * step for k in range(1, trials + 1 if step > 0 else 1)]


def search(graph, measure, trials=6, rounds=3, progress=None):
    """memonger's search_plan: the split at each of its `thresholds` planned, the smallest arena chosen (ties:
    the first threshold's). `measure(drop)` plans a candidate as far as its buffers (planning.Measured); they
    are allocated by rising LOAD, only while one can beat the best arena so far. Returns (best drop set, its
    arena, [(threshold, arena, or None where it was not allocated)])."""
    candidates = [(t, split(graph, t)[0]) for t in thresholds(graph, trials, rounds)]
    measured = []
    for _, drop in candidates:
        measured.append(measure(drop))
        if progress:
            progress(len(measured), len(candidates))
    arenas = [None] * len(candidates)

    def allocated(k, below):
        arenas[k] = measured[k].arena(below)
        return arenas[k]

    best, k = smallest([m.load for m in measured], allocated)
    return candidates[k][1], best, [(t, arena) for (t, _), arena in zip(candidates, arenas)]
