"""Fuse activations: an activation as exporters write it in pieces, and the bias Add before it, replaced by
one memplan.BiasActivation (planner/ops/bias_activation.py), whose gradient recomputes from X alone where
the pieces keep several tensors of X's size for backward.

The forms: GPT-2's tanh Gelu (x^3 as Pow(x, 3) or x x x; the 0.5 on x first, on the product last, or on
the bracket), the erf Gelu (x / sqrt 2 as Div or Mul), SiLU x sigmoid(x), Swish and QuickGelu
x sigmoid(alpha x), each of x or of x + bias; and ONNX's Gelu, Relu, Sigmoid and Tanh after a bias Add.
The bias is a constant or initializer of x's trailing dims; an Add folds in only when nothing else reads
its output. The pieces' constants are checked by value (rtol 1e-6). Activations of 16-bit exports stay as
they are, since the fused op computes in float32 where the export rounds each piece (results would
change). planner.compile counts the fused ops in plan.stats["fused_activation"];
CompileOptions(fuse_activation=False) keeps the exported form."""
import math

import numpy as np

from ..ir import Node
from ..ops.bias_activation import fits
from .base import rewrite_pass
from .pattern import Op, constant, rewrite

FUSED = "BiasActivation"
VALUES = {"three": 3.0, "k": 0.044715, "c": math.sqrt(2 / math.pi), "one": 1.0, "half": 0.5,
          "sqrt2": math.sqrt(2), "rsqrt2": 1 / math.sqrt(2)}
"""The constants the pieces' patterns name, by value."""


def _halves(x, bracket):
    """x/2 times the bracket (1 + tanh or 1 + erf), the 0.5 on x, on the product or on the bracket."""
    return [Op("Mul", Op("Mul", x, "half"), bracket), Op("Mul", Op("Mul", x, bracket), "half"),
            Op("Mul", x, Op("Mul", bracket, "half"))]


def _forms(x):
    """(pattern, activation attributes) of each piecewise form of an activation of `x` (a variable or a
    bias Add)."""
    forms = []
    for cube in (Op("Pow", x, "three"), Op("Mul", Op("Mul", x, x), x)):
        inner = Op("Mul", Op("Add", x, Op("Mul", cube, "k")), "c")
        bracket = Op("Add", Op("Tanh", inner), "one")
        forms += [(p, {"activation": "Gelu", "approximate": "tanh"}) for p in _halves(x, bracket)]
    for scaled in (Op("Div", x, "sqrt2"), Op("Mul", x, "rsqrt2")):
        bracket = Op("Add", Op("Erf", scaled), "one")
        forms += [(p, {"activation": "Gelu", "approximate": "none"}) for p in _halves(x, bracket)]
    forms += [(Op("Mul", x, Op("Sigmoid", Op("Mul", x, "alpha"))), {"activation": "Swish"}),
              (Op("Mul", x, Op("Sigmoid", x)), {"activation": "Swish", "alpha": 1.0})]
    return forms


def _patterns():
    """Every form with a bias first, then without; then ONNX's activation ops after a bias Add."""
    biased = Op("Add", "x", "bias")
    found = [(p, attrs, True) for p, attrs in _forms(biased)] + [(p, attrs, False) for p, attrs in _forms("x")]
    found += [(Op(op, biased, name="act"), {"activation": op}, True) for op in ("Gelu", "Relu", "Sigmoid", "Tanh")]
    return found



def _scalar(graph, name):
    """The one value of a constant, or None."""
    value = constant(graph, name)
    return None if value is None or value.size != 1 else float(value.ravel()[0])


class _Fuser:
    """Builds the replacement of one match, or None where it is not an activation memplan fuses."""

    def __init__(self, graph):
        self.graph, self.count = graph, 0

    def build(self, m, attrs, biased):
        g = self.graph
        x, bias = m.bindings["x"], m.bindings.get("bias")
        if biased and constant(g, bias, absent=True) is None:
            x, bias = bias, x
        dtype = g.tensors[x].dtype
        if dtype.kind != "f" or dtype.itemsize < 4:
            return None
        for name, want in VALUES.items():
            if name in m.bindings:
                got = _scalar(g, m.bindings[name])
                if got is None or not np.isclose(got, want, rtol=1e-6, atol=0):
                    return None
        attrs = dict(attrs)
        if "alpha" in m.bindings:
            attrs["alpha"] = _scalar(g, m.bindings["alpha"])
            if attrs["alpha"] is None or not math.isfinite(attrs["alpha"]):
                return None
        if "act" in m.named and m.named["act"].op == "Gelu":
            attrs["approximate"] = m.named["act"].attrs.get("approximate", "none")
        inputs = (x,)
        if biased:
            shape = g.tensors[x].shape
            if (constant(g, bias, absent=True) is None or constant(g, x, absent=True) is not None
                    or g.tensors[bias].dtype != dtype
                    or not fits(shape, g.tensors[bias].shape) or g.tensors[m.root.outputs[0]].shape != shape):
                return None
            inputs = (x, bias)
        self.count += 1
        return [Node(FUSED, inputs, m.root.outputs, attrs, m.root.name, m.root.notes, "memplan")]


def fused(graph):
    """(graph with every activation it can fuse replaced, how many)."""
    fuser = _Fuser(graph)
    for pattern, attrs, biased in _patterns():
        fuser.graph = graph
        graph, _ = rewrite(graph, pattern, lambda m: fuser.build(m, attrs, biased))
    return graph, fuser.count


fuse_activation = rewrite_pass("fuse_activation", fused, "activation in pieces or bias Add before one that fuses")
