"""Fuse norms: RMS norm as exporters write it in pieces (x * 1/sqrt(mean(x^2) + eps) * w: LLaMA, Qwen2,
Mistral), layer norm in pieces (the TorchScript exporter's opsets <= 16: ReduceMean, Sub, Pow, ReduceMean,
Add, Sqrt, Div, Mul, Add), and the residual Add before a norm, replaced by one memplan.AddLayerNormalization
(planner/ops/fused_norm.py), computed row chunk by row chunk; its gradient, and LayerNormalization's, is one
memplan.LayerNormalizationGrad that keeps X alone for backward, where the pieces keep each intermediate.
Where the Add's sum is read elsewhere too (the residual stream), the fused op writes it as its Sum output.
Constants (the exponent 2, epsilon, a numerator 1) are checked by value. Norms in pieces of 16-bit exports
stay as they are, since the fused op takes its statistics in float32 where the export rounds each step in 16
bits. planner.compile counts the fused ops in plan.stats["fused_norm"]; CompileOptions(fuse_norm=False)
keeps the exported form."""
import math
from dataclasses import replace

import numpy as np

from .. import ops, shapes
from ..ir import Node
from .base import rewrite_pass
from .pattern import Op, constant, rewrite

FUSED = "AddLayerNormalization"


def _squares(x):
    """x^2 as exported: Pow by a constant (checked to be 2) or x times itself."""
    return [Op("Pow", x, "two"), Op("Mul", x, x)]


def _scaled(xhat, denominator):
    """x^ = `xhat` / `denominator`, as a Div, a Mul by its Reciprocal, or a Mul by 1 over it (checked)."""
    return [Op("Div", xhat, denominator), Op("Mul", xhat, Op("Reciprocal", denominator)),
            Op("Mul", xhat, Op("Div", "one", denominator))]


def _patterns():
    """(pattern, rms) of every exported form: the normalised rows times the weight `w`, plus the bias `b`
    (layer norm only), the larger forms first."""
    found = []
    for rms in (0, 1):
        centred = "x" if rms else Op("Sub", "x", Op("ReduceMean", "x", name="mean"))
        for square in _squares(centred):
            denominator = Op("Sqrt", Op("Add", Op("ReduceMean", square, name="var"), "eps"))
            for xhat in _scaled(centred, denominator):
                weighted = Op("Mul", xhat, "w", name="weighted")
                found += [] if rms else [(Op("Add", weighted, "b"), rms)]
                found.append((weighted, rms))
    return found


def _scalar(graph, name):
    """The value of a one-element constant, or None."""
    value = constant(graph, name)
    return None if value is None or np.size(value) != 1 else float(np.ravel(value)[0])


def _first_axis(node, rank):
    """The first normalised axis of a ReduceMean over trailing axes that keeps them, else None."""
    axes = node.attrs.get("axes")
    if not node.attrs.get("keepdims", 1) or not axes:
        return None
    axes = sorted(a % rank for a in axes)
    return axes[0] if axes == list(range(axes[0], rank)) else None


def _norm(graph, m, rms):
    """The memplan.AddLayerNormalization of a norm in pieces, or None where the match is not one."""
    x = graph.tensors[m.bindings["x"]]
    if x.dtype.kind != "f" or x.dtype.itemsize < 4 or not x.shape:
        return None
    reduced = [m.named[k] for k in ("mean", "var") if k in m.named]
    first = {_first_axis(n, len(x.shape)) for n in reduced}
    eps = _scalar(graph, m.bindings["eps"])
    if len(first) != 1 or None in first or eps is None or not 0 <= eps < math.inf:
        return None
    if "two" in m.bindings and _scalar(graph, m.bindings["two"]) != 2.0:
        return None
    if "one" in m.bindings and _scalar(graph, m.bindings["one"]) != 1.0:
        return None
    dims = tuple(x.shape[first.pop():])
    params = [graph.tensors[m.bindings[k]] for k in ("w", "b") if k in m.bindings]
    for p in params:
        if p.dtype != x.dtype or len(p.shape) > len(dims) or any(d not in (1, n) for d, n in
                                                                 zip(p.shape[::-1], dims[::-1])):
            return None
    if tuple(graph.tensors[m.root.outputs[0]].shape) != tuple(x.shape):
        return None
    return [Node(FUSED, (x.name, "", m.bindings["w"], m.bindings.get("b", "")), m.root.outputs,
                 {"axis": len(x.shape) - len(dims), "epsilon": eps, "rms": rms}, m.root.name, m.root.notes, "memplan")]


def _fusible_add(graph, norm, taken):
    """The ONNX Add writing the norm's X from two inputs of X's shape and dtype, or None."""
    x = norm.inputs[0]
    add = graph.producers.get(x)
    if add is None or add.op != "Add" or add.domain or add.name in taken or add.outputs[0] != x:
        return None
    want = graph.tensors[x]
    if any(not i or tuple(graph.tensors[i].shape) != tuple(want.shape) or graph.tensors[i].dtype != want.dtype
           for i in add.inputs):
        return None
    return add


def _with_adds(graph):
    """The graph with the residual Add before each LayerNormalization (its Mean and InvStdDev
    outputs unread) and each memplan.AddLayerNormalization without a skip taken into a fused op."""
    held = {*graph.outputs, *(new for new, _ in graph.updates)}
    instead, gone = {}, set()
    for node in graph.nodes:
        plain = node.op == "LayerNormalization" and not node.domain and not any(
            o and (o in held or graph.consumers.get(o)) for o in node.outputs[1:])
        ours = node.op == FUSED and node.domain == "memplan" and not (len(node.inputs) > 1 and node.inputs[1])
        add = _fusible_add(graph, node, gone) if plain or ours else None
        if add is None:
            continue
        if plain:
            attrs = ops.of(node, graph.opsets).normalize(node)
            if not 0 <= attrs["epsilon"] < math.inf:  # the fused op takes none other: the node stays, as ONNX has it
                continue
            scale, bias = (list(node.inputs[1:]) + [""])[:2]
            attrs = {"axis": attrs["axis"], "epsilon": attrs["epsilon"], "rms": 0}
        else:
            scale, bias = (list(node.inputs[2:]) + [""])[:2]
            attrs = node.attrs
        x = node.inputs[0]
        read = x in held or any(c.name != node.name for c in graph.consumers.get(x, ()))
        outputs = (node.outputs[0], x) if read else node.outputs[:1]
        instead[node.name] = Node(FUSED, (*add.inputs, scale, bias), outputs, attrs, node.name, node.notes, "memplan")
        gone.add(add.name)
    if not instead:
        return graph
    nodes = [instead.get(n.name, n) for n in graph.nodes if n.name not in gone]
    return shapes.retype(replace(graph, nodes=tuple(nodes)), graph)


def fused(graph):
    """(graph with every norm in pieces and every residual Add before a norm fused, how many fused ops it
    made)."""
    before = sum(n.op == FUSED and n.domain == "memplan" for n in graph.nodes)
    for pattern, rms in _patterns():
        graph, _ = rewrite(graph, pattern, lambda m: _norm(graph, m, rms))
    graph = _with_adds(graph)
    return graph, sum(n.op == FUSED and n.domain == "memplan" for n in graph.nodes) - before


fuse_norm = rewrite_pass("fuse_norm", fused, "norm in pieces or residual Add before a norm that fuses")
