"""Integer matrix products and convolutions: MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv.

The 8-bit inputs are widened to int32 less their zero points in the op's workspace, then MatMul's and
Conv's own kernels accumulate them exactly in int32; the QLinear ops requantize the sums in float64 (as
ONNX's reference does): round half to even, add the output's zero point, clip to its range. Their kernels
are in executor/kernels/quantized.py; the schemas say where the zero points and scales go (`a`, `b`,
`a_params`, `b_params`; `x`, `w`, `x_zero`, `w_zero`)."""
import math

import ml_dtypes
import numpy as np

from .registry import get, schema
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


def check_side(what, shape, operand, row):
    """ShapeError unless a scale or zero point of A (`row`) or B is one value, or one per row of A (its
    last dim 1) or per column of B (its next-to-last dim 1, or a vector): never one per inner index,
    which the sum over that index could not factor out."""
    shape = rows(shape, len(operand)) if row else (1, *shape) if len(shape) == 1 else tuple(shape)
    inner = -1 if row else -2
    if math.prod(shape) != 1 and (len(operand) < 2 or len(shape) < -inner or shape[inner] != 1):
        raise ShapeError(f"{what} of shape {tuple(shape)} must be one value or one per "
                         f"{'row of A' if row else 'column of B'}")
    check_param(what, shape, operand)


def as_int32(*infos):
    """Infos of the same shapes, int32: what the shape rules of MatMul and Conv see."""
    return [None if i is None else Info(i.shape, WIDE) for i in infos]


class IntegerMatMul(Schema):
    """What both integer matrix products share: MatMul's shape rule, and its kernel on A and B less
    their zero points, widened to int32. `a`, `b`: their input indices; `a_params` and `b_params`: the
    indices of their zero points (first) and scales."""

    mirror = False

    def check(self, node, ins):
        """The product's shape, once each zero point and scale is found to fit A's rows or B's columns."""
        a, b = ins[self.a], ins[self.b]
        shape = get("MatMul").infer(node, as_int32(a, b))[0][0]
        for indices, operand, row in ((self.a_params, a, True), (self.b_params, b, False)):
            for k in indices:
                if k < len(ins) and ins[k] is not None:
                    check_side(f"input {k} ({'A' if row else 'B'}'s)", ins[k].shape, operand.shape, row)
        return shape

    def widened(self, ins):
        """`a` and `b`: A and B less their zero points, in int32."""
        return ("a", ins[self.a].shape, WIDE), ("b", ins[self.b].shape, WIDE)

    def flops(self, node, ins, outs):
        return get("MatMul").flops(node, [ins[self.a], ins[self.b]], outs)

    def torch_products(self, torch, a, b, za, zb):
        """A @ B less their zero points in PyTorch, in float64 (exact: PyTorch has no integer GEMM on the GPU)."""
        a = a.double() if za is None else a.double() - za.double().reshape(rows(za.shape, a.ndim))
        b = b.double() if zb is None else b.double() - zb.double()
        return torch.matmul(a, b)


@schema("MatMulInteger", since=10)
class MatMulInteger(IntegerMatMul):
    """MatMulInteger: (A - a_zero_point) @ (B - b_zero_point), summed exactly in int32."""

    a, b, a_params, b_params = 0, 1, (2,), (3,)

    def infer(self, node, ins):
        return [(self.check(node, ins), WIDE)]

    def workspace(self, node, ins, outs, limit):
        return Layout.pack(*self.widened(ins))

    def torch(self, torch, a, b, a_zero=None, b_zero=None):
        return self.torch_products(torch, a, b, a_zero, b_zero).to(torch.int32)


@schema("QLinearMatMul", since=10)
class QLinearMatMul(IntegerMatMul):
    """QLinearMatMul: the int32 product of a and b less their zero points, requantized by
    a_scale * b_scale / y_scale (computed in the scales' dtype) to y_zero_point's dtype."""

    a, b, a_params, b_params = 0, 3, (2, 1), (5, 4)

    def infer(self, node, ins):
        a, y_zero = ins[0], ins[7]
        if not all(i.dtype.name in ("int8", "uint8") for i in (a, ins[3], y_zero)):
            raise ShapeError("QLinearMatMul runs on int8 and uint8 only (no reference defines its float8 form)")
        shape = self.check(node, ins)
        for k in (6, 7):
            check_side(f"input {k} (Y's)", ins[k].shape, shape, row=False)
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

    def torch(self, torch, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero):
        multiplier = a_scale.reshape(rows(a_scale.shape, a.ndim)) * b_scale / y_scale
        wide = self.torch_products(torch, a, b, a_zero, b_zero) * multiplier.double() + y_zero.double()
        info = ml_dtypes.iinfo(y_zero.cpu().numpy().dtype)
        return wide.round().clamp(int(info.min), int(info.max)).to(y_zero.dtype)


def check_channels(what, shape, channels):
    """ShapeError unless a scale or zero point of `shape` is one value or one per output channel (or,
    with `channels` None, one value)."""
    if math.prod(shape) != 1 and (channels is None or tuple(shape) != (channels,)):
        raise ShapeError(f"{what} of shape {tuple(shape)} must be one value"
                         + (f" or one per output channel ({channels})" if channels is not None else ""))


class IntegerConv(Schema):
    """What both integer convolutions share: Conv's shape rule, chunked columns and kernel on x and w
    less their zero points (x's one value, w's one or one per output channel), widened to int32. `x`,
    `w`, `x_zero`, `w_zero`: their input indices; the bias, where the op has one, is input 8."""

    mirror = False
    defaults = Conv.defaults

    def conv(self, node, ins):
        """Conv's shape of the int32 convolution of x and w (with the bias, if any), once the zero
        points are found to fit."""
        x, w, bias = ins[self.x], ins[self.w], ins[8] if len(ins) > 8 else None
        for what, k, channels in (("x's zero point", self.x_zero, None), ("w's zero point", self.w_zero, w.shape[0])):
            if k < len(ins) and ins[k] is not None:
                check_channels(what, ins[k].shape, channels)
        return get("Conv").infer(node, as_int32(x, w, bias))[0][0]

    def layout(self, node, ins, out, limit, *more):
        """`x`, `w`: x and w less their zero points (int32), then `more`, then Conv's `columns` for the
        int32 convolution, chunked to the rest of `limit` (at least a row: see nn.conv_chunks)."""
        x, w = ins[self.x], ins[self.w]
        parts = [("x", x.shape, WIDE), ("w", w.shape, WIDE), *more]
        used = Layout.pack(*parts).nbytes
        columns = get("Conv").workspace(node, as_int32(x, w), [(out, WIDE)], max(limit - used, 0))
        return Layout.pack(*parts, *((s.name, s.shape, s.dtype) for s in columns.slices))

    def flops(self, node, ins, outs):
        bias = [ins[8]] if len(ins) > 8 and ins[8] is not None else []
        return get("Conv").flops(node, [ins[self.x], ins[self.w], *bias], outs)


@schema("ConvInteger", since=10)
class ConvInteger(IntegerConv):
    """ConvInteger: Conv of (x - x_zero_point) and (w - w_zero_point), summed exactly in int32; the
    padding holds x's zero point (0 once shifted)."""

    autocast = "low"
    x, w, x_zero, w_zero = 0, 1, 2, 3

    def infer(self, node, ins):
        return [(self.conv(node, ins), WIDE)]

    def workspace(self, node, ins, outs, limit):
        return self.layout(node, ins, outs[0][0], limit)


@schema("QLinearConv", since=10)
class QLinearConv(IntegerConv):
    """QLinearConv: ConvInteger's int32 sums plus the int32 bias, requantized by
    x_scale * w_scale / y_scale (w_scale one value or one per output channel) to y_zero_point's dtype."""

    x, w, x_zero, w_zero = 0, 3, 2, 5

    def infer(self, node, ins):
        shape = self.conv(node, ins)
        for what, k, channels in (("x_scale", 1, None), ("w_scale", 4, ins[3].shape[0]), ("y_scale", 6, None),
                                  ("y_zero_point", 7, None)):
            check_channels(what, ins[k].shape, channels)
        return [(shape, ins[7].dtype)]

    def workspace(self, node, ins, outs, limit):
        """Conv's (see `IntegerConv.layout`), and `sums`: the int32 convolution; `wide`: it requantized
        (float64); `multiplier`: x_scale * w_scale / y_scale, one or one per output channel (float32)."""
        y = outs[0][0]
        return self.layout(node, ins, y, limit, ("sums", y, WIDE), ("wide", y, np.float64),
                           ("multiplier", (math.prod(ins[4].shape),), np.float32))

    def flops(self, node, ins, outs):
        """The convolution's, and a multiply, add, round and clip per output element."""
        return super().flops(node, ins, outs) + 4 * elements(outs)
