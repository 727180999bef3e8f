"""Ops along one axis, one entry each: CumSum and CumProd (running sums and products, exclusive and reversed
forms) and ArgMax / ArgMin (int64 indices of the extremes). Their kernels work through views (a reversed
axis is a negative stride), so they need no temporaries."""
import numpy as np

from .registry import register
from .base import Info, Schema, axis, constant_shape, no_flops, per_input_element, same_as_input
from .shape_ops import zeros
from ..dtypes import to_onnx
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

    autocast = "float32"
    op = "CumSum"
    fn = "cumsum"
    empty = 0
    """The running function (NumPy's, CuPy's and PyTorch's name) and its value over no elements."""
    attr_inputs = (("axis", 1, 11),)
    defaults = {"axis": None, "exclusive": 0, "reverse": 0}
    ranks = "same"
    arity = None
    flops = per_input_element(1)

    def axis_of(self, node, rank):
        value = self.attr(node, "axis")
        if value is None:
            raise ShapeError(f"{self.op} needs its axis input")
        values = np.ravel(value)
        if values.size != 1:
            raise ShapeError(f"axis must be one value, got {list(values)}")
        return axis(int(values[0]), rank)

    def infer(self, node, ins):
        self.axis_of(node, ins[0].rank)
        return same_as_input(node, ins)

    def compute(self, xp, node, x, out):
        a, reverse = self.axis_of(node, x.ndim), bool(self.attr(node, "reverse"))
        running = getattr(xp, self.fn)
        if not self.attr(node, "exclusive"):
            running(_along(x, a, reverse=reverse), axis=a, out=_along(out, a, reverse=reverse))
            return out
        _along(out, a, 0, 1, reverse).fill(self.empty)
        if x.shape[a] > 1:
            running(_along(x, a, 0, -1, reverse), axis=a, out=_along(out, a, 1, None, reverse))
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
        y = getattr(torch, self.fn)(y, a, dtype=x.dtype)
        if exclusive:
            y = torch.cat([torch.full_like(y.narrow(a, 0, 1), self.empty), y.narrow(a, 0, y.shape[a] - 1)], a)
        return torch.flip(y, (a,)) if reverse else y


class CumProd(CumSum):
    """CumProd: y[i] = x[0] * ... * x[i] along `axis`, in CumSum's exclusive and reversed forms."""

    op = "CumProd"
    since = 26
    fn = "cumprod"
    empty = 1

    def gradient(self, b, node, dys):
        """Exact where x holds zeros (no division by x): with the axis last and the running order forward,
        dx[i] = (x[0] ... x[i-1]) * sum over j >= i of dy[j] x[i+1] ... x[j], the inner products the
        running products of the rows of an (n, n) matrix holding x[j] right of its diagonal and 1 on and
        left of it, then cut to its upper triangle. The exclusive form is the inclusive one of x[:-1] read
        one place later; the reversed form, the forward one of the data reversed."""
        x, dy = node.inputs[0], dys[0]
        shape = b.shape(x)
        a, n = self.axis_of(node, len(shape)), shape[self.axis_of(node, len(shape))]
        exclusive, reverse = self.attr(node, "exclusive"), self.attr(node, "reverse")
        if exclusive and n == 1:
            return [zeros(b, shape, b.dtype(x))]
        constant_shape(node, "its gradient's triangle mask", n, n)

        def flip(t):
            return b.op("Slice", t, starts=[-1], ends=[-n - 1], axes=[a], steps=[-1]) if reverse else t

        x, dy = flip(x), flip(dy)
        if exclusive:
            x = b.op("Slice", x, starts=[0], ends=[n - 1], axes=[a])
            dy = b.op("Slice", dy, starts=[1], ends=[n], axes=[a])
        dx = self.forward_gradient(b, x, dy, a, len(shape), n - exclusive, node.inputs[0])
        if exclusive:
            dx = b.op("Pad", dx, pads=[0, 1], axes=[a])
        return [flip(dx)]

    def forward_gradient(self, b, x, dy, a, rank, n, like):
        """The gradient of the inclusive, forward CumProd of `x` (n long on axis `a`) given `dy`."""
        perm = [*range(a), *range(a + 1, rank), a]
        if a != rank - 1:
            x, dy = b.op("Transpose", x, perm=perm), b.op("Transpose", dy, perm=perm)
        right = b.const(np.triu(np.ones((n, n), bool), 1), like)
        right = b.op("Cast", right, to=to_onnx(np.bool_))
        rows = b.op("Where", right, b.op("Unsqueeze", x, axes=[-2]), b.const(1, like))
        inner = b.op("Trilu", b.op("CumProd", rows, axis=-1), upper=1)
        summed = b.op("Squeeze", b.op("MatMul", inner, b.op("Unsqueeze", dy, axes=[-1])), axes=[-1])
        dx = b.op("Mul", b.op("CumProd", x, axis=-1, exclusive=1), summed)
        return b.op("Transpose", dx, perm=[int(k) for k in np.argsort(perm)]) if a != rank - 1 else dx


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
register(CumProd())
register(ArgExtreme("ArgMax", "argmax"))
register(ArgExtreme("ArgMin", "argmin"))
