"""Precision: the typed graph computed in 16-bit floats ("fp16", "bf16") or under autocast's policy
("amp-fp16", "amp-bf16"), see planner.precision. Casts are ordinary nodes: one per tensor and type,
shared by its readers; the graph's float inputs and outputs keep their types."""
from dataclasses import replace

import ml_dtypes
import numpy as np

from .. import precision, shapes
from ..dtypes import from_onnx, is_float, to_onnx
from ..deferred import computed
from ..errors import ModelError
from ..ir import Node, Tensor
from .base import TYPED, Pass, Property, Result

F32 = np.dtype(np.float32)
DTYPE_ATTRS = ("to", "dtype")
"""Attributes naming the float type a node makes (Cast's `to`, the random ops' `dtype`)."""


class Casts:
    """The Cast nodes a rewrite adds: one per (tensor, dtype), made before its first reader."""

    def __init__(self, graph):
        self.tensors, self.made, self.nodes = dict(graph.tensors), {}, []
        self.dtype = {name: t.dtype for name, t in graph.tensors.items()}

    def to(self, name, dtype):
        """The name of `name` in `dtype`: itself, or the output of a Cast added now or shared."""
        if not name or self.dtype[name] == dtype or not is_float(self.dtype[name]):
            return name
        key = (name, dtype.name)
        if key not in self.made:
            cast = f"{name}.{dtype.name}"
            self.tensors[cast] = Tensor(cast, None, None, "activation")
            self.dtype[cast] = dtype
            self.nodes.append(Node("Cast", (name,), (cast,), {"to": to_onnx(dtype)}, f"{cast}/cast"))
            self.made[key] = cast
        return self.made[key]


def _low_everywhere(graph, low):
    """Every float param, const and computed value in `low`: the data converted, dtype attributes
    naming a float type retargeted, the float inputs cast in."""
    casts = Casts(graph)
    for name, t in graph.tensors.items():
        if t.kind in ("param", "const") and is_float(t.dtype) and t.dtype != low:
            casts.tensors[name] = replace(t, dtype=low, data=computed(_saturated, t.data.shape, low, t.data, low))
            casts.dtype[name] = low
    inputs = {name: casts.to(name, low) for name in graph.inputs}
    for node in graph.nodes:
        attrs = {k: (to_onnx(low) if k in DTYPE_ATTRS and isinstance(v, int) and _is_float_code(v) else v)
                 for k, v in node.attrs.items()}
        casts.nodes.append(replace(node, inputs=tuple(inputs.get(i, i) for i in node.inputs), attrs=attrs))
        casts.dtype.update((out, low) for out in node.outputs if out and is_float(casts.dtype[out]))
    return casts


def _saturated(data, dtype):
    """`data` in `dtype`, finite values beyond its range clamped to its largest ones: a mask's
    float32 minimum stays a large negative number (as PyTorch's masks use finfo(dtype).min), not -inf,
    which would make 0 * -inf = NaN."""
    info = ml_dtypes.finfo(dtype)
    finite = np.isfinite(data)
    return np.where(finite, np.clip(data, float(info.min), float(info.max)), data).astype(dtype)


def _autocast(graph, low):
    """Each node computing where autocast's policy says, its float inputs cast there."""
    casts = Casts(graph)
    for node in graph.nodes:
        where = precision.computes_in(node, graph.opsets)
        target = _target(node, where, casts, low)
        if target is None:
            casts.nodes.append(node)
            if where == "input" and not node.domain:
                casts.dtype.update((out, casts.dtype[node.inputs[0]]) for out in node.outputs[:1] if out)
            continue
        inputs = tuple(casts.to(i, target) for i in node.inputs)
        casts.nodes.append(replace(node, inputs=inputs))
        for out in filter(None, node.outputs):
            if is_float(casts.dtype[out]) and not any(k in node.attrs for k in DTYPE_ATTRS):
                casts.dtype[out] = target
    return casts


def _target(node, where, casts, low):
    """The float type `node` computes in, or None to leave it as it is; `where` is autocast's for it."""
    if (node.domain and where not in ("low", "float32")) or where == "input" or node.op == "Cast":
        return None
    floats = [i for i in node.inputs if i and is_float(casts.dtype[i])]
    if not floats:
        return None
    if where == "low":
        return low
    if where == "float32":
        return F32
    dimensioned = [i for i in floats if not _scalar_constant(casts.tensors[i])] or floats
    return max((casts.dtype[i] for i in dimensioned), key=lambda d: (d.itemsize, d == F32))


def _scalar_constant(t):
    """A one-element param or const: like a Python number in PyTorch, it takes the type of the tensors
    it meets instead of widening them."""
    return t.kind in ("param", "const") and t.data is not None and t.data.size == 1


def _is_float_code(code):
    """Whether an int attribute names a float element type of 32 bits or more (FLOAT, DOUBLE)."""
    try:
        dtype = from_onnx(code)
    except ModelError:  # not an element type: an int attribute of another meaning
        return False
    return is_float(dtype) and dtype.itemsize >= 4


def _outputs_kept(graph, casts):
    """Casts back to the declared type of each graph output that now computes in another."""
    renamed = {}
    for out in graph.outputs:
        want = graph.tensors[out].dtype
        if casts.dtype.get(out) == want or out in graph.inputs or graph.tensors[out].kind != "output":
            continue
        inner = f"{out}.{casts.dtype[out].name}"
        renamed[out] = inner
        casts.tensors[inner] = Tensor(inner, None, None, "activation")
    nodes = [replace(n, outputs=tuple(renamed.get(o, o) for o in n.outputs),
                     inputs=tuple(renamed.get(i, i) for i in n.inputs)) for n in casts.nodes]
    nodes += [Node("Cast", (inner,), (out,), {"to": to_onnx(graph.tensors[out].dtype)}, f"{out}/cast")
              for out, inner in renamed.items()]
    return nodes


def precision_pass(chosen):
    """The Pass computing the graph in `chosen`, a Precision of 16-bit floats: every float in it, or where
    autocast's policy puts each op (`chosen.mixed`)."""
    low = chosen.low

    def apply(graph, context):
        casts = _autocast(graph, low) if chosen.mixed else _low_everywhere(graph, low)
        nodes = _outputs_kept(graph, casts)
        tensors = {name: t if t.kind in ("input", "param", "const", "state") else Tensor(name, None, None, t.kind)
                   for name, t in casts.tensors.items()}
        rewritten = replace(graph, nodes=tuple(nodes), tensors=tensors, bfloat16=low.name == "bfloat16")
        return Result(shapes.infer(rewritten, pruned=False), True)

    def placed(graph, facts):
        if not chosen.mixed:
            return all(t.dtype == low for t in graph.tensors.values() if t.kind in ("param", "const") and
                       is_float(t.dtype))
        for node in graph.nodes:
            where = precision.computes_in(node, graph.opsets)
            want = low if where == "low" else F32 if where == "float32" else None
            if want is not None and any(graph.tensors[i].dtype != want for i in node.inputs
                                        if i and is_float(graph.tensors[i].dtype)):
                return False
        return True
    done = Property("in autocast's types" if chosen.mixed else f"with every float param and const in {low.name}", placed)
    return Pass("precision", apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}), ensures=frozenset({done}))
