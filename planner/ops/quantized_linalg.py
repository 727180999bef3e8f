"""Integer matrix products and convolutions: MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv.

The 8-bit inputs are widened to int32 less their zero points in the op's workspace, then MatMul's and
Conv's own kernels (executor.kernels.linalg, executor.kernels.nn) accumulate them exactly in int32; the
QLinear ops requantize the sums in float64 (as ONNX's reference does): round half to even, add the
output's zero point, clip to its range."""
import math

import ml_dtypes
import numpy as np

from . import get, schema
from .base import Info, Layout, Schema, broadcast, elements
from .nn import Conv
from ..errors import ShapeError

WIDE = np.dtype(np.int32)


def rows(shape, rank):
    """A per-row scale or zero point of A (rank `rank`) as it broadcasts: an M vector becomes (M, 1)."""
    return (*shape, 1) if len(shape) == 1 and rank >= 2 else tuple(shape)


def check_param(what, shape, target):
    """ShapeError unless a scale or zero point of `shape` broadcasts onto `target` without growing it."""
    try:
        fits = broadcast(target, shape) == tuple(target)
    except ShapeError:
        fits = False
    if not fits:
        raise ShapeError(f"{what} of shape {tuple(shape)} does not broadcast onto {tuple(target)}")


def widen(xp, source, zero, out):
    """out (int32) = source - zero, `zero` None or already shaped to broadcast."""
    xp.copyto(out, source, casting="unsafe")
    if zero is not None:
        xp.subtract(out, zero, out=out, casting="unsafe")


def requantize(xp, sums, wide, multiplier, zero, y):
    """y = clip(round(sums * multiplier + zero)) to y's range, in float64 `wide`, rounding half to even."""
    xp.copyto(wide, sums, casting="unsafe")
    xp.multiply(wide, multiplier, out=wide, casting="unsafe")
    if zero is not None:
        xp.add(wide, zero, out=wide, casting="unsafe")
    xp.rint(wide, out=wide)
    info = ml_dtypes.iinfo(y.dtype)
    xp.clip(wide, int(info.min), int(info.max), out=wide)
    xp.copyto(y, wide, casting="unsafe")


def as_int32(*infos):
    """Infos of the same shapes, int32: what the shape rules of MatMul and Conv see."""
    return [None if i is None else Info(i.shape, WIDE) for i in infos]


class IntegerMatMul(Schema):
    """The shape rule and widening both integer matrix products share: A and B with their zero points
    (scalars, one per row of A, one per column of B) at `zeros`, int32 sums `wide`."""

    mirror = False
    zeros = (2, 3)

    def check(self, ins):
        """A's and B's zero points (or scales) fit A's rows and B's columns; the product's shape."""
        a, b = ins[0], ins[self.operands[1]]
        shape = get("MatMul").infer(None, as_int32(a, b))[0][0]
        for k in self.params:
            if k < len(ins) and ins[k] is not None:
                side = a if k in self.a_params else b
                check_param(f"input {k}", rows(ins[k].shape, side.rank) if side is a else ins[k].shape, side.shape)
        return shape

    def flops(self, node, ins, outs):
        return get("MatMul").flops(node, [ins[0], ins[self.operands[1]]], outs)

    def products(self, xp, ins, ws, out):
        """A and B less their zero points, widened in the workspace, multiplied into `out` (int32) by
        MatMul's kernel."""
        from executor.kernels.linalg import matmul
        a, b = ins[0], ins[self.operands[1]]
        za, zb = (ins[k] if k < len(ins) else None for k in self.zeros)
        widen(xp, a, None if za is None else za.reshape(rows(za.shape, a.ndim)), ws["a"])
        widen(xp, b, zb, ws["b"])
        matmul(xp, None, [ws["a"], ws["b"]], [out], {})

    def widened(self, ins):
        a, b = ins[0], ins[self.operands[1]]
        return ("a", a.shape, WIDE), ("b", b.shape, WIDE)


@schema("MatMulInteger", since=10)
class MatMulInteger(IntegerMatMul):
    """MatMulInteger: (A - a_zero_point) @ (B - b_zero_point), summed exactly in int32."""

    operands = (0, 1)
    params = (2, 3)
    a_params = (2,)

    def infer(self, node, ins):
        return [(self.check(ins), WIDE)]

    def workspace(self, node, ins, outs, limit):
        """`a` and `b`: A and B less their zero points, in int32."""
        return Layout.pack(*self.widened(ins))

    def kernel(self, xp, step, ins, outs, ws):
        self.products(xp, ins, ws, outs[0])


@schema("QLinearMatMul", since=10)
class QLinearMatMul(IntegerMatMul):
    """QLinearMatMul: the int32 product of a and b less their zero points, requantized by
    a_scale * b_scale / y_scale (computed in the scales' dtype) to y_zero_point's dtype."""

    operands = (0, 3)
    params = (1, 2, 4, 5)
    a_params = (1, 2)
    zeros = (2, 5)

    def infer(self, node, ins):
        a, y_zero = ins[0], ins[7]
        if not all(i.dtype.name in ("int8", "uint8") for i in (a, ins[3], y_zero)):
            raise ShapeError("QLinearMatMul runs on int8 and uint8 only (no reference defines its float8 form)")
        shape = self.check(ins)
        check_param("y_scale", ins[6].shape, shape)
        check_param("y_zero_point", y_zero.shape, shape)
        return [(shape, y_zero.dtype)]

    def multiplier(self, ins):
        """The shape of a_scale * b_scale / y_scale, a per-row a_scale as a column."""
        return broadcast(rows(ins[1].shape, ins[0].rank), ins[4].shape, ins[6].shape)

    def workspace(self, node, ins, outs, limit):
        """`a`, `b`: a and b less their zero points (int32); `sums`: their product (int32); `wide`: it
        requantized (float64); `multiplier`: a_scale * b_scale / y_scale, in the scales' dtype."""
        y = outs[0][0]
        return Layout.pack(*self.widened(ins), ("sums", y, WIDE), ("wide", y, np.float64),
                           ("multiplier", self.multiplier(ins), ins[1].dtype))

    def flops(self, node, ins, outs):
        """The product's, and a multiply, add, round and clip per output element."""
        return super().flops(node, ins, outs) + 4 * elements(outs)

    def kernel(self, xp, step, ins, outs, ws):
        a, a_scale, b_scale, y_scale, y_zero = ins[0], ins[1], ins[4], ins[6], ins[7]
        self.products(xp, ins, ws, ws["sums"])
        multiplier = ws["multiplier"]
        xp.multiply(a_scale.reshape(rows(a_scale.shape, a.ndim)), b_scale, out=multiplier)
        xp.divide(multiplier, y_scale, out=multiplier)
        requantize(xp, ws["sums"], ws["wide"], multiplier, y_zero, outs[0])


class IntegerConv(Schema):
    """What both integer convolutions share: Conv's shape rule, chunked columns and kernel on x and w
    less their zero points (x's one value, w's one or one per output channel), widened to int32."""

    mirror = False
    defaults = Conv.defaults
    data = (0, 1)
    zeros = (2, 3)

    def conv(self, node, ins):
        """Conv's shape of the int32 convolution of x and w (with the bias, if any)."""
        x, w = ins[self.data[0]], ins[self.data[1]]
        bias = ins[8] if len(ins) > 8 else None
        return get("Conv").infer(node, as_int32(x, w, bias))[0][0]

    def check_zeros(self, ins, zx, zw):
        x, w = ins[self.data[0]], ins[self.data[1]]
        if zx is not None and math.prod(zx.shape) != 1:
            raise ShapeError(f"x's zero point of shape {zx.shape} must be one value")
        if zw is not None and math.prod(zw.shape) != 1 and zw.shape != (w.shape[0],):
            raise ShapeError(f"w's zero point of shape {zw.shape} must be one value or one per output channel "
                             f"({w.shape[0]})")
        return x, w

    def layout(self, node, ins, out, limit, *more):
        """`x`, `w`: x and w less their zero points (int32), then `more`, then Conv's `columns` for the
        int32 convolution, chunked to the rest of `limit` (at least a row: see nn.conv_chunks)."""
        x, w = ins[self.data[0]], ins[self.data[1]]
        parts = [("x", x.shape, WIDE), ("w", w.shape, WIDE), *more]
        used = Layout.pack(*parts).nbytes
        columns = get("Conv").workspace(node, as_int32(x, w), [(out, WIDE)], max(limit - used, 0))
        return Layout.pack(*parts, *((s.name, s.shape, s.dtype) for s in columns.slices))

    def flops(self, node, ins, outs):
        bias = [ins[8]] if len(ins) > 8 and ins[8] is not None else []
        return get("Conv").flops(node, [ins[self.data[0]], ins[self.data[1]], *bias], outs)

    def convolve(self, xp, step, ins, ws, out):
        """x and w less their zero points, widened in the workspace, convolved into `out` (int32) by
        Conv's kernel (with the bias, if any)."""
        from executor.kernels.nn import conv
        x, w = ins[self.data[0]], ins[self.data[1]]
        zx, zw = (ins[k] if k < len(ins) else None for k in self.zeros)
        widen(xp, x, None if zx is None else zx.reshape(()), ws["x"])
        widen(xp, w, None if zw is None else zw.reshape(-1, *[1] * (w.ndim - 1)), ws["w"])
        bias = ins[8] if len(ins) > 8 else None
        conv(xp, step, [ws["x"], ws["w"], bias], [out], {k: v for k, v in ws.items() if k == "columns"})


@schema("ConvInteger", since=10)
class ConvInteger(IntegerConv):
    """ConvInteger: Conv of (x - x_zero_point) and (w - w_zero_point), summed exactly in int32; the
    padding holds x's zero point (0 once shifted)."""

    def infer(self, node, ins):
        self.check_zeros(ins, *[*ins, None, None][2:4])
        return [(self.conv(node, ins), WIDE)]

    def workspace(self, node, ins, outs, limit):
        return self.layout(node, ins, outs[0][0], limit)

    def kernel(self, xp, step, ins, outs, ws):
        self.convolve(xp, step, ins, ws, outs[0])


@schema("QLinearConv", since=10)
class QLinearConv(IntegerConv):
    """QLinearConv: ConvInteger's int32 sums plus the int32 bias, requantized by
    x_scale * w_scale / y_scale (w_scale one value or one per output channel) to y_zero_point's dtype."""

    data = (0, 3)
    zeros = (2, 5)

    def infer(self, node, ins):
        x, w = self.check_zeros(ins, ins[2], ins[5])
        for name, k in (("x_scale", 1), ("y_scale", 6), ("y_zero_point", 7)):
            if math.prod(ins[k].shape) != 1:
                raise ShapeError(f"{name} of shape {ins[k].shape} must be one value")
        if math.prod(ins[4].shape) != 1 and ins[4].shape != (w.shape[0],):
            raise ShapeError(f"w_scale of shape {ins[4].shape} must be one value or one per output channel "
                             f"({w.shape[0]})")
        return [(self.conv(node, ins), ins[7].dtype)]

    def workspace(self, node, ins, outs, limit):
        """Conv's (see `IntegerConv.layout`), and `sums`: the int32 convolution; `wide`: it requantized
        (float64); `multiplier`: x_scale * w_scale / y_scale, one or one per output channel (float32)."""
        y = outs[0][0]
        return self.layout(node, ins, y, limit, ("sums", y, WIDE), ("wide", y, np.float64),
                           ("multiplier", (math.prod(ins[4].shape),), np.float32))

    def flops(self, node, ins, outs):
        """The convolution's, and a multiply, add, round and clip per output element."""
        return super().flops(node, ins, outs) + 4 * elements(outs)

    def kernel(self, xp, step, ins, outs, ws):
        x_scale, w_scale, y_scale, y_zero, y = ins[1], ins[4], ins[6], ins[7], outs[0]
        self.convolve(xp, step, ins, ws, ws["sums"])
        multiplier = ws["multiplier"]
        xp.multiply(x_scale.reshape(()), w_scale.reshape(-1), out=multiplier)
        xp.divide(multiplier, y_scale.reshape(()), out=multiplier)
        requantize(xp, ws["sums"], ws["wide"], multiplier.reshape(-1, *[1] * (y.ndim - 2)), y_zero.reshape(()), y)
