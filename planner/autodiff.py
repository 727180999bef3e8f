"""Reverse-mode gradients over the IR: the backward pass as more nodes of ops the planner and the
executor already know, so that planning and running a training step needs nothing new.

Each op's schema says how to differentiate it (`Schema.gradient(b, node, dys)`, returning one
gradient name or None per input); this module walks the graph backwards, sums the contributions
a tensor receives from its readers, and prunes what no requested gradient needs.
"""
from dataclasses import replace

import numpy as np

from . import ops, shapes
from .dtypes import is_float, to_onnx
from .errors import ModelError
from .ir import Annotations, Node, Phase, Tensor, op_name


class Builder:
    """Appends typed-later nodes to a graph under fresh names; `op` returns the output name(s). Nodes
    are annotated with `phase`, which the schedule, the remat strategies and the plan's breakdown read.
    `needs`: the tensors a gradient must reach (None: every one), for rules whose extra outputs cost work."""

    def __init__(self, graph, prefix="grad", phase=Phase.BACKWARD, needs=None):
        self.graph, self.prefix, self.phase, self.nodes, self.tensors = graph, prefix, phase, [], {}
        self.count, self.needs = 0, needs

    def needed(self, name):
        """Whether some requested gradient depends on `name`'s gradient."""
        return self.needs is None or name in self.needs

    def shape(self, name):
        return (self.tensors.get(name) or self.graph.tensors[name]).shape

    def dtype(self, name):
        return (self.tensors.get(name) or self.graph.tensors[name]).dtype

    def _fresh(self, hint):
        """A node or tensor name the graph does not use yet."""
        while True:
            self.count += 1
            name = f"{self.prefix}/{hint}/{self.count}"
            if not any(n in self.graph.tensors or n in self.tensors for n in (name, f"{name}:0")):
                return name

    def op(self, op_type, *inputs, outputs=1, domain="", **attrs):
        """A new node's output name(s): `outputs` of them, or, for a sequence of bools, those it marks (the others
        omitted: None here, "" in the node). A Reshape's shape holds its dims as they are (allowzero): a built
        shape's 0 is a dim of 0 (a zero-size batch), never ONNX's mark for "copy the input's dim"."""
        if op_type == "Reshape" and not domain:
            attrs.setdefault("allowzero", 1)
        name = self._fresh(op_type)
        marks = (True,) * outputs if isinstance(outputs, int) else tuple(outputs)
        outs = tuple(f"{name}:{k}" if kept else "" for k, kept in enumerate(marks))
        self.nodes.append(Node(op_type, tuple(inputs), outs, attrs, name, Annotations(self.phase), domain))
        for out in filter(None, outs):
            self.tensors[out] = Tensor(out, None, None, "activation")
        return outs[0] if outputs == 1 else tuple(out or None for out in outs)

    def cast(self, name, dtype):
        """`name` cast to `dtype`, its dtype known at once (so that constants can be made like it)."""
        out = self.op("Cast", name, to=to_onnx(dtype))
        self.tensors[out] = Tensor(out, self.shape(name), np.dtype(dtype), "activation")
        return out

    def const(self, value, like):
        """A constant of `like`'s dtype."""
        name = self._fresh("const")
        value = np.asarray(value, dtype=self.dtype(like))
        self.tensors[name] = Tensor(name, value.shape, value.dtype, "const", value)
        return name

    def unbroadcast(self, dy, dy_shape, shape):
        """`dy` (of shape `dy_shape`) summed over the dims that broadcasting added or stretched, down to
        the input's `shape`."""
        lead = len(dy_shape) - len(shape)
        axes = [k for k in range(len(dy_shape)) if k < lead or (shape[k - lead] == 1 and dy_shape[k] != 1)]
        if not axes:
            return dy
        if all(dy_shape[k] == 1 for k in axes):  # nothing to sum: a view, not a copy
            return self.op("Reshape", dy, shape=list(shape))
        summed = self.op("ReduceSum", dy, axes=axes, keepdims=1)
        return self.op("Reshape", summed, shape=list(shape))


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
    from .passes.decompose import decomposed  # the passes import this module
    return decomposed(graph, lambda node, schema: not schema.differentiable and any(i in needs for i in node.inputs))


def _depends_on(graph, sources):
    """The tensors whose value depends on any of `sources` (the sources included)."""
    found = set(sources)
    for node in graph.nodes:
        if any(i in found for i in node.inputs if i):
            found.update(o for o in node.outputs if o)
    return found
