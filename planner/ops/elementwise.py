"""Elementwise ops with NumPy broadcasting: arithmetic, comparisons, logic, Where.

Each family is one class; the NumPy function of each op is one table entry.
"""
import numpy as np

from . import schema
from .base import Schema, broadcast, no_gradient, same_as_input
from ..dtypes import to_onnx
from ..errors import ShapeError


def _check_same_dtype(node, ins):
    dts = {i.dtype for i in ins if i is not None}
    if len(dts) > 1:
        raise ShapeError(f"inputs have different dtypes {sorted(map(str, dts))}")


def _int_div(a, b):
    """ONNX integer Div truncates toward zero (C semantics), unlike NumPy's floor division."""
    if np.issubdtype(np.result_type(a, b), np.integer):
        return (np.trunc(np.true_divide(a, b))).astype(np.result_type(a, b))
    return np.true_divide(a, b)


def _mod(a, b, fmod=0):
    return np.fmod(a, b) if fmod else np.mod(a, b)


BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div}


@schema(*BINARY)
class Arithmetic(Schema):
    """Add, Sub, Mul, Div: one dtype in, the same dtype out; the output may overwrite either input."""

    inplace = ((0, 0), (1, 0))

    def infer(self, node, ins):
        _check_same_dtype(node, ins)
        return [(broadcast(ins[0].shape, ins[1].shape), ins[0].dtype)]

    def evaluate(self, node, a, b):
        return [BINARY[self.op](a, b)]

    def gradient(self, b, node, dys):
        dy, (x, w), y = dys[0], node.inputs, node.outputs[0]
        shape = b.shape(y)
        if self.op == "Add":
            dx, dw = dy, dy
        elif self.op == "Sub":
            dx, dw = dy, b.op("Neg", dy)
        elif self.op == "Mul":
            dx, dw = b.op("Mul", dy, w), b.op("Mul", dy, x)
        else:  # y = x / w: dx = dy / w, dw = -dy * y / w
            dx, dw = b.op("Div", dy, w), b.op("Neg", b.op("Div", b.op("Mul", dy, y), w))
        return [b.unbroadcast(dx, shape, b.shape(x)), b.unbroadcast(dw, shape, b.shape(w))]


@schema("Pow")
class Pow(Schema):
    """Pow: the exponent may have another dtype; the output has the base's."""

    inplace = ((0, 0),)

    def infer(self, node, ins):
        return [(broadcast(ins[0].shape, ins[1].shape), ins[0].dtype)]

    def evaluate(self, node, a, b):
        return [np.power(a, b).astype(a.dtype)]

    def gradient(self, b, node, dys):
        """y = x^p: dx = dy p x^(p-1) = dy p y / x; dp = dy y log x (for a positive base)."""
        dy, (x, p), y = dys[0], node.inputs, node.outputs[0]
        out, same = b.shape(y), b.dtype(p) == b.dtype(x)
        exponent = p if same else b.op("Cast", p, to=to_onnx(b.dtype(x)))
        dx = b.op("Mul", dy, b.op("Mul", exponent, b.op("Pow", x, b.op("Sub", exponent, b.const(1, x)))))
        dp = b.op("Mul", dy, b.op("Mul", y, b.op("Log", x))) if same else None
        return [b.unbroadcast(dx, out, b.shape(x)), dp and b.unbroadcast(dp, out, b.shape(p))]


@schema("Mod")
class Mod(Schema):
    defaults = {"fmod": 0}
    inplace = ((0, 0), (1, 0))

    def infer(self, node, ins):
        _check_same_dtype(node, ins)
        return [(broadcast(ins[0].shape, ins[1].shape), ins[0].dtype)]

    def evaluate(self, node, a, b):
        return [_mod(a, b, self.attr(node, "fmod"))]

    def gradient(self, b, node, dys):
        """y = x - w n, with n the whole quotient (truncated for fmod, floored otherwise) and flat where
        differentiable: dx = dY, dw = -dY n = -dY (x - y) / w."""
        dy, (x, w), y = dys[0], node.inputs, node.outputs[0]
        dw = b.op("Neg", b.op("Mul", dy, b.op("Div", b.op("Sub", x, y), w)))
        return [b.unbroadcast(dy, b.shape(y), b.shape(x)), b.unbroadcast(dw, b.shape(y), b.shape(w))]


COMPARE = {"Equal": np.equal, "Less": np.less, "Greater": np.greater}


@schema(*COMPARE)
class Compare(Schema):
    def infer(self, node, ins):
        _check_same_dtype(node, ins)
        return [(broadcast(ins[0].shape, ins[1].shape), np.dtype(bool))]

    def evaluate(self, node, a, b):
        return [COMPARE[self.op](a, b)]


UNARY = {"Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Neg": np.negative, "Abs": np.abs,
         "Reciprocal": np.reciprocal, "Not": np.logical_not}


@schema(*UNARY)
class Unary(Schema):
    inplace = ((0, 0),)
    infer = staticmethod(same_as_input)

    def evaluate(self, node, x):
        return [UNARY[self.op](x)]

    def gradient(self, b, node, dys):
        dy, x, y = dys[0], node.inputs[0], node.outputs[0]
        rule = {"Neg": lambda: b.op("Neg", dy), "Exp": lambda: b.op("Mul", dy, y),
                "Log": lambda: b.op("Div", dy, x),
                "Sqrt": lambda: b.op("Div", b.op("Mul", dy, b.const(0.5, x)), y),
                "Reciprocal": lambda: b.op("Neg", b.op("Mul", dy, b.op("Mul", y, y))),
                "Abs": lambda: b.op("Where", b.op("Less", x, b.const(0, x)), b.op("Neg", dy), dy)}.get(self.op)
        return [rule() if rule else no_gradient(node)]


@schema("Where")
class Where(Schema):
    """Where: the output may overwrite `y` (the kernel lays y down, then x where the condition holds)."""

    inplace = ((2, 0),)

    def infer(self, node, ins):
        if ins[0].dtype != np.bool_:
            raise ShapeError(f"condition must be bool, not {ins[0].dtype}")
        _check_same_dtype(node, ins[1:])
        return [(broadcast(*(i.shape for i in ins)), ins[1].dtype)]

    def evaluate(self, node, c, x, y):
        return [np.where(c, x, y)]

    def gradient(self, b, node, dys):
        """dY where the condition picks each side, zeros elsewhere; no gradient for the condition."""
        c, x, y = node.inputs
        zero, out = b.const(0, x), b.shape(node.outputs[0])
        return [None, b.unbroadcast(b.op("Where", c, dys[0], zero), out, b.shape(x)),
                b.unbroadcast(b.op("Where", c, zero, dys[0]), out, b.shape(y))]
