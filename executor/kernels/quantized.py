"""Integer matrix products and convolutions (planner/ops/quantized_linalg.py): the 8-bit operands less
their zero points, widened to int32 in the step's workspace, summed exactly in int32 by MatMul's and
Conv's own kernels; the QLinear ops then requantize the sums in float64, rounding half to even."""
import ml_dtypes

from planner import ops
from planner.ops.quantized_linalg import rows

from . import kernel
from .linalg import matmul
from .nn import conv


def widen(xp, source, zero, out):
    """out (int32) = source - zero, `zero` None or already shaped to broadcast."""
    xp.copyto(out, source, casting="unsafe")
    if zero is not None:
        xp.subtract(out, zero, out=out, casting="unsafe")


def requantize(xp, ws, scales, y_scale, y_zero, y, by=None):
    """y = clip(round(sums * multiplier + y_zero)) to y's range, rounding half to even: `sums` the int32
    ws["sums"], `multiplier` the product of `scales` over y_scale in ws["multiplier"] (viewed as shape `by`
    where given), the sum taken in float64 ws["wide"]."""
    multiplier, wide = ws["multiplier"], ws["wide"]
    xp.multiply(*scales, out=multiplier)
    xp.divide(multiplier, y_scale, out=multiplier)
    xp.copyto(wide, ws["sums"], casting="unsafe")
    xp.multiply(wide, multiplier if by is None else multiplier.reshape(by), out=wide, casting="unsafe")
    xp.add(wide, y_zero, out=wide, casting="unsafe")
    xp.rint(wide, out=wide)
    info = ml_dtypes.iinfo(y.dtype)
    xp.clip(wide, int(info.min), int(info.max), out=wide)
    xp.copyto(y, wide, casting="unsafe")


def products(xp, step, ins, ws, out):
    """A and B less their zero points (where the step's schema says they are), widened in the workspace,
    multiplied into `out` (int32) by MatMul's kernel."""
    schema = ops.of(step)
    a, b = ins[schema.a], ins[schema.b]
    za, zb = (ins[k[0]] if k[0] < len(ins) else None for k in (schema.a_params, schema.b_params))
    widen(xp, a, None if za is None else za.reshape(rows(za.shape, a.ndim)), ws["a"])
    widen(xp, b, zb, ws["b"])
    matmul(xp, None, [ws["a"], ws["b"]], [out], {})


def convolve(xp, step, ins, ws, out):
    """x and w less their zero points (where the step's schema says they are), widened in the workspace,
    convolved into `out` (int32) by Conv's kernel, with the bias (input 8) if any."""
    schema = ops.of(step)
    x, w = ins[schema.x], ins[schema.w]
    zx, zw = (ins[k] if k < len(ins) else None for k in (schema.x_zero, schema.w_zero))
    widen(xp, x, None if zx is None else zx.reshape(()), ws["x"])
    widen(xp, w, None if zw is None else zw.reshape(-1, *[1] * (w.ndim - 1)), ws["w"])
    bias = ins[8] if len(ins) > 8 else None
    conv(xp, step, [ws["x"], ws["w"], bias], [out], {k: v for k, v in ws.items() if k == "columns"})


@kernel("MatMulInteger")
def matmul_integer(xp, step, ins, outs, ws):
    products(xp, step, ins, ws, outs[0])


@kernel("ConvInteger")
def conv_integer(xp, step, ins, outs, ws):
    convolve(xp, step, ins, ws, outs[0])


@kernel("QLinearMatMul")
def qlinear_matmul(xp, step, ins, outs, ws):
    """The int32 product, requantized by a_scale * b_scale / y_scale (a per-row a_scale as a column)."""
    a, a_scale, b_scale, y_scale, y_zero = ins[0], ins[1], ins[4], ins[6], ins[7]
    products(xp, step, ins, ws, ws["sums"])
    requantize(xp, ws, (a_scale.reshape(rows(a_scale.shape, a.ndim)), b_scale), y_scale, y_zero, outs[0])


@kernel("QLinearConv")
def qlinear_conv(xp, step, ins, outs, ws):
    """The int32 convolution, requantized by x_scale * w_scale / y_scale (w_scale one or one per channel)."""
    x_scale, w_scale, y_scale, y_zero, y = ins[1], ins[4], ins[6], ins[7], outs[0]
    convolve(xp, step, ins, ws, ws["sums"])
    requantize(xp, ws, (x_scale.reshape(()), w_scale.reshape(-1)), y_scale.reshape(()), y_zero.reshape(()), y,
               by=(-1, *[1] * (y.ndim - 2)))
