"""Chen et al.'s sublinear-memory training (memonger): walk the forward pass keeping a checkpoint
whenever the bytes since the last one pass a threshold, recompute everything else, and search the
threshold with every candidate scored by the real planner."""
import math

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


def search(graph, score, trials=6, rounds=3, progress=None):
    """memonger's search_plan: `rounds` thresholds from 0, each next one sqrt(kept * largest / 2), then
    `trials` thresholds on a grid up to the last guess * sqrt(2); `score(drop, below)` (the planned arena,
    or None where it is not below `below`, the best so far) decides. Returns (best drop set, its score,
    [(threshold, score or None)] tried)."""
    tried, best = [], None

    def attempt(threshold):
        nonlocal best
        drop, kept, largest = split(graph, threshold)
        cost = score(drop, best and best[1])
        tried.append((threshold, cost))
        if cost is not None and (best is None or cost < best[1]):
            best = (drop, cost)
        if progress:
            progress(len(tried), rounds + trials)
        return kept, largest

    threshold, smallest = 0, None
    for _ in range(rounds):
        kept, largest = attempt(threshold)
        smallest = largest if smallest is None else min(smallest, largest)
        threshold = int(math.sqrt(kept * largest / 2))
    step = int((threshold * math.sqrt(2) - smallest) / trials)
    for k in range(1, trials + 1 if step > 0 else 1):
        attempt(smallest + k * step)
    return best[0], best[1], tried
