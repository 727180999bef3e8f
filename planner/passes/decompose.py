"""Replace composite ops (those whose schema says how to `decompose` them) by the ops they are made of,
so that planning, running and differentiating them needs nothing of their own."""
from dataclasses import replace

from .. import ops, shapes
from ..autodiff import Builder


def decompose(graph, which=lambda schema: schema.kernel is None):
    """The typed `graph` with every node whose schema has a `decompose` rule and satisfies `which`
    (default: the op has no kernel of its own) replaced by its parts, which write the node's outputs
    and carry its annotations; the graph itself when there is none."""
    nodes, tensors, changed = [], dict(graph.tensors), False
    for node in graph.nodes:
        schema = ops.of(node, graph.opsets)
        if schema.decompose is None or not which(schema):
            nodes.append(node)
            continue
        b = Builder(graph, prefix=node.name or node.op, phase=None)
        made = schema.decompose(b, node)
        rename = dict(zip(made, node.outputs))
        for part in b.nodes:
            nodes.append(replace(part, inputs=tuple(rename.get(i, i) for i in part.inputs),
                                 outputs=tuple(rename.get(o, o) for o in part.outputs), meta=dict(node.meta)))
        tensors.update((name, t) for name, t in b.tensors.items() if name not in rename)
        changed = True
    return shapes.infer(replace(graph, nodes=tuple(nodes), tensors=tensors)) if changed else graph
