"""Ops along one axis, one entry each: CumSum (running sums, exclusive and reversed forms) and ArgMax /
ArgMin (int64 indices of the extremes). Their kernels work through views (a reversed axis is a
negative stride), so they need no temporaries."""
import numpy as np

from . import register
from .base import Info, Schema, axis, no_flops, per_input_element, same_as_input
from ..errors import ShapeError


def _along(x, a, start=None, stop=None, reverse=False):
    """The view of `x` over [start, stop) of axis `a`, reversed first when `reverse`."""
    index = [slice(None)] * x.ndim
    if reverse:
        index[a] = slice(None, None, -1)
        x = x[tuple(index)]
    index[a] = slice(start, stop)
    return x[tuple(index)]


class CumSum(Schema):
    """CumSum: y[i] = x[0] + ... + x[i] along `axis` (an input, known when planning), x[i] left out
    when `exclusive`, summed from the end when `reverse`."""

    op = "CumSum"
    attr_inputs = (("axis", 1, 11),)
    defaults = {"axis": None, "exclusive": 0, "reverse": 0}
    ranks = "same"
    arity = None
    flops = per_input_element(1)

    def axis_of(self, node, rank):
        value = self.attr(node, "axis")
        if value is None:
            raise ShapeError("CumSum needs its axis input")
        values = np.ravel(value)
        if values.size != 1:
            raise ShapeError(f"axis must be one value, got {list(values)}")
        return axis(int(values[0]), rank)

    def infer(self, node, ins):
        self.axis_of(node, ins[0].rank)
        return same_as_input(node, ins)

    def compute(self, xp, node, x, out):
        a, reverse = self.axis_of(node, x.ndim), bool(self.attr(node, "reverse"))
        if not self.attr(node, "exclusive"):
            xp.cumsum(_along(x, a, reverse=reverse), axis=a, out=_along(out, a, reverse=reverse))
            return out
        _along(out, a, 0, 1, reverse).fill(0)
        if x.shape[a] > 1:
            xp.cumsum(_along(x, a, 0, -1, reverse), axis=a, out=_along(out, a, 1, None, reverse))
        return out

    def evaluate(self, node, x):
        return [self.compute(np, node, x, np.empty_like(x))]

    def kernel(self, xp, step, ins, outs, ws):
        self.compute(xp, step, ins[0], outs[0])

    def gradient(self, b, node, dys):
        """The running sum taken the other way: dx[i] is the sum of the dy[j] whose sum held x[i]."""
        return [b.op("CumSum", dys[0], axis=self.axis_of(node, len(b.shape(node.inputs[0]))),
                     exclusive=self.attr(node, "exclusive"), reverse=1 - self.attr(node, "reverse"))]

    def torch(self, torch, x, axis, exclusive, reverse):
        a = int(np.ravel(axis)[0]) % x.ndim
        y = torch.flip(x, (a,)) if reverse else x
        y = torch.cumsum(y, a, dtype=x.dtype)
        if exclusive:
            y = torch.cat([torch.zeros_like(y.narrow(a, 0, 1)), y.narrow(a, 0, y.shape[a] - 1)], a)
        return torch.flip(y, (a,)) if reverse else y


class ArgExtreme(Schema):
    """ArgMax and ArgMin: the int64 index of the first (or with select_last_index, the last) extreme
    along `axis`, which is kept as size 1 unless keepdims is 0."""

    defaults = {"axis": 0, "keepdims": 1, "select_last_index": 0}
    result = np.int64
    flops = staticmethod(no_flops)

    def __init__(self, op, fn):
        self.op, self.fn = op, fn

    def infer(self, node, ins):
        x = ins[0]
        a = axis(self.attr(node, "axis"), x.rank)
        if x.shape[a] == 0:
            raise ShapeError(f"{self.op} over axis {a} of size 0 has no index to give")
        keep = self.attr(node, "keepdims")
        return [(tuple(1 if i == a else d for i, d in enumerate(x.shape) if keep or i != a), np.dtype(np.int64))]

    def compute(self, xp, node, x, out):
        a = axis(self.attr(node, "axis"), x.ndim)
        last = bool(self.attr(node, "select_last_index"))
        kept = out.reshape([1 if i == a else d for i, d in enumerate(x.shape)])
        getattr(xp, self.fn)(_along(x, a, reverse=last), axis=a, out=kept, keepdims=True)
        if last:
            xp.subtract(x.shape[a] - 1, kept, out=kept)
        return out

    def evaluate(self, node, x):
        shape = self.infer(node, [Info(x.shape, x.dtype)])[0][0]
        return [self.compute(np, node, x, np.empty(shape, np.int64))]

    def kernel(self, xp, step, ins, outs, ws):
        self.compute(xp, step, ins[0], outs[0])

    def torch(self, torch, x, axis, keepdims, select_last_index):
        a = axis % x.ndim
        fn = torch.argmax if self.fn == "argmax" else torch.argmin
        if not select_last_index:
            return fn(x, a, keepdim=bool(keepdims))
        return x.shape[a] - 1 - fn(torch.flip(x, (a,)), a, keepdim=bool(keepdims))


register(CumSum())
register(ArgExtreme("ArgMax", "argmax"))
register(ArgExtreme("ArgMin", "argmin"))
