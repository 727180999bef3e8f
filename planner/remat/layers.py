"""Megatron-LM's two recomputations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models"): "selective" recomputes each attention core (QK^T, its scale and mask, softmax, the
dropout on the probabilities: what the scores cost, 5as²b a layer at 16 bits), "full" each transformer layer
from the residual stream entering it (2sbh a layer). Cores and layers are found by the forward graph's
structure; each one's clones run as one block just before the first backward node that reads what it dropped
(recompute.replay), as Megatron recomputes a checkpointed function whole. memplan.Dropout is recomputed too:
its mask is hashed from (seed, step, element), so a clone draws the mask the forward pass drew."""
import math
from dataclasses import replace
from itertools import accumulate

from .. import ops
from ..dtypes import is_float
from ..errors import ConfigError, say
from ..ops.misc import StepDropout
from ..training import STEP
from .recompute import droppable, replay

STRATEGIES = ("selective", "full")
STAGE_OPS = {("memplan", "Recv"), ("memplan", "Send")}
"""The ops of a pipeline stage, one of which may hold no transformer layer (the LM head and loss alone)."""


def attends(graph):
    """Whether a forward graph has attention these strategies find (an unfused core or a fused attention op), so
    that they apply to it."""
    return any(n.op == "Softmax" and not n.domain and _core(graph, n) for n in graph.nodes) or \
        any(ops.of(n, graph.opsets).stat == "fused_attention" for n in graph.nodes)


def rematerialize(graph, strategy):
    """(the training graph with `strategy`'s clones, what was decided): "attention" (the unfused cores found),
    "fused" (memplan.ScaledDotProductAttention nodes, whose gradient op already recomputes the scores tile by
    tile from the saved log-sum-exp, so that "selective" leaves them as they are), for "full" "layers" (the
    tensors entering each layer, which it keeps), and "recomputed" (the tensors dropped)."""
    forward = replace(graph, nodes=tuple(n for n in graph.nodes if n.notes.forward))
    cores = [c for c in (_core(forward, n) for n in forward.nodes if n.op == "Softmax" and not n.domain) if c]
    fused = [n for n in forward.nodes if ops.of(n, graph.opsets).stat == "fused_attention"]
    if not cores and not fused and any((n.domain, n.op) in STAGE_OPS for n in graph.nodes):
        return graph, {"attention": 0, "fused": 0, "layers": [], "recomputed": []}  # a stage holding no layer
    if not cores and not fused:
        raise ConfigError(f"{say(f'remat={strategy!r}', f'--remat {strategy}')} recomputes transformer layers "
                          "found by their attention (MatMul, Softmax, MatMul or a fused attention), and this "
                          "training step has none")
    info = {"attention": len(cores), "fused": len(fused)}
    if strategy == "selective":
        segments = [(core[:-1], {core[-1].outputs[0]}) for core in cores]
    else:
        segments = _layers(graph, {c[0].name for c in cores} | {n.name for n in fused}, strategy)
        info["layers"] = [sorted(inputs) for _, _, inputs in segments]
        segments = [(nodes, kept) for nodes, kept, _ in segments]
    candidates = _candidates(graph)
    drops = [{o for n in nodes for o in n.outputs if o in candidates} - kept for nodes, kept in segments]
    info["recomputed"] = sorted(set().union(*drops))
    return replay(graph, _blocks(graph, [nodes for nodes, _ in segments], drops)), info


def _candidates(graph):
    """The tensors recomputation may drop (recompute.droppable), and memplan.Dropout's outputs."""
    kept = {new for new, _ in graph.updates} | set(graph.outputs)
    hashed = [n for n in graph.nodes if n.notes.forward and isinstance(ops.of(n, graph.opsets), StepDropout)]
    return droppable(graph) | {o for n in hashed for o in n.outputs
                               if o and o not in kept and graph.tensors[o].kind == "activation"}


def _blocks(graph, segments, drops):
    """replay's {backward node: [(forward node, outputs to compute again)]}: each segment's nodes that make
    what it drops, in forward order, before the first backward node reading any of it."""
    owner = {t: k for k, drop in enumerate(drops) for t in drop}
    first = {}
    for node in graph.nodes:
        if not node.notes.forward:
            for name in node.inputs:
                if name in owner:
                    first.setdefault(owner[name], node.name)
    before = {}
    for k, reader in sorted(first.items()):
        before.setdefault(reader, []).extend((n, frozenset(drops[k].intersection(n.outputs))) for n in segments[k]
                                             if drops[k].intersection(n.outputs))
    return before


def _core(graph, softmax):
    """The attention core around `softmax` in the forward graph, in forward order: the single-reader chain up
    from it to the MatMul of its scores (through scales, masks, softcaps, reshapes) and down to MatMul(P, V)
    (through a dropout, a guard, reshapes); None where either end is not a MatMul."""
    p, size = softmax.outputs[0], _size(graph, softmax.outputs[0])
    scores, down = _scores(graph, softmax.inputs[0], size), [softmax]
    while scores:
        readers = graph.consumers.get(p, ())
        if len(readers) == 2 and graph.consumers.get(readers[0].outputs[0]) == [readers[1]]:
            down.append(readers[0])  # a guard, Where(IsNaN(p), 0, p)
            readers = readers[1:]
        if len(readers) != 1 or readers[0].domain and not isinstance(ops.of(readers[0], graph.opsets), StepDropout):
            return None
        node = readers[0]
        down.append(node)
        if node.op == "MatMul" and node.inputs[0] == p:
            return scores + down
        p = node.outputs[0]
        if _size(graph, p) != size:
            return None
    return None


def _scores(graph, name, size):
    """The nodes from the scores' MatMul down to the one making `name`, each output read once and of the
    scores' `size`; None where the chain reaches no MatMul."""
    node = graph.producers.get(name)
    if node is None or node.domain or len(graph.consumers.get(name, ())) != 1:
        return None
    if node.op == "MatMul":
        return [node]
    for i in node.inputs:
        chain = _scores(graph, i, size) if i and _size(graph, i) == size else None
        if chain:
            return chain + [node]
    return None


def _size(graph, name):
    """The elements of tensor `name`."""
    return math.prod(graph.tensors[name].shape)


def _layers(graph, anchors, strategy):
    """[(nodes, kept, inputs)] of each transformer layer, one per attention node in `anchors` (in each run of
    the forward pass): from the residual stream entering it (_start) to the one entering the next layer, the
    last layer to _end. `nodes`: its nodes that depend on its input, and those of its weights alone (_own);
    `kept`: what crosses its end."""
    layers = []
    for run in _runs(graph):
        at = [p for p, n in enumerate(run) if n.name in anchors]
        if not at:
            continue
        crossing, held, data = *_crossing(graph, run), _data(graph, run)
        starts = [_start(run, a, at[k - 1] if k else None, crossing, held, data, strategy)
                  for k, a in enumerate(at)]
        spans = list(zip(starts, starts[1:] + [_end(graph, run, at[-1], held, data)]))
        reached = [_reached(run[start + 1:end + 1], crossing(start)) for start, end in spans]
        layer_of = _own(graph, run, data, reached)
        for k, (start, end) in enumerate(spans):
            nodes = [n for n in run[:end + 1] if layer_of.get(n.name) == k]
            layers.append((nodes, set(crossing(end)), set(crossing(start))))
    return layers


def _own(graph, run, data, reached):
    """{node name: its layer} of the nodes each layer `reached` from its input, and of the nodes computing from
    params (and constant tensors) alone (a 16-bit copy of a weight, its transpose) whose values only that
    layer's nodes read in the run, wherever they run before its end: a layer recomputed whole computes them
    again from what is kept anyway, as Megatron's checkpointed layer casts its weights again. A value made from
    no param (a causal mask, which an export may make once for all layers or once a layer) or one that several
    layers read is no layer's."""
    layer_of = {name: k for k, names in enumerate(reached) for name in names}
    readers, weighted = {}, {name for name, t in graph.tensors.items() if t.kind == "param"}
    for node in run:
        for name in node.inputs:
            readers.setdefault(name, []).append(node.name)
        if weighted.intersection(node.inputs) and all(i in weighted or graph.tensors[i].kind == "const"
                                                      for i in node.inputs if i):
            weighted.update(o for o in node.outputs if o)
    for node in reversed(run):
        outputs = [o for o in node.outputs if o]
        if node.name in layer_of or not weighted.issuperset(outputs) or data.intersection(outputs):
            continue
        owners = {layer_of.get(r) for o in outputs for r in readers.get(o, ())}
        if len(owners) == 1 and None not in owners:
            layer_of[node.name] = owners.pop()
    return layer_of


def _start(run, a, previous, crossing, held, data, strategy):
    """The place where the layer of the attention at position `a` of the run begins: the last before it where
    the fewest bytes of float activations cross, among the _entries after the attention at `previous`."""
    places = _entries(run, a, previous, crossing, held, data)
    if not places:
        raise ConfigError(f"{say(f'remat={strategy!r}', f'--remat {strategy}')} found no activation entering "
                          f"the transformer layer of {run[a].name!r}")
    fewest = min(held[p] for p in places)
    return max(p for p in places if held[p] == fewest)


def _end(graph, run, a, held, data):
    """The place where the last layer, that of the attention at position `a` of the run, ends: the last before
    the loss (the first node reading a graph input none before it read, the step aside: the labels) and after
    the residual stream's last join (the last node reading data made before the attention) where the
    fewest bytes of float activations cross: in a GPT the final norm's output (the norm goes with the layer)."""
    seen = {i for n in run[:a + 1] for i in n.inputs} | {STEP}
    loss = next((p for p in range(a, len(run)) if any(graph.tensors[i].kind == "input" and i not in seen
                                                       for i in run[p].inputs if i)), len(run))
    past = _made_from(run, a, loss)
    joined = max((p for p in range(a, loss) if any(i in data and i not in past for i in run[p].inputs)), default=a)
    ends = [p for p in range(joined, loss) if held[p] > 0]
    fewest = min((held[p] for p in ends), default=0)
    return max((p for p in ends if held[p] == fewest), default=loss - 1)


def _entries(run, a, previous, crossing, held, data):
    """The places p before the attention at position `a` of the run, after the attention at `previous` (None:
    the first), where some float activations cross and, of the `data` crossing that the queries (its first
    input) are computed from after p, each was made from what the previous attention made: the residual stream
    has passed it."""
    past = None if previous is None else _made_from(run, previous, a)
    feeding, places = set(run[a].inputs[:1]), []
    for p in range(a - 1, (previous or 0) - 1, -1):
        if p + 1 < a and feeding.intersection(run[p + 1].outputs):
            feeding.update(run[p + 1].inputs)
        if held[p] > 0 and (past is None or all(t in past for t in crossing(p) if t in feeding and t in data)):
            places.append(p)
    return places


def _made_from(run, a, stop):
    """The tensors that the run's node at `a` makes, and those made from them before position `stop`."""
    made = {o for o in run[a].outputs if o}
    for node in run[a + 1:stop]:
        if made.intersection(node.inputs):
            made.update(o for o in node.outputs if o)
    return made


def _data(graph, run):
    """The tensors the run makes from its inputs (graph inputs, values received), not from params alone (a
    16-bit copy of a weight)."""
    data = set()
    for node in run:
        if not node.inputs or any(i in data or graph.tensors[i].kind == "input" for i in node.inputs if i):
            data.update(o for o in node.outputs if o)
    return data


def _reached(nodes, names):
    """The names of the `nodes` (in order) that read `names` or what such a node makes."""
    names, found = set(names), set()
    for node in nodes:
        if names.intersection(node.inputs):
            found.add(node.name)
            names.update(o for o in node.outputs if o)
    return found


def _runs(graph):
    """The forward pass in runs, each one computation: the forward nodes between backward ones (a microbatch's
    in a pipeline stage's 1F1B order), split where nothing made before is read after (warm-up microbatches
    run back to back)."""
    stretches, previous = [], None
    for k, node in enumerate(graph.nodes):
        if node.notes.forward:
            if previous != k - 1:
                stretches.append([])
            stretches[-1].append(node)
            previous = k
    for stretch in stretches:
        last = {i: p for p, n in enumerate(stretch) for i in n.inputs}
        start, reach = 0, -1
        for p, node in enumerate(stretch):
            reach = max(reach, *(last.get(o, -1) for o in node.outputs if o), -1)
            if reach <= p:
                yield stretch[start:p + 1]
                start = p + 1


def _crossing(graph, run):
    """(crossing(p): the tensors made at or before position p of the run and read after it, the float bytes of
    them at each position)."""
    made, last = {}, {}
    for p, node in enumerate(run):
        last.update((i, p) for i in node.inputs if i in made)
        made.update((o, p) for o in node.outputs if o)
    change = [0] * (len(run) + 1)
    for name, p in made.items():
        if name in last and is_float(graph.tensors[name].dtype):
            change[p] += graph.tensors[name].nbytes
            change[last[name]] -= graph.tensors[name].nbytes
    held = list(accumulate(change[:-1]))

    def crossing(p):
        return [name for name, q in made.items() if q <= p < last.get(name, q)]
    return crossing, held
