"""The one rewrite every rematerialisation strategy ends in: forward tensors in `drop` are not kept
for the backward pass; each backward reader reads a clone, computed again from the tensors that are
kept (checkpoints, params, inputs), so the forward value dies at its last forward reader.

Each dropped tensor is recomputed once, by a clone of its producer placed in the file just before
its first backward reader; the clones are backward nodes (they run after the forward pass) marked
`recompute` in their meta.
"""
from dataclasses import replace

from .. import shapes
from ..ir import Tensor

SUFFIX = "/recompute"


def droppable(graph):
    """The tensors a strategy may drop: activations of the forward pass other than graph outputs and
    updates. Only those backward reads, directly or through the clones that compute them, are
    recomputed; dropping the others changes nothing."""
    kept = {new for new, _ in graph.updates} | set(graph.outputs)
    return {o for n in graph.nodes if "phase" not in n.meta for o in n.outputs
            if o and o not in kept and graph.tensors[o].kind == "activation"}


def recompute(graph, drop):
    """The typed graph with every backward read of a tensor in `drop` redirected to its recomputation."""
    drop = set(drop) & droppable(graph)
    if not drop:
        return graph
    producer = graph.producers
    clones, tensors, emitted = {}, dict(graph.tensors), []
    # A node that updates a param it reads (training BatchNormalization's running statistics, which its
    # output does not depend on) is recomputed reading the new value, as the old one is gone by then.
    own = {(producer[new].name, old): new for new, old in graph.updates}

    def clone(name):
        """The name of `name`'s recomputation; its producer's clone is made (after the clones it reads,
        depth first without recursion: chains of dropped tensors can be thousands long) if not yet."""
        stack = [producer[name]]
        while stack:
            node = stack[-1]
            if node.name in clones:
                stack.pop()
                continue
            missing = [producer[i] for i in node.inputs if i in drop and producer[i].name not in clones]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            inputs = tuple(i + SUFFIX if i in drop else own.get((node.name, i), i) for i in node.inputs)
            outputs = tuple(o + SUFFIX if o in drop else "" for o in node.outputs)
            while outputs and not outputs[-1]:
                outputs = outputs[:-1]
            for o in filter(None, outputs):
                tensors[o] = Tensor(o, None, None, "activation")
            clones[node.name] = replace(node, name=node.name + SUFFIX, inputs=inputs, outputs=outputs,
                                        meta={**node.meta, "phase": "backward", "recompute": 1})
            emitted.append(clones[node.name])
        return name + SUFFIX

    nodes = []
    for node in graph.nodes:
        if "phase" in node.meta:
            emitted.clear()
            inputs = tuple(clone(i) if i in drop else i for i in node.inputs)
            nodes += emitted
            node = replace(node, inputs=inputs)
        nodes.append(node)
    return shapes.infer(replace(graph, nodes=tuple(nodes), tensors=tensors))
