"""Composite ops (those whose schema says how to `decompose` them) replaced by the ops they are made of,
so that planning, running and differentiating them needs nothing of their own: the decompose pass runs
it on the whole graph, autodiff on the nodes gradients pass through. A decomposition that unrolls (a
recurrence over its sequence) makes at most MAX_UNROLLED nodes, as control flow does."""
from dataclasses import replace

from . import ops, shapes
from .builder import Builder
from .errors import ShapeError
from .ir import op_name
from .ops import control_flow


class Bounded(Builder):
    """A Builder for the parts of `node` that refuses, before making it, a node past the MAX_UNROLLED
    nodes (or outputs of one node) that one decomposition may make."""

    def __init__(self, graph, node):
        super().__init__(graph, prefix=node.name or node.op, phase=node.notes.phase)
        self.node = node

    def op(self, op_type, *inputs, outputs=1, domain="", **attrs):
        limit = control_flow.MAX_UNROLLED
        if len(self.nodes) >= limit or outputs > limit:
            raise ShapeError(f"node {self.node.name!r} ({op_name(self.node.domain, self.node.op)}): decomposing it "
                             f"makes more than {limit:,} {'nodes' if outputs <= limit else 'outputs of one node'}, "
                             "the most memplan unrolls (planner.ops.control_flow.MAX_UNROLLED)")
        return super().op(op_type, *inputs, outputs=outputs, domain=domain, **attrs)


def decomposed(graph, select=None):
    """The typed `graph` with every node whose op has a `decompose` rule and no kernel of its own (or
    one, where `select(node, schema)` picks the node) replaced by its parts, which write the node's
    outputs and carry its annotations; the graph itself when there is none. A rule gives None for an
    output the node leaves out."""
    nodes, tensors, changed = [], dict(graph.tensors), False
    for node in graph.nodes:
        schema = ops.of(node, graph.opsets)
        if schema.decompose is None or (schema.kernel is not None and not (select and select(node, schema))):
            nodes.append(node)
            continue
        b = Bounded(graph, node)
        rename = dict(zip(schema.decompose(b, node), node.outputs))
        nodes += [replace(part, inputs=tuple(rename.get(i, i) for i in part.inputs),
                          outputs=tuple(rename.get(o, o) for o in part.outputs), notes=node.notes)
                  for part in b.nodes]
        tensors.update((name, t) for name, t in b.tensors.items() if name not in rename)
        changed = True
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors), graph) if changed else graph
