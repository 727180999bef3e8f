"""Builder: appends nodes of ops the planner knows to a graph, under fresh names, for every rule that makes
a graph grow (gradients, losses, optimizer steps, decompositions, loss scaling, collectives)."""
import numpy as np

from .dtypes import to_onnx
from .ir import Annotations, Node, Phase, Tensor


class FreshNames:
    """Names never given before: `fresh(base)` is `base` where it is free, else `base` + `sep` + the first count
    that is (`taken`: names already in use, such as a graph's nodes and tensors)."""

    def __init__(self, taken=(), sep="/"):
        self.taken, self.sep = set(taken), sep

    def __call__(self, base):
        name, count = base, 0
        while name in self.taken:
            count += 1
            name = f"{base}{self.sep}{count}"
        self.taken.add(name)
        return name


class Builder:
    """Appends typed-later nodes to a graph under fresh names; `op` returns the output name(s). Nodes
    are annotated with `phase`, which the schedule, the remat strategies and the plan's breakdown read.
    `needs`: the tensors a gradient must reach (None: every one), for rules whose extra outputs cost work."""

    def __init__(self, graph, prefix="grad", phase=Phase.BACKWARD, needs=None):
        self.graph, self.prefix, self.phase, self.nodes, self.tensors = graph, prefix, phase, [], {}
        self.count, self.needs = 0, needs
        self.node_names = {n.name for n in graph.nodes}

    def needed(self, name):
        """Whether some requested gradient depends on `name`'s gradient."""
        return self.needs is None or name in self.needs

    def shape(self, name):
        return (self.tensors.get(name) or self.graph.tensors[name]).shape

    def dtype(self, name):
        return (self.tensors.get(name) or self.graph.tensors[name]).dtype

    def _fresh(self, hint):
        """A node or tensor name the graph does not use yet (a model's own nodes may have names like ours)."""
        while True:
            self.count += 1
            name = f"{self.prefix}/{hint}/{self.count}"
            if name not in self.node_names and \
                    not any(n in self.graph.tensors or n in self.tensors for n in (name, f"{name}:0")):
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
