"""Pipeline parallelism's two decisions (planner.parallel's `pp`): where a training step's graph is cut into
stages, and the order in which a stage runs its microbatches.

The cut: each forward node goes to one of `pp` contiguous runs of the forward pass, cut only where few
activations cross (at most CROSSING times the fewest bytes crossing any place in the middle half of the
forward nodes, values read across most of the pass left out: between transformer blocks, the residual stream
and a norm's output). Among those cuts it takes the
ones whose busiest stage does the fewest FLOPs (its forward nodes' and the backward nodes made from them:
the busiest stage sets the pipeline's pace) and, among those, the ones whose fullest stage holds the least
memory (activations times the microbatches in flight, params with their gradients and state). Backward
nodes follow the forward node they differentiate, an optimizer node its param's readers.

The order is 1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's default): stage s of pp first runs
min(pp - s - 1, M) forwards, then alternates one forward and one backward, then the remaining backwards, so
that it holds at most pp - s microbatches' saved activations at once.
"""
import numpy as np

from . import ops
from .errors import ConfigError
from .ir import Phase

CROSSING = 2.0
"""How many times the fewest crossing bytes (in the middle half of the work) a cut may carry."""


def order(stage, stages, microbatches):
    """[("F" or "B", microbatch)] of 1F1B at `stage` of `stages`."""
    warmup = min(stages - stage - 1, microbatches)
    steps = [("F", j) for j in range(warmup)]
    for j in range(microbatches - warmup):
        steps += [("F", warmup + j), ("B", j)]
    return steps + [("B", j) for j in range(microbatches - warmup, microbatches)]


def in_flight(stage, stages, microbatches):
    """The most microbatches whose saved activations `stage` holds at once under 1F1B."""
    return min(stages - stage, microbatches)


def cut(graph, stages, microbatches, labels):
    """[j]: the stages - 1 places the forward pass of the training step `graph` is cut at (after its j-th forward
    node), at or before the first forward node reading `labels` (the loss goes with the last stage)."""
    nodes = graph.nodes
    forward = [k for k, n in enumerate(nodes) if n.notes.phase is Phase.FORWARD]
    index = {nodes[k].name: j for j, k in enumerate(forward)}
    loss = next((j for j, k in enumerate(forward) if labels in nodes[k].inputs), len(forward))
    work = [ops.node_flops(graph, nodes[k]) for k in forward]
    for node in nodes:
        if node.notes.of in index:
            work[index[node.notes.of]] += ops.node_flops(graph, node)
    memory = [(sum(graph.tensors[o].nbytes for o in nodes[k].outputs if o),
               sum(graph.tensors[i].nbytes for i in nodes[k].inputs if i and graph.tensors[i].kind == "param"))
              for k in forward]
    candidates = _candidates(graph, forward, loss)
    return _balanced(work, memory, candidates, _fewest_flops(work, candidates, stages), stages, microbatches)


def assign(graph, cuts):
    """[stage of each node of the training step `graph`] whose forward pass is cut at `cuts` (see `cut`)."""
    nodes = graph.nodes
    forward = [k for k, n in enumerate(nodes) if n.notes.phase is Phase.FORWARD]
    index = {nodes[k].name: j for j, k in enumerate(forward)}
    stage_of = {}
    for j, k in enumerate(forward):
        stage_of[k] = sum(1 for c in cuts if c < j)
    for k, node in enumerate(nodes):
        if node.notes.of in index:
            stage_of[k] = stage_of[forward[index[node.notes.of]]]
    _readers_stage(graph, stage_of)
    return [stage_of[k] for k in range(len(nodes))]


def _candidates(graph, forward, end):
    """The positions j (a cut after forward node j, before `end`) whose crossing activations are within
    CROSSING times the fewest bytes crossing a place between a quarter and three quarters of the forward nodes
    (not of the work: an LM head's vocabulary, or layers a tensor-parallel rank holds a piece of, would move the
    middle to the head); the activations counted are those read within half the forward pass of where they are
    made."""
    nodes, made, last = graph.nodes, {}, {}
    for j, k in enumerate(forward):
        for name in nodes[k].inputs:
            if name in made:
                last[name] = j
        for name in nodes[k].outputs:
            if name and graph.tensors[name].kind == "activation":
                made[name] = j
    change = [0] * (len(forward) + 1)
    for name, j in made.items():  # a value read across most of the pass (a mask) crosses every place alike
        if name in last and last[name] - j <= len(forward) / 2:
            change[j] += graph.tensors[name].nbytes
            change[last[name]] -= graph.tensors[name].nbytes
    crossing, held = [], 0
    for j in range(max(end - 1, 0)):
        held += change[j]
        crossing.append(held)
    middle = [c for j, c in enumerate(crossing) if c > 0 and len(crossing) / 4 <= j <= 3 * len(crossing) / 4]
    fewest = min(middle or [c for c in crossing if c > 0] or [0])
    return [j for j, c in enumerate(crossing) if 0 < c <= CROSSING * fewest]


def _fewest_flops(work, candidates, stages):
    """The least FLOPs of the busiest stage over every cut into `stages` at `candidates` (bisection on the
    bound, each tried by the greedy cut, which needs the fewest stages under it)."""
    if len(candidates) < stages - 1:
        raise ConfigError(f"pipeline parallelism over {stages} stages: the forward pass has {len(candidates)} "
                          "places to cut where few activations cross (between layers); use fewer stages")
    prefix = _prefix(work)

    def stages_under(bound):
        count, start = 1, 0
        for j, c in enumerate(candidates):
            reach = candidates[j + 1] + 1 if j + 1 < len(candidates) else len(work)
            if prefix[reach] - prefix[start] > bound:  # the stage cannot run on to the next place to cut
                if prefix[c + 1] - prefix[start] > bound:
                    return None
                count, start = count + 1, c + 1
        return count if prefix[-1] - prefix[start] <= bound else None

    lo, hi = max(work, default=0), prefix[-1]
    for _ in range(60):
        mid = (lo + hi) / 2
        count = stages_under(mid)
        lo, hi = (lo, mid) if count is not None and count <= stages else (mid, hi)
    return hi


def _balanced(work, memory, candidates, bound, stages, microbatches):
    """stages - 1 cuts at `candidates` whose stages each do at most `bound` FLOPs (the pace) and, among
    those, whose largest memory is least (dynamic programming over the places to cut, each stage's choices
    weighed at once as arrays): a stage's memory is its activations times the microbatches it holds in flight,
    and its params four times over (with gradients and optimizer state), so that the early stages, which hold
    the most microbatches, take fewer layers. Of equal choices the earliest cut is taken."""
    flops, made, params = (np.asarray(_prefix(v), dtype=np.float64)
                           for v in (work, [m[0] for m in memory], [m[1] for m in memory]))
    ends = np.asarray([*candidates, len(work) - 1])
    slack = bound * (1 + 1e-9)

    def cost(stage, first, last):
        """The memory of `stage` running nodes first..last (arrays of the same shape), inf past the pace."""
        here = in_flight(stage, stages, microbatches) * (made[last + 1] - made[first]) + \
            4 * (params[last + 1] - params[first])
        return np.where(flops[last + 1] - flops[first] > slack, np.inf, here)

    best = [cost(0, np.zeros_like(ends), ends)]
    came = [np.full(len(ends), -1)]
    for stage in range(1, stages):
        value, source = np.full(len(ends), np.inf), np.full(len(ends), -1)
        for j in range(1, len(ends)):
            options = np.maximum(best[-1][:j], cost(stage, ends[:j] + 1, np.full(j, ends[j])))
            k = int(np.argmin(options))
            if options[k] < np.inf:
                value[j], source[j] = options[k], k
        best.append(value)
        came.append(source)
    cuts, at = [], int(came[-1][-1])
    for stage in range(stages - 2, -1, -1):
        cuts.append(int(ends[at]))
        at = int(came[stage][at])
    return sorted(cuts)


def _prefix(values):
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def indexed(graph):
    """({tensor: index of the node writing it}, {tensor: indices of the nodes reading it, in order}): the
    graph's producers and consumers by position in graph.nodes, as stages are."""
    at = {id(node): k for k, node in enumerate(graph.nodes)}
    return ({name: at[id(node)] for name, node in graph.producers.items()},
            {name: [at[id(node)] for node in users] for name, users in graph.consumers.items()})


def _readers_stage(graph, stage_of):
    """Give each node without a stage its readers' stage (the loss's seed, a zero gradient), or for an
    optimizer-phase node the stage that completes the gradient it reads (walking backwards, readers first).
    A param read by several stages (tied or deduplicated weights) is updated where its gradient is summed;
    the others receive its new value (planner/passes/pipeline_stage.py)."""
    nodes = graph.nodes
    producer, readers = indexed(graph)
    for k in reversed(range(len(nodes))):
        if k in stage_of:
            continue
        node = nodes[k]
        made = [stage_of[producer[i]] for i in node.inputs if i in producer and producer[i] in stage_of]
        later = [stage_of[r] for name in node.outputs for r in readers.get(name, ()) if r in stage_of]
        if node.notes.phase is Phase.OPTIMIZER and made:
            stage_of[k] = max(made)
        else:
            stage_of[k] = min(later) if later else max(made, default=0)
