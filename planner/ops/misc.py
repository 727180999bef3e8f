"""Ops that make or convert values: Cast, Range, ConstantOfShape, Trilu, Dropout (and memplan.Dropout,
its training-step form)."""
from dataclasses import replace

import numpy as np
from onnx import numpy_helper

from .registry import schema
from .base import FLOATS, Schema, no_flops, same_as_input
from .torch_forms import torch_dtype
from .. import dtypes
from ..errors import ShapeError
from ..ir import Tensor

_SATURATING = {"float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"}
"""The dtypes whose Cast clamps to the largest finite value when `saturate` is set (as the spec's table says)."""


@schema("Cast")
class Cast(Schema):
    """Cast: to the dtype `to`; float8 targets saturate to their largest finite value unless saturate=0."""

    split = "same"
    ranks = "same"
    defaults = {"saturate": 1, "round_mode": "up"}

    def infer(self, node, ins):
        return [(ins[0].shape, dtypes.from_onnx(self.attr(node, "to")))]

    def evaluate(self, node, x):
        dtype, saturate = dtypes.from_onnx(self.attr(node, "to")), self.attr(node, "saturate")
        if dtype.name in _SATURATING and saturate:
            return [numpy_helper.saturate_cast(x, dtype)]
        if dtype.name == "float8_e8m0fnu":
            return [numpy_helper.to_float8e8m0(x, saturate, self.attr(node, "round_mode"))]
        return [x.astype(dtype)]

    def gradient(self, b, node, dys):
        """dY cast back, from one float dtype to another; none to or from other dtypes."""
        x = node.inputs[0]
        if not (dtypes.is_float(b.dtype(x)) and dtypes.is_float(dtypes.from_onnx(self.attr(node, "to")))):
            return [None]
        return [b.op("Cast", dys[0], to=dtypes.to_onnx(b.dtype(x)))]

    def torch_node(self, torch, run, node, ins):
        return ins[0].to(torch_dtype(torch, dtypes.from_onnx(self.attr(node, "to"))))


def _range(start, limit, delta):
    """start, start + delta, ... up to limit (excluded), in start's dtype."""
    if np.issubdtype(start.dtype, np.integer):
        return np.arange(int(start), int(limit), int(delta), dtype=start.dtype)
    return np.arange(float(start), float(limit), float(delta)).astype(start.dtype)


def _range_length(start, limit, delta):
    """How many values Range makes, max(ceil((limit - start) / delta), 0), without making them."""
    if delta == 0:
        raise ShapeError("delta must not be 0")
    if np.issubdtype(start.dtype, np.integer):
        return max(-(-(int(limit) - int(start)) // int(delta)), 0)
    count = np.ceil((float(limit) - float(start)) / float(delta))
    if not np.isfinite(count):
        raise ShapeError(f"start {start}, limit {limit} and delta {delta} do not make a finite range")
    return max(int(count), 0)


@schema("Range")
class Range(Schema):
    def infer(self, node, ins):
        if len({i.dtype for i in ins}) > 1:
            raise ShapeError(f"start, limit and delta have different dtypes {[str(i.dtype) for i in ins]}")
        if any(i.value is None for i in ins):
            raise ShapeError("start, limit and delta must be computable from the model's constants and input shapes, "
                             "but they depend on input data")
        return [((_range_length(*(i.value for i in ins)),), ins[0].dtype)]

    flops = staticmethod(no_flops)

    def evaluate(self, node, start, limit, delta):
        return [_range(start, limit, delta)]


@schema("ConstantOfShape")
class ConstantOfShape(Schema):
    """ConstantOfShape: a tensor of the given shape filled with the one-element `value`."""

    attr_inputs = (("shape", 0, 9),)
    defaults = {"value": np.zeros(1, np.float32)}

    def infer(self, node, ins):
        shape = tuple(self.attr(node, "shape"))
        if min(shape, default=0) < 0:
            raise ShapeError(f"shape {shape} has a negative dimension")
        return [(shape, self.attr(node, "value").dtype)]

    flops = staticmethod(no_flops)

    def evaluate(self, node):
        value = self.attr(node, "value")
        return [np.full(self.attr(node, "shape"), value.reshape(-1)[0], dtype=value.dtype)]


@schema("Trilu")
class Trilu(Schema):
    """Trilu: the upper (or lower) triangle of the last two dims from diagonal k; the rest is zeroed."""

    attr_inputs = (("k", 1, 14),)
    defaults = {"k": 0, "upper": 1}
    inplace = ((0, 0),)

    def infer(self, node, ins):
        if ins[0].rank < 2:
            raise ShapeError(f"input has rank {ins[0].rank}, Trilu needs at least 2")
        return same_as_input(node, ins)

    def evaluate(self, node, x):
        return [(np.triu if self.attr(node, "upper") else np.tril)(x, self.attr(node, "k"))]

    def gradient(self, b, node, dys):
        """dY on the same triangle, zeros elsewhere."""
        return [b.op("Trilu", dys[0], k=self.attr(node, "k"), upper=self.attr(node, "upper"))]

    def torch(self, torch, x, k, upper):
        return (torch.triu if upper else torch.tril)(x, k)


@schema("Dropout")
class Dropout(Schema):
    """Dropout: in inference (or with ratio 0) the data unchanged and an all-true mask; in training
    each element is zeroed with probability `ratio` and the rest scaled by 1 / (1 - ratio)."""

    split = "same"
    ranks = "same"
    random = True
    attr_inputs = (("ratio", 1, 12), ("training_mode", 2, 12))
    defaults = {"ratio": 0.5, "training_mode": 0, "seed": None}
    inplace = ((0, 0),)

    def infer(self, node, ins):
        ratio = self.attr(node, "ratio")
        if not 0 <= ratio < 1:
            raise ShapeError(f"ratio {ratio} must be in [0, 1)")
        return [(ins[0].shape, ins[0].dtype), (ins[0].shape, np.bool_)]

    def is_view(self, node):
        return not self._random(node)

    def gradient(self, b, node, dys):
        """dY where the mask kept a value, scaled as the forward pass scaled it; dY itself in inference."""
        if not self._random(node):
            return [dys[0]]
        x, mask = node.inputs[0], node.outputs[1]
        keep = b.op("Cast", mask, to=dtypes.to_onnx(b.dtype(x)))
        return [b.op("Mul", dys[0], b.op("Mul", keep, b.const(1 / (1 - self.attr(node, "ratio")), x)))]

    def fold(self, node, ins):
        return None if self._random(node) else super().fold(node, ins)

    def evaluate(self, node, x):
        if not self._random(node):
            return [x, np.ones(x.shape, bool)]
        ratio = self.attr(node, "ratio")
        mask = np.random.RandomState(self.attr(node, "seed")).uniform(0, 1, x.shape) >= ratio
        return [(mask * x / (1 - ratio)).astype(x.dtype), mask]

    def training_form(self, node, step):
        """memplan.Dropout, drawing a fresh mask each step (kept for backward); the node itself with ratio 0."""
        if not self.attr(node, "ratio"):
            return node
        mask = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] else f"{node.outputs[0]}/mask"
        step.tensors.setdefault(mask, Tensor(mask, None, None, "activation"))
        seed = node.attrs.get("seed")
        return replace(node, op="Dropout", domain="memplan", inputs=(node.inputs[0], step.counter),
                       outputs=(node.outputs[0], mask),
                       attrs={"ratio": node.attrs.get("ratio", 0.5), "seed": step.index if seed is None else seed})

    def _random(self, node):
        return bool(self.attr(node, "training_mode")) and self.attr(node, "ratio") != 0

    def torch_node(self, torch, run, node, ins):
        """Y and the mask of kept values: at random in training, all kept in inference."""
        x, ratio = ins[0], self.attr(node, "ratio")
        if not run.training_mode(node) or ratio == 0:
            return [x, torch.ones_like(x, dtype=torch.bool)]
        keep = torch.rand_like(x) >= ratio
        return [x * keep / (1 - ratio), keep]


@schema("Dropout", domain="memplan")
class StepDropout(Dropout):
    """Dropout in a training step: inputs (X, step), a fresh mask each step, drawn by hashing
    (seed, step, element index) (dropout_keep), so that it needs no generator state and the
    CPU and the GPU draw the same mask. Outputs (Y, mask); the mask is kept for backward."""

    torch_node = None  # its hashed mask is memplan's own
    attr_inputs = ()
    defaults = {"ratio": 0.5, "seed": 0}
    types = (("T", "S"), {"T": FLOATS, "S": FLOATS})

    def infer(self, node, ins):
        if ins[1].shape != ():
            raise ShapeError(f"step must be a scalar, got shape {ins[1].shape}")
        return super().infer(node, ins[:1])

    def _random(self, node):
        return True

    def gradient(self, b, node, dys):
        return [*super().gradient(b, node, dys), None]

    def evaluate(self, node, x, step):
        mask = dropout_keep(np, x.size, self.attr(node, "seed"), float(step), self.attr(node, "ratio")).reshape(x.shape)
        return [(mask * x / (1 - self.attr(node, "ratio"))).astype(x.dtype), mask]

    def fold(self, node, ins):
        return None


def dropout_key(seed, step):
    """The 32-bit key of one step's mask."""
    return (int(seed) * 0x9E3779B9 + int(step) * 0x85EBCA6B) & 0xFFFFFFFF


def dropout_keep(xp, size, seed, step, ratio):
    """The keep mask of `size` elements: murmur3's 32-bit finaliser of (index ^ key) at or above
    ratio * 2^32 (the GPU kernel computes the same)."""
    h = xp.arange(size, dtype=np.uint32) ^ np.uint32(dropout_key(seed, step))
    mix(xp, h, xp.empty_like(h))
    return h >= np.uint32(min(int(ratio * 2**32), 2**32 - 1))


def mix(xp, h, spare):
    """murmur3's 32-bit finaliser of the uint32 array h, in place (spare: scratch of h's shape)."""
    for shift, multiplier in ((16, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)):
        xp.right_shift(h, np.uint32(shift), out=spare)
        xp.bitwise_xor(h, spare, out=h)
        if multiplier:
            xp.multiply(h, np.uint32(multiplier), out=h)
