"""Reverse-mode gradients over the IR: the backward pass as more nodes of ops the planner and the
executor already know, so that planning and running a training step needs nothing new.

Each op's schema says how to differentiate it (`Schema.gradient(b, node, dys)`, returning one
gradient name or None per input); this module walks the graph backwards, sums the contributions
a tensor receives from its readers, and prunes what no requested gradient needs.
"""
from dataclasses import replace

import numpy as np

from . import ops, shapes
from .builder import Builder
from .decomposition import decomposed
from .dtypes import is_float
from .errors import ModelError
from .ir import op_name


def backward(graph, loss, wrt=None):
    """The typed graph with the gradients of `loss` (see `gradients`) as extra outputs, and
    {param: gradient tensor name}."""
    graph, grads = gradients(graph, loss, wrt)
    tensors = {**graph.tensors, **{g: replace(graph.tensors[g], kind="output") for g in grads.values()}}
    return replace(graph, tensors=tensors, outputs=(*graph.outputs, *grads.values())), grads


def gradients(graph, loss, wrt=None, seed=None):
    """The graph with nodes computing d(sum of `loss`)/d(each of `wrt`) appended (default: every
    float param), typed; and {param: gradient tensor name}; with `seed` (a scalar tensor), those
    gradients times it (a scaled loss's). Gradients nothing needs are not built; a tensor in `wrt` that
    the loss does not depend on differentiably gets zeros. Shape inference prunes what no output or
    update reads: the caller adds the gradients' readers before planning."""
    wrt = [t.name for t in graph.params() if is_float(t.dtype)] if wrt is None else list(wrt)
    graph = _through_parts(graph, _depends_on(graph, set(wrt)))
    needs = _depends_on(graph, set(wrt))
    if loss not in needs:
        raise ModelError(f"loss {loss!r} does not depend on any of the tensors to differentiate")
    b = Builder(graph, needs=needs)
    grads = {loss: b.op("ConstantOfShape", shape=list(graph.tensors[loss].shape),
                        value=np.ones(1, graph.tensors[loss].dtype))}
    if seed is not None:
        grads[loss] = b.op("Mul", grads[loss], seed)
    for node in reversed(graph.nodes):
        dys = [grads.get(o) for o in node.outputs]
        if not any(dys) or not any(i in needs for i in node.inputs if i):
            continue
        schema = ops.of(node, graph.opsets)
        if schema.gradient is None:
            raise ModelError(f"node {node.name!r} ({op_name(node.domain, node.op)}) has no gradient rule")
        start = len(b.nodes)
        for i, dx in zip(node.inputs, schema.gradient(b, node, dys)):
            if dx is None or i not in needs:
                continue
            grads[i] = b.op("Add", grads[i], dx) if i in grads else dx
        b.nodes[start:] = [replace(n, notes=replace(n.notes, of=node.name)) for n in b.nodes[start:]]
    for w in wrt:
        if w not in grads:
            grads[w] = b.op("ConstantOfShape", shape=list(graph.tensors[w].shape),
                            value=np.zeros(1, graph.tensors[w].dtype))
    grads = {w: grads[w] for w in wrt}
    typed = shapes.retype(replace(graph, nodes=(*graph.nodes, *b.nodes), tensors={**graph.tensors, **b.tensors},
                                  outputs=(*graph.outputs, *grads.values())), graph)
    return replace(typed, outputs=graph.outputs), grads


def _through_parts(graph, needs):
    """The graph with each node that gradients pass through and whose op has a kernel and a `decompose`
    rule but no gradient rule (LSTM, GRU, RNN) replaced by its parts, which are differentiated instead."""
    return decomposed(graph, lambda node, schema: not schema.differentiable and any(i in needs for i in node.inputs))


def _depends_on(graph, sources):
    """The tensors whose value depends on any of `sources` (the sources included)."""
    found = set(sources)
    for node in graph.nodes:
        if any(i in found for i in node.inputs if i):
            found.update(o for o in node.outputs if o)
    return found
