"""Pipeline parallelism's two decisions (planner.parallel's `pp`): where a training step's graph is cut into
stages, and the order in which a stage runs its microbatches.

The cut: each forward node goes to one of `pp` contiguous runs of the forward pass, cut only where few
activations cross (at most CROSSING times the fewest bytes crossing any place in the middle half of the
work: between transformer blocks, the residual stream and a norm's output), balancing the FLOPs of each
stage's forward nodes and the backward nodes made from them (the stage with the most FLOPs sets the
pipeline's pace). Backward nodes follow the forward node
they differentiate, an optimizer node its param's readers.

The order is 1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's default): stage s of pp first runs
min(pp - s - 1, M) forwards, then alternates one forward and one backward, then the remaining backwards, so
that it holds at most pp - s microbatches' saved activations at once.
"""
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


def assign(graph, stages, labels):
    """[stage of each node of the training step `graph`], the forward pass cut into `stages` runs at or
    before the first forward node reading `labels` (the loss goes with the last stage)."""
    nodes = graph.nodes
    forward = [k for k, n in enumerate(nodes) if n.notes.phase is Phase.FORWARD]
    index = {nodes[k].name: j for j, k in enumerate(forward)}
    loss = next((j for j, k in enumerate(forward) if labels in nodes[k].inputs), len(forward))
    work = [ops.node_flops(graph, nodes[k]) for k in forward]
    for node in nodes:
        if node.notes.of in index:
            work[index[node.notes.of]] += ops.node_flops(graph, node)
    cuts = _cuts(work, _candidates(graph, forward, loss, work), stages)
    stage_of = {}
    for j, k in enumerate(forward):
        stage_of[k] = sum(1 for c in cuts if c < j)
    for k, node in enumerate(nodes):
        if node.notes.of in index:
            stage_of[k] = stage_of[forward[index[node.notes.of]]]
    _readers_stage(graph, stage_of)
    return [stage_of[k] for k in range(len(nodes))]


def _candidates(graph, forward, end, work):
    """The positions j (a cut after forward node j, before `end`) whose crossing activations are within
    CROSSING times the fewest bytes crossing a place between a quarter and three quarters of the `work`."""
    nodes, made, last = graph.nodes, {}, {}
    for j, k in enumerate(forward):
        for name in nodes[k].inputs:
            if name in made:
                last[name] = j
        for name in nodes[k].outputs:
            if name and graph.tensors[name].kind == "activation":
                made[name] = j
    change = [0] * (len(forward) + 1)
    for name, j in made.items():
        if name in last:
            change[j] += graph.tensors[name].nbytes
            change[last[name]] -= graph.tensors[name].nbytes
    crossing, held = [], 0
    for j in range(max(end - 1, 0)):
        held += change[j]
        crossing.append(held)
    total, done, middle = sum(work), 0, []
    for j, c in enumerate(crossing):
        done += work[j]
        if c > 0 and total / 4 <= done <= 3 * total / 4:
            middle.append(c)
    fewest = min(middle or [c for c in crossing if c > 0] or [0])
    return [j for j, c in enumerate(crossing) if 0 < c <= CROSSING * fewest]


def _cuts(work, candidates, stages):
    """stages - 1 positions of `candidates` that make the most work of a stage least (the greedy cut is
    the best one under each bound tried, the bound found by bisection)."""
    if len(candidates) < stages - 1:
        raise ConfigError(f"pipeline parallelism over {stages} stages: the forward pass has {len(candidates)} "
                          "places to cut where few activations cross (between layers); use fewer stages")
    prefix = [0]
    for w in work:
        prefix.append(prefix[-1] + w)

    def greedy(bound):
        cuts, start = [], 0
        for j, c in enumerate(candidates):
            reach = candidates[j + 1] + 1 if j + 1 < len(candidates) else len(work)
            if prefix[reach] - prefix[start] > bound:  # the stage cannot run on to the next place to cut
                if prefix[c + 1] - prefix[start] > bound:
                    return None
                cuts.append(c)
                start = c + 1
        return cuts if prefix[-1] - prefix[start] <= bound else None

    lo, hi = max(work, default=0), prefix[-1]
    for _ in range(60):
        mid = (lo + hi) / 2
        found = greedy(mid)
        if found is not None and len(found) <= stages - 1:
            hi = mid
        else:
            lo = mid
    cuts = greedy(hi) or []

    def balance(c):  # the lesser work on either side of c within its stage
        below = max((x for x in cuts if x < c), default=-1)
        above = min((x for x in cuts if x > c), default=len(work) - 1)
        return min(prefix[c + 1] - prefix[below + 1], prefix[above + 1] - prefix[c + 1])

    while len(cuts) < stages - 1:  # the bound needs fewer stages: cut a stage again where it halves best
        cuts.append(max((c for c in candidates if c not in cuts), key=balance))
    return sorted(cuts)


def _readers_stage(graph, stage_of):
    """Give each node without a stage (the loss's seed, a zero gradient, an optimizer node) its readers'
    stage, or for an optimizer node its param's readers' (walking backwards, readers first); a param read
    by two stages (tied weights) is refused."""
    nodes = graph.nodes
    readers = {}
    for k, node in enumerate(nodes):
        for name in node.inputs:
            readers.setdefault(name, []).append(k)
    for k in reversed(range(len(nodes))):
        if k in stage_of:
            continue
        node = nodes[k]
        if node.notes.phase is Phase.OPTIMIZER:
            owners = {stage_of[r] for name in node.inputs if graph.tensors[name].kind == "param"
                      for r in readers[name] if nodes[r].notes.phase is not Phase.OPTIMIZER and r in stage_of}
            if len(owners) > 1:
                raise ConfigError(f"pipeline parallelism: a param {node.name!r} updates is read by stages "
                                  f"{sorted(owners)} (tied weights); memplan keeps each param in one stage")
            stage_of[k] = owners.pop() if owners else 0
        else:
            later = [stage_of[r] for name in node.outputs for r in readers.get(name, ()) if r in stage_of]
            stage_of[k] = min(later) if later else 0
    for name, ks in readers.items():
        t = graph.tensors.get(name)
        owners = {stage_of[r] for r in ks if nodes[r].notes.phase is Phase.FORWARD}
        if t is not None and t.kind == "param" and len(owners) > 1:
            raise ConfigError(f"pipeline parallelism: param {name!r} is read by stages {sorted(owners)} (tied "
                              "weights); memplan keeps each param in one stage")
