"""Fuse a convolution with what follows it in inference: Conv, then an Add of a tensor of its output's shape
(ResNet's residual), then Relu, Sigmoid, Tanh, HardSigmoid or a Clip (of constant bounds, attributes once
typed), either or both, become one com.microsoft FusedConv, whose kernel applies them to each chunk of the
output as the GEMM writes it (planner/ops/fused_conv.py): a pass over the output fewer for each. Inference
plans only (FusedConv has no gradient); CompileOptions(fuse_conv=False) keeps the graph as it is."""
import math

import numpy as np

from ..ir import Node
from ..ops.fused_conv import ACTIVATIONS
from .base import rewrite_pass
from .pattern import Op, rewrite


def _patterns():
    """(pattern, its activation op or None, whether it adds Z), the longest forms first."""
    for inputs in (("x", "w"), ("x", "w", "b")):
        conv = Op("Conv", *inputs, name="conv")
        for act in ACTIVATIONS:  # Clip's bounds are attributes by now, when constants (planner.shapes)
            yield Op(act, Op("Add", conv, "z", name="add"), name="act"), act, True
            yield Op(act, conv, name="act"), act, False
        yield Op("Add", conv, "z", name="add"), None, True


def _fuse(graph, m, act, adds):
    conv, y = m.named["conv"], graph.tensors[m.named["conv"].outputs[0]]
    inputs = [m.bindings["x"], m.bindings["w"], m.bindings.get("b", "")]
    if adds:
        z = graph.tensors[m.bindings["z"]]
        if tuple(z.shape) != tuple(y.shape) or z.dtype != y.dtype:
            return None
        inputs.append(z.name)
    attrs = {**conv.attrs}
    node = m.named.get("act")
    if act == "Clip":
        bounds = [node.attrs.get(k) for k in ("min", "max")]
        params = [float(np.ravel(v)[0]) if v is not None else float(s) for v, s in zip(bounds, ("-inf", "inf"))]
        if any(math.isnan(p) for p in params):  # Clip ignores a NaN bound, where the kernel's would make NaN
            return None
        attrs.update(activation="Clip", activation_params=params)
    elif act == "HardSigmoid":
        params = [float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))]
        if not all(map(math.isfinite, params)):
            return None
        attrs.update(activation=act, activation_params=params)
    elif act:
        attrs.update(activation=act)
    return [Node("FusedConv", tuple(inputs), m.root.outputs, attrs, conv.name, conv.notes, "com.microsoft")]


def fused(graph):
    """(graph with each Conv and the Add and activation after it one FusedConv, how many it made)."""
    before = _count(graph)
    for pattern, act, adds in _patterns():
        graph, _ = rewrite(graph, pattern, lambda m: _fuse(graph, m, act, adds))
    return graph, _count(graph) - before


def _count(graph):
    return sum(n.op == "FusedConv" and n.domain == "com.microsoft" for n in graph.nodes)


fuse_conv = rewrite_pass("fuse_conv", fused, "Conv with an Add or activation after it that fuses")
