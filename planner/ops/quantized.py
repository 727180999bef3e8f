"""Linear quantization: QuantizeLinear, DequantizeLinear (per tensor, per axis and blocked),
DynamicQuantizeLinear, and BitCast. Their arithmetic runs in widened copies held in the op's
workspace; ml_dtypes holds the 4-, 2-bit and 8-bit float types (on NumPy only)."""
import math

import ml_dtypes
import numpy as np

from .registry import schema
from .base import Layout, Schema, axis, elements, no_flops
from .torch_forms import torch_dtype, unsupported
from ..dtypes import from_onnx
from ..errors import ShapeError

INTEGERS = frozenset({"int8", "uint8", "int16", "uint16", "int4", "uint4", "int2", "uint2"})
"""The integer types QuantizeLinear rounds to and DequantizeLinear reads (int32 aside)."""


def target(dtype):
    """How QuantizeLinear makes `dtype`: "integer" (round half to even, add the zero point, clip),
    "float8" (clip to the largest finite values when saturating), "narrow" (the 4- and 6-bit floats,
    the zero point added); None for a dtype it does not make."""
    name = np.dtype(dtype).name
    if name in INTEGERS:
        return "integer"
    if name.startswith("float8") and name != "float8_e8m0fnu":
        return "float8"
    return "narrow" if name.startswith(("float4", "float6")) else None


def bound(dtype):
    """How far QuantizeLinear clips a rounded quotient of `dtype` before it becomes int32: past every
    integer target's range less its zero point (2 ** 17), or float16's largest value."""
    return 65504 if np.dtype(dtype) == np.float16 else 1 << 17


def check_granularity(schema, node, x, scale, zero):
    """ShapeError unless `scale` (and `zero`, of its shape) quantizes x per tensor (one value), per
    axis (one per index of `axis`) or in blocks of `block_size` along `axis` (x's shape with that dim
    ceil(dim / block_size))."""
    if zero is not None and zero.shape != scale.shape and math.prod(zero.shape) * math.prod(scale.shape) != 1:
        raise ShapeError(f"the zero point's shape {zero.shape} differs from the scale's {scale.shape}")
    block = schema.attr(node, "block_size")
    if block < 0:
        raise ShapeError(f"block_size {block} must not be negative")
    if math.prod(scale.shape) == 1:
        return
    a = axis(schema.attr(node, "axis"), x.rank)
    if not block:
        if scale.shape != (x.shape[a],):
            raise ShapeError(f"a scale of shape {scale.shape} is neither one value nor one per index of axis {a} "
                             f"of {x.shape} (give block_size for blocked quantization)")
        return
    want = (*x.shape[:a], -(-x.shape[a] // block), *x.shape[a + 1:])
    if scale.shape != want:
        raise ShapeError(f"blocks of {block} along axis {a} of {x.shape} need a scale of shape {want}, "
                         f"not {scale.shape}")


def pieces(arrays, params, axis_, block):
    """Views of `arrays` (of x's shape) and of `params` (the scale and zero point, None where
    omitted) that broadcast together, piece by piece: one piece per tensor and per axis; blocked,
    the whole blocks, then the short last one (when block_size does not divide the axis). Arrays of
    NumPy, CuPy or PyTorch."""
    x = arrays[0]
    if math.prod(params[0].shape) == 1:
        yield arrays, [None if p is None else p.reshape(()) for p in params]
        return
    a = axis_ % x.ndim
    if not block:
        yield arrays, [None if p is None else p.reshape(-1, *[1] * (x.ndim - a - 1)) for p in params]
        return
    pre, size, post = math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1:])
    whole = size // block
    cubes = [t.reshape(pre, size, post) for t in arrays]
    flat = [None if p is None else p.reshape(pre, -(-size // block), post) for p in params]
    if whole:
        yield ([t[:, :whole * block].reshape(pre, whole, block, post) for t in cubes],
               [None if p is None else p[:, :whole, None] for p in flat])
    if size % block:
        yield [t[:, whole * block:] for t in cubes], [None if p is None else p[:, whole:] for p in flat]


@schema("QuantizeLinear", since=10)
class QuantizeLinear(Schema):
    """y = saturate(round(x / scale) + zero_point), rounding half to even; the zero point's dtype (or
    output_dtype, else uint8) is y's. The division runs in `precision` (else as x / scale promotes)."""

    defaults = {"axis": 1, "saturate": 1, "block_size": 0, "output_dtype": 0, "precision": 0}

    def dtypes(self, node, x, scale, zero):
        """(y's dtype, the dtype the division runs in)."""
        given = self.attr(node, "output_dtype")
        dtype = zero.dtype if zero is not None else from_onnx(given) if given else np.dtype(np.uint8)
        if given and from_onnx(given) != dtype:
            raise ShapeError(f"output_dtype {from_onnx(given)} differs from the zero point's dtype {dtype}")
        if target(dtype) is None:
            raise ShapeError(f"{dtype} is not a type QuantizeLinear quantizes to")
        if self.attr(node, "precision"):
            return dtype, from_onnx(self.attr(node, "precision"))
        try:
            return dtype, np.true_divide.resolve_dtypes((x.dtype, scale.dtype, None))[-1]
        except TypeError:
            raise ShapeError(f"x ({x.dtype}) and its scale ({scale.dtype}) have no common dtype to divide in; "
                             "give precision") from None

    def infer(self, node, ins):
        x, scale, zero = [*ins, None][:3]
        check_granularity(self, node, x, scale, zero)
        return [(x.shape, self.dtypes(node, x, scale, zero)[0])]

    def workspace(self, node, ins, outs, limit):
        """`quotient`: x / scale in the division's dtype; `ints`, for integer targets: the rounded
        quotients in int32, where the zero point is added and the result clipped."""
        x, scale, zero = [*ins, None][:3]
        dtype, precision = self.dtypes(node, x, scale, zero)
        return Layout.pack(("quotient", x.shape, precision),
                           ("ints", x.shape, np.int32) if target(dtype) == "integer" else None)

    def flops(self, node, ins, outs):
        """A division, a rounding, an addition and a clip per element."""
        return 4 * elements(outs)

    def kernel(self, xp, step, ins, outs, ws):
        x, scale, zero = [*ins, None][:3]
        y, quotient, kind = outs[0], ws["quotient"], target(outs[0].dtype)
        where = step.attrs["axis"], step.attrs["block_size"]
        if not x.size:
            return
        for (xs, qs), (ss,) in pieces([x, quotient], [scale], *where):
            xp.divide(xs, ss, out=qs, dtype=quotient.dtype, casting="unsafe")
        if kind == "integer":
            ints = ws["ints"]
            xp.rint(quotient, out=quotient)
            xp.clip(quotient, -bound(quotient.dtype), bound(quotient.dtype), out=quotient)
            xp.copyto(ints, quotient, casting="unsafe")
            if zero is not None:
                for (part,), (zs,) in pieces([ints], [zero], *where):
                    xp.add(part, zs, out=part, casting="unsafe")
            info = ml_dtypes.iinfo(y.dtype)
            xp.clip(ints, int(info.min), int(info.max), out=ints)
            xp.copyto(y, ints, casting="unsafe")
            return
        if kind == "float8" and step.attrs["saturate"]:
            info = ml_dtypes.finfo(y.dtype)
            xp.clip(quotient, float(info.min), float(info.max), out=quotient)
        elif kind == "narrow" and zero is not None:
            for (part,), (zs,) in pieces([quotient], [zero], *where):
                xp.add(part, zs, out=part, casting="unsafe")
        xp.copyto(y, quotient, casting="unsafe")

    def torch(self, torch, x, scale, zero=None, *, axis, saturate, block_size, output_dtype, precision):
        """The integer targets: rounded half to even in the division's dtype, shifted and clipped in int32."""
        dtype = np.dtype(zero.cpu().numpy().dtype) if zero is not None else \
            from_onnx(output_dtype) if output_dtype else np.dtype(np.uint8)
        if target(dtype) != "integer":
            raise unsupported(f"QuantizeLinear to {dtype}")
        quotient = torch.empty(x.shape, dtype=torch_dtype(torch, from_onnx(precision)) if precision else
                               torch.result_type(x, scale) if x.is_floating_point() else torch.float64, device=x.device)
        for (xs, qs), (ss,) in pieces([x, quotient], [scale], axis, block_size):
            qs.copy_(xs.to(qs.dtype) / ss.to(qs.dtype))
        limit = bound(np.float16 if quotient.dtype == torch.float16 else np.float32)
        ints = quotient.round().clamp(-limit, limit).to(torch.int32)
        if zero is not None:
            for (part,), (zs,) in pieces([ints], [zero], axis, block_size):
                part.add_(zs.to(torch.int32))
        info = ml_dtypes.iinfo(dtype)
        return ints.clamp(int(info.min), int(info.max)).to(torch_dtype(torch, dtype))


@schema("DequantizeLinear", since=10)
class DequantizeLinear(Schema):
    """y = (x - zero_point) * scale, computed in float32; y is output_dtype's, else the scale's."""

    defaults = {"axis": 1, "block_size": 0, "output_dtype": 0}

    def infer(self, node, ins):
        x, scale, zero = [*ins, None][:3]
        check_granularity(self, node, x, scale, zero)
        given = self.attr(node, "output_dtype")
        dtype = from_onnx(given) if given else scale.dtype
        if dtype.name not in ("float32", "float16", "bfloat16"):
            raise ShapeError(f"the output would be {dtype}; DequantizeLinear makes float, float16 or bfloat16 "
                             "(give output_dtype)")
        return [(x.shape, dtype)]

    def workspace(self, node, ins, outs, limit):
        """`wide`: the float32 values, where the output is not float32 itself."""
        return Layout() if outs[0][1] == np.float32 else Layout.pack(("wide", ins[0].shape, np.float32))

    def flops(self, node, ins, outs):
        """A subtraction and a multiplication per element."""
        return 2 * elements(outs)

    def kernel(self, xp, step, ins, outs, ws):
        x, scale, zero = [*ins, None][:3]
        y = outs[0]
        wide = ws.get("wide", y)
        if not x.size:
            return
        for (xs, part), (ss, zs) in pieces([x, wide], [scale, zero], step.attrs["axis"], step.attrs["block_size"]):
            xp.copyto(part, xs, casting="unsafe")
            if zs is not None:
                xp.subtract(part, zs, out=part, casting="unsafe")
            xp.multiply(part, ss, out=part, casting="unsafe")
        if wide is not y:
            xp.copyto(y, wide, casting="unsafe")

    def torch(self, torch, x, scale, zero=None, *, axis, block_size, output_dtype):
        wide = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        for (xs, part), (ss, zs) in pieces([x, wide], [scale, zero], axis, block_size):
            part.copy_(xs.float() - (0 if zs is None else zs.float())).mul_(ss.float())
        return wide.to(torch_dtype(torch, from_onnx(output_dtype)) if output_dtype else scale.dtype)


@schema("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Schema):
    """uint8 quantization of float32 x over its range widened to hold 0: y, its scalar scale
    ((max - min) / 255) and zero point (round(-min / scale), clipped to [0, 255])."""

    def infer(self, node, ins):
        return [(ins[0].shape, np.dtype(np.uint8)), ((), np.dtype(np.float32)), ((), np.dtype(np.uint8))]

    def workspace(self, node, ins, outs, limit):
        """`quotient`: x / scale (float32), rounded, shifted and clipped before it becomes y; `extremes`:
        x's min and max."""
        return Layout.pack(("quotient", ins[0].shape, np.float32), ("extremes", (2,), np.float32))

    def flops(self, node, ins, outs):
        """The min and max, then a division, a rounding, an addition and a clip per element."""
        return 6 * math.prod(ins[0].shape)

    def kernel(self, xp, step, ins, outs, ws):
        x, (y, scale, zero), quotient, extremes = ins[0], outs, ws["quotient"], ws["extremes"]
        extremes.fill(0)
        if x.size:
            xp.min(x, out=extremes[0:1].reshape(()))
            xp.max(x, out=extremes[1:2].reshape(()))
        low, high = np.float32(min(float(extremes[0]), 0)), np.float32(max(float(extremes[1]), 0))
        step_ = np.float32(1.0 if high == low else high - low) / np.float32(255)
        point = np.rint(np.float32(max(0, min(255, np.float32(0) - low / step_))))
        scale.fill(step_)
        zero.fill(point)
        xp.divide(x, step_, out=quotient)
        xp.rint(quotient, out=quotient)
        xp.add(quotient, point, out=quotient)
        xp.clip(quotient, 0, 255, out=quotient)
        xp.copyto(y, quotient, casting="unsafe")

    def torch(self, torch, x):
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        low, high = torch.minimum(x.min(), zero), torch.maximum(x.max(), zero)
        scale = torch.where(high == low, torch.ones_like(high), high - low) / 255
        point = (0 - low / scale).clamp(0, 255).round()
        y = ((x / scale).round() + point).clamp(0, 255).to(torch.uint8)
        return y, scale, point.to(torch.uint8)


def bits(dtype):
    """The bits of one value of `dtype` as ONNX stores it (4 for int4, though NumPy holds a byte)."""
    dtype = np.dtype(dtype)
    for info in (ml_dtypes.iinfo, ml_dtypes.finfo):
        try:
            return info(dtype).bits
        except (TypeError, ValueError):
            pass
    return 8 * dtype.itemsize


@schema("BitCast", since=26)
class BitCast(Schema):
    """BitCast: x's bytes read as the dtype `to` of the same width, copied into the output."""

    ranks = "same"
    defaults = {"to": None}
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        x, dtype = ins[0], from_onnx(self.attr(node, "to"))
        if bits(x.dtype) != bits(dtype):
            raise ShapeError(f"BitCast from {x.dtype} ({bits(x.dtype)} bits) to {dtype} ({bits(dtype)} bits): "
                             "the widths must be equal")
        if bits(dtype) < 8:
            raise ShapeError(f"BitCast of {x.dtype} to {dtype}: memplan holds 4- and 2-bit values one per byte, "
                             "so their bits cannot be read as another type in place")
        return [(x.shape, dtype)]

    def evaluate(self, node, x):
        return [x.view(from_onnx(self.attr(node, "to")))]

    def kernel(self, xp, step, ins, outs, ws):
        xp.copyto(outs[0], ins[0].view(outs[0].dtype))

    def torch(self, torch, x, to):
        return x.view(torch_dtype(torch, from_onnx(to)))
