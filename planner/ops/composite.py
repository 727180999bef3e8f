"""Composite ops: defined by the ops they are made of (`decompose`), so that they need no kernel and no
gradient of their own; planning replaces each by its parts (planner/passes/decompose.py). An op
whose speed asks for a kernel of its own becomes an entry with one (as Softplus is).

Where a branch would overflow where it is not taken (exp of a large x), its input is clamped first, so
that neither the value nor the gradient sees an infinity; ties at the kink follow PyTorch's gradient.
"""
import numpy as np

from .registry import register
from .base import Schema, broadcast, same_as_input
from ..errors import ShapeError


class Composite(Schema):
    """An op planned as its decomposition: `parts(b, node, *inputs, **attributes)` builds it with the
    autodiff Builder `b` and returns its output's name. Unary ones keep their input's shape and dtype.
    Narrow floats are computed in the op's accumulation dtype (float32) and rounded once at the end,
    as a fused kernel would."""

    ranks = "broadcast"
    arity = 1

    def __init__(self, op, parts, defaults=None, since=1, **rules):
        self.op, self.parts, self.defaults, self.since = op, parts, defaults or {}, since
        for key, value in rules.items():
            if not hasattr(self, key):
                raise TypeError(f"{op}: unknown rule {key!r}")
            setattr(self, key, value)

    def infer(self, node, ins):
        return same_as_input(node, ins)

    def decompose(self, b, node):
        dtype = b.dtype(node.inputs[0])
        wide = self.accumulation(dtype)
        inputs = [b.cast(x, wide) for x in node.inputs] if wide != dtype else node.inputs
        y = self.parts(b, node, *inputs, **{k: self.attr(node, k) for k in self.defaults})
        return [b.cast(y, dtype) if wide != dtype else y]


def _exponential_below_zero(b, x, alpha, scale=1.0):
    """alpha (exp(x / scale) - 1) where x <= 0, x elsewhere: ELU's and CELU's shape. exp reads
    min(x, 0), chosen by Where so that the gradient at 0 takes the exponential side, as PyTorch's."""
    below = b.op("LessOrEqual", x, b.const(0, x))
    clamped = b.op("Where", below, x, b.const(0, x))
    if scale != 1.0:
        clamped = b.op("Div", clamped, b.const(scale, x))
    curve = b.op("Mul", b.op("Sub", b.op("Exp", clamped), b.const(1, x)), b.const(alpha, x))
    return b.op("Where", below, curve, x)


def _softsign(b, node, x):
    return b.op("Div", x, b.op("Add", b.op("Abs", x), b.const(1, x)))


def _elu(b, node, x, alpha):
    return _exponential_below_zero(b, x, alpha)


def _selu(b, node, x, alpha, gamma):
    return b.op("Mul", _exponential_below_zero(b, x, alpha), b.const(gamma, x))


def _celu(b, node, x, alpha):
    return _exponential_below_zero(b, x, alpha, scale=alpha)


def _thresholded_relu(b, node, x, alpha):
    return b.op("Where", b.op("Greater", x, b.const(alpha, x)), x, b.const(0, x))


def _shrink(b, node, x, bias, lambd):
    zero = b.const(0, x)
    above = b.op("Where", b.op("Greater", x, b.const(lambd, x)), b.op("Sub", x, b.const(bias, x)), zero)
    return b.op("Where", b.op("Less", x, b.const(-lambd, x)), b.op("Add", x, b.const(bias, x)), above)


def _mish(b, node, x):
    return b.op("Mul", x, b.op("Tanh", b.op("Softplus", x)))


def _swish(b, node, x, alpha):
    return b.op("Mul", x, b.op("Sigmoid", b.op("Mul", x, b.const(alpha, x))))


def _prelu(b, node, x, slope):
    return b.op("Where", b.op("Less", x, b.const(0, x)), b.op("Mul", x, slope), x)


def _swiglu(b, node, a, value, alpha):
    return b.op("Mul", _swish(b, node, a, alpha), value)


class SwiGLU(Composite):
    """SwiGLU (opset 28): Swish_alpha(A) * B, gate and value of one shape (no broadcasting)."""

    arity = 2

    def infer(self, node, ins):
        a, value = ins
        if a.shape != value.shape or a.dtype != value.dtype:
            raise ShapeError(f"gate A {a.shape} {a.dtype} and value B {value.shape} {value.dtype} must have one "
                             "shape and dtype")
        return same_as_input(node, ins)


class PRelu(Composite):
    """PRelu: the slope broadcasts to the input's shape (one way), and the output has the input's."""

    autocast = "low"
    arity = 2

    def infer(self, node, ins):
        x, slope = ins
        if x.dtype != slope.dtype:
            raise ShapeError(f"input and slope have different dtypes {x.dtype} and {slope.dtype}")
        if broadcast(x.shape, slope.shape) != tuple(x.shape):
            raise ShapeError(f"slope of shape {slope.shape} does not broadcast to the input's {x.shape}")
        return same_as_input(node, ins)


register(Composite("Softsign", _softsign))
register(Composite("Elu", _elu, {"alpha": 1.0}))
register(Composite("Selu", _selu, {"alpha": float(np.float32(1.67326319217681884765625)),
                                   "gamma": float(np.float32(1.05070102214813232421875))}))
register(Composite("Celu", _celu, {"alpha": 1.0}))
register(Composite("ThresholdedRelu", _thresholded_relu, {"alpha": 1.0}))
register(Composite("Shrink", _shrink, {"bias": 0.0, "lambd": 0.5}))
register(Composite("Mish", _mish))
register(Composite("Swish", _swish, {"alpha": 1.0}, since=24))
register(PRelu("PRelu", _prelu))
register(SwiGLU("SwiGLU", _swiglu, {"alpha": 1.0}, since=28))
