"""Reductions over a set of axes: ReduceSum, ReduceMean, ReduceMax."""
import math

import numpy as np

from . import schema
from .base import Schema, axis, per_input_element
from ..dtypes import to_onnx


def _max(x, axes, keepdims):
    """np.max with ONNX's value on an empty set: the dtype's lowest value (-inf, False, ...)."""
    lowest = False if x.dtype == bool else np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    return np.max(x, axes, keepdims=keepdims, initial=lowest)


def max_gradient(b, x, y, dy, axes):
    """The input gradient of a maximum `y` of `x` over `axes` (y and dy keeping them): dY shared evenly
    by the elements equal to the maximum."""
    hit = b.op("Cast", b.op("Equal", x, y), to=to_onnx(b.dtype(x)))
    return b.op("Mul", hit, b.op("Div", dy, b.op("ReduceSum", hit, axes=axes, keepdims=1)))


REDUCERS = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": _max}


@schema("ReduceMean", "ReduceMax")
class Reduce(Schema):
    """Reduce over `axes` (all when empty, or nothing when noop_with_empty_axes); an attribute
    before opset 18, an input after."""

    attr_inputs = (("axes", 1, 18),)
    defaults = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}
    flops = per_input_element(1)

    def infer(self, node, ins):
        x = ins[0]
        axes = self.reduced_axes(node, x.rank)
        if axes is None:
            return [(x.shape, x.dtype)]
        keep = self.attr(node, "keepdims")
        return [(tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes), x.dtype)]

    def evaluate(self, node, x):
        axes = self.reduced_axes(node, x.ndim)
        if axes is None:
            return [x]
        return [np.asarray(REDUCERS[self.op](x, axes, keepdims=bool(self.attr(node, "keepdims")))).astype(x.dtype)]

    def gradient(self, b, node, dys):
        """Sum and mean spread dY back over the reduced axes (mean divides by their size); max, see
        `max_gradient`."""
        x, dy = node.inputs[0], dys[0]
        shape = b.shape(x)
        axes = self.reduced_axes(node, len(shape))
        if axes is None:
            return [dy]
        kept_shape = [1 if k in axes else d for k, d in enumerate(shape)]
        kept = b.op("Reshape", dy, shape=kept_shape)
        if self.op == "ReduceMax":
            return [max_gradient(b, x, b.op("Reshape", node.outputs[0], shape=kept_shape), kept, list(axes))]
        spread = b.op("Expand", kept, shape=list(shape))
        if self.op == "ReduceMean":
            spread = b.op("Mul", spread, b.const(1 / max(math.prod(shape[a] for a in axes), 1), x))
        return [spread]

    def reduced_axes(self, node, rank):
        """The reduced axes, sorted; None when the op leaves its input as it is."""
        axes = self.attr(node, "axes")
        if not axes:
            return None if self.attr(node, "noop_with_empty_axes") else tuple(range(rank))
        return tuple(sorted({axis(a, rank) for a in axes}))


@schema("ReduceSum")
class ReduceSum(Reduce):
    """ReduceSum: like the others, but `axes` became an input already in opset 13."""

    attr_inputs = (("axes", 1, 13),)
