"""The one rewrite every rematerialisation strategy ends in: forward tensors are not kept for the
backward pass; backward readers read clones, computed again from the tensors that are kept
(checkpoints, params, inputs), so the forward value dies at its last forward reader.

`replay` places clones of forward nodes just before given backward nodes (a node may be recomputed
several times); `recompute` is the common case where each tensor of a drop set is recomputed once,
just before its first backward reader (or again for readers more than a horizon later). Clones are backward nodes annotated
`recompute`.
"""
from dataclasses import replace

from .. import ops, shapes
from ..ir import Phase, Tensor

SUFFIX = "/recompute"


def droppable(graph):
    """The tensors a strategy may drop: activations of the forward pass other than graph outputs and
    updates, and other than the draws of random ops (computed again they would differ from the values
    the forward pass used; MXNet never recomputes them either) and what a pipeline stage receives (a copy
    would wait for a second send). Only those backward reads, directly or through the clones that compute
    them, are recomputed; dropping the others changes nothing."""
    kept = {new for new, _ in graph.updates} | set(graph.outputs)
    schemas = {n.name: ops.of(n, graph.opsets) for n in graph.nodes if n.notes.forward}
    return {o for n in graph.nodes if n.notes.forward and not schemas[n.name].random and schemas[n.name].replayable
            for o in n.outputs if o and o not in kept and graph.tensors[o].kind == "activation"}


def recompute(graph, drop, horizon=None):
    """The typed graph with every backward read of a tensor in `drop` redirected to its recomputation:
    one for all backward readers (horizon None), or a clone serves the readers up to `horizon` nodes
    after it and later ones get a new one (less memory, as clones die sooner; more FLOPs)."""
    drop = set(drop) & droppable(graph)
    if not drop:
        return graph
    producer, made, before = graph.producers, {}, {}  # made: node name -> position of its latest clone
    for position, node in enumerate(graph.nodes):
        if node.notes.forward:
            continue

        def fresh(n):
            return n.name in made and (horizon is None or position - made[n.name] <= horizon)

        # the producers of the dropped tensors it reads, after those of the dropped tensors they read:
        # depth first without recursion, as chains of dropped tensors can be thousands long
        order, stack = [], [producer[i] for i in reversed(node.inputs) if i in drop]
        while stack:
            top = stack[-1]
            if fresh(top):
                stack.pop()
                continue
            missing = [producer[i] for i in top.inputs if i in drop and not fresh(producer[i])]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            made[top.name] = position
            order.append((top, frozenset(o for o in top.outputs if o in drop)))
        if order:
            before[node.name] = order
    return replay(graph, before)


def replay(graph, before):
    """The typed graph with, just before each backward node named in `before`, clones of the forward
    nodes it lists ((node, outputs to compute again), in order). Every backward read, clones' included,
    takes the latest computation of a tensor; the k-th clone of a node has the suffix SUFFIX + k (k > 1).
    A clone reads tensors of the types its source read, so its outputs have its source's types."""
    # A node that updates a param it reads (training BatchNormalization's running statistics, which its
    # output does not depend on) is recomputed reading the new value, as the old one is gone by then.
    own = {(graph.producers[new].name, old): new for new, old in graph.updates}
    tensors, nodes, latest, count = dict(graph.tensors), [], {}, {}
    for node in graph.nodes:
        for source, outputs in before.get(node.name, ()):
            count[source.name] = count.get(source.name, 0) + 1
            suffix = SUFFIX + (str(count[source.name]) if count[source.name] > 1 else "")
            inputs = tuple(latest.get(i) or own.get((source.name, i), i) for i in source.inputs)
            outs = tuple(o + suffix if o in outputs else "" for o in source.outputs)
            while outs and not outs[-1]:
                outs = outs[:-1]
            for o in filter(None, outs):
                computed = graph.tensors[o[:-len(suffix)]]  # a clone's types are its source's
                tensors[o] = Tensor(o, computed.shape, computed.dtype, "activation")
                latest[computed.name] = o
            nodes.append(replace(source, name=source.name + suffix, inputs=inputs, outputs=outs,
                                 notes=replace(source.notes, phase=Phase.BACKWARD, recompute=True)))
        if not node.notes.forward and any(i in latest for i in node.inputs):
            node = replace(node, inputs=tuple(latest.get(i, i) for i in node.inputs))
        nodes.append(node)
    return shapes.prune(replace(graph, nodes=tuple(nodes), tensors=tensors))
