"""Activations: elementwise nonlinearities (which may write over their input), Clip, Softmax."""
import math

import numpy as np

from . import schema
from .base import Layout, Schema, axis, no_gradient, per_input_element, same_as_input


ACTIVATIONS = {
    "Relu": lambda x: np.maximum(x, 0),
    "LeakyRelu": lambda x, alpha: np.where(x < 0, alpha * x, x),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "HardSigmoid": lambda x, alpha, beta: np.clip(alpha * x + beta, 0, 1),
    "HardSwish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
    "Tanh": np.tanh,
}

ALPHA_BETA = {"LeakyRelu": {"alpha": 0.01}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}}


@schema(*ACTIVATIONS)
class Activation(Schema):
    """Elementwise activations with a NumPy form, folded when their input is known; `defaults` are
    the op's own attributes (alpha, beta), which its NumPy form takes as keywords."""

    inplace = ((0, 0),)
    infer = staticmethod(same_as_input)

    @property
    def defaults(self):
        return ALPHA_BETA.get(self.op, {})

    def evaluate(self, node, x):
        return [ACTIVATIONS[self.op](x, **{k: self.attr(node, k) for k in self.defaults})]

    def gradient(self, b, node, dys):
        dy, x, y = dys[0], node.inputs[0], node.outputs[0]
        if self.op == "Relu":
            return [b.op("Where", b.op("Greater", y, b.const(0, x)), dy, b.const(0, x))]  # y, not x: x may die
        if self.op == "Sigmoid":
            return [b.op("Mul", dy, b.op("Mul", y, b.op("Sub", b.const(1, x), y)))]
        if self.op == "Tanh":
            return [b.op("Mul", dy, b.op("Sub", b.const(1, x), b.op("Mul", y, y)))]
        zero = b.const(0, x)
        if self.op in ("LeakyRelu", "HardSigmoid"):
            scaled = b.op("Mul", dy, b.const(self.attr(node, "alpha"), x))
        if self.op == "LeakyRelu":
            return [b.op("Where", b.op("Less", x, zero), scaled, dy)]
        if self.op == "HardSigmoid":  # alpha on the ramp, where 0 < y < 1
            inside = b.op("Where", b.op("Less", y, b.const(1, x)), scaled, zero)
            return [b.op("Where", b.op("Greater", y, zero), inside, zero)]
        # HardSwish: x / 3 + 1/2 on (-3, 3), 0 below, 1 above
        ramp = b.op("Mul", dy, b.op("Add", b.op("Mul", x, b.const(1 / 3, x)), b.const(0.5, x)))
        return [b.op("Where", b.op("Less", x, b.const(-3, x)), zero,
                     b.op("Where", b.op("Greater", x, b.const(3, x)), dy, ramp))]


@schema("Erf")
class Erf(Schema):
    """Erf: elementwise, computed when run (NumPy has no erf to fold it with)."""

    inplace = ((0, 0),)
    infer = staticmethod(same_as_input)

    def gradient(self, b, node, dys):
        """d erf(x) = 2 / sqrt(pi) exp(-x^2) dx; exact Gelu's derivative is Phi(x) + x phi(x), with Phi
        = (1 + erf(x / sqrt 2)) / 2 and phi = exp(-x^2 / 2) / sqrt(2 pi). The tanh Gelu, with
        t = tanh(c (x + k x^3)), c = sqrt(2 / pi), k = 0.044715: (1 + t + x (1 - t^2) c (1 + 3 k x^2)) / 2."""
        x = node.inputs[0]
        if node.op == "Erf":
            bell = b.op("Exp", b.op("Neg", b.op("Mul", x, x)))
            return [b.op("Mul", dys[0], b.op("Mul", bell, b.const(2 / math.sqrt(math.pi), x)))]
        if self.attr(node, "approximate") == "tanh":
            c, k, square = math.sqrt(2 / math.pi), 0.044715, b.op("Mul", x, x)
            t = b.op("Tanh", b.op("Mul", x, b.op("Add", b.op("Mul", square, b.const(k * c, x)), b.const(c, x))))
            slope = b.op("Mul", b.op("Mul", x, b.op("Sub", b.const(1, x), b.op("Mul", t, t))),
                         b.op("Add", b.op("Mul", square, b.const(3 * k * c, x)), b.const(c, x)))
            half = b.op("Mul", b.op("Add", b.op("Add", t, b.const(1, x)), slope), b.const(0.5, x))
            return [b.op("Mul", dys[0], half)]
        if self.attr(node, "approximate") != "none":
            return [no_gradient(node)]
        cdf = b.op("Mul", b.op("Add", b.op("Erf", b.op("Mul", x, b.const(1 / math.sqrt(2), x))), b.const(1, x)),
                   b.const(0.5, x))
        pdf = b.op("Mul", b.op("Exp", b.op("Mul", b.op("Mul", x, x), b.const(-0.5, x))),
                   b.const(1 / math.sqrt(2 * math.pi), x))
        return [b.op("Mul", dys[0], b.op("Add", cdf, b.op("Mul", x, pdf)))]


@schema("Gelu")
class Gelu(Erf):
    """Gelu, exact (`approximate` "none", through erf) or with the tanh approximation."""

    defaults = {"approximate": "none"}


@schema("Clip")
class Clip(Schema):
    """Clip; its bounds are attributes before opset 11 and optional inputs after."""

    attr_inputs = (("min", 1, 11), ("max", 2, 11))
    defaults = {"min": None, "max": None}
    inplace = ((0, 0),)
    infer = staticmethod(same_as_input)

    def gradient(self, b, node, dys):
        """dY where the input lies inside the bounds, 0 where Clip held it at one."""
        x, lo, hi = node.inputs[0], self.attr(node, "min"), self.attr(node, "max")
        dy = dys[0]
        if lo is not None:
            dy = b.op("Where", b.op("Less", x, b.const(lo, x)), b.const(0, x), dy)
        if hi is not None:
            dy = b.op("Where", b.op("Greater", x, b.const(hi, x)), b.const(0, x), dy)
        return [dy]

    def evaluate(self, node, x):
        lo, hi = self.attr(node, "min"), self.attr(node, "max")
        if lo is not None:
            x = np.maximum(x, np.asarray(lo, dtype=x.dtype))
        if hi is not None:
            x = np.minimum(x, np.asarray(hi, dtype=x.dtype))
        return [x]


@schema("Softmax", "LogSoftmax")
class Softmax(Schema):
    """Softmax and LogSoftmax along one axis (opset 13 semantics; the frontend rewrites older ones)."""

    defaults = {"axis": -1}
    flops = per_input_element(5)

    def infer(self, node, ins):
        axis(self.attr(node, "axis"), ins[0].rank)
        return same_as_input(node, ins)

    def gradient(self, b, node, dys):
        """Softmax: y (dy - sum(dy y)); LogSoftmax: dy - exp(y) sum(dy), sums along the axis."""
        dy, y = dys[0], node.outputs[0]
        a = [self.attr(node, "axis")]
        if node.op == "Softmax":
            dot = b.op("ReduceSum", b.op("Mul", dy, y), axes=a, keepdims=1)
            return [b.op("Mul", y, b.op("Sub", dy, dot))]
        return [b.op("Sub", dy, b.op("Mul", b.op("Exp", y), b.op("ReduceSum", dy, axes=a, keepdims=1)))]

    def workspace(self, node, ins, outs, limit):
        """`rows`, one value per row (the input with its `axis` kept as 1): the row's max, then the row's
        sum (LogSoftmax finds its max again in the output's first column; see its kernel)."""
        x = ins[0]
        if not math.prod(x.shape):
            return Layout()
        a = axis(self.attr(node, "axis"), x.rank)
        return Layout.pack(("rows", (*x.shape[:a], 1, *x.shape[a + 1:]), x.dtype))
