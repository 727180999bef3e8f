"""Normalisations made of reductions and elementwise ops (composites, planner/ops/composite.py):
InstanceNormalization, GroupNormalization, RMSNormalization, MeanVarianceNormalization and
LpNormalization. Statistics of narrow floats are taken in float32, as every composite computes."""
import math

from .registry import register
from .base import axis as to_axis, normalised_dims, same_as_input
from .composite import Composite
from ..errors import ShapeError


class Normalization(Composite):
    """A normalisation: the output has the input's shape and dtype; its other inputs are weights,
    one per channel (dim 1) where `per_channel`."""

    arity = None
    per_channel = False
    from_axis = False

    def infer(self, node, ins):
        x, *weights = ins
        if self.per_channel:
            if x.rank < 2:
                raise ShapeError(f"the input must have a channel dim (rank 2 or more), got shape {x.shape}")
            for w in filter(None, weights):
                if w.shape != (x.shape[1],):
                    raise ShapeError(f"scale and bias must have one value per channel, shape ({x.shape[1]},); "
                                     f"got {w.shape}")
        if "num_groups" in self.defaults:
            groups = self.attr(node, "num_groups")
            if not groups or x.shape[1] % groups:
                raise ShapeError(f"num_groups {groups} must divide the {x.shape[1]} channels")
        if self.from_axis:
            normalised_dims(x.shape, to_axis(self.attr(node, "axis"), x.rank))
        return same_as_input(node, ins)


def _per_channel(b, weight, rank):
    """A (C,) weight shaped to broadcast along dim 1 of a rank-`rank` input."""
    return b.op("Reshape", weight, shape=[-1] + [1] * (rank - 2))


def _standardised(b, x, axes, epsilon, like=None):
    """(x - mean) / sqrt(variance + epsilon), the statistics over `axes`; `like` a tensor of x's dtype
    where x is new (the Builder types new tensors later)."""
    mean = b.op("ReduceMean", x, axes=axes, keepdims=1)
    centred = b.op("Sub", x, mean)
    variance = b.op("ReduceMean", b.op("Mul", centred, centred), axes=axes, keepdims=1)
    return b.op("Div", centred, b.op("Sqrt", b.op("Add", variance, b.const(epsilon, like or x))))


def _instance(b, node, x, scale, bias, epsilon):
    rank = len(b.shape(x))
    y = _standardised(b, x, list(range(2, rank)), epsilon)
    return b.op("Add", b.op("Mul", y, _per_channel(b, scale, rank)), _per_channel(b, bias, rank))


def _group(b, node, x, scale, bias, epsilon, num_groups, stash_type):
    shape = list(b.shape(x))
    grouped = b.op("Reshape", x, shape=[shape[0], num_groups, math.prod(shape[1:]) // num_groups])
    y = b.op("Reshape", _standardised(b, grouped, [2], epsilon, like=x), shape=shape)
    return b.op("Add", b.op("Mul", y, _per_channel(b, scale, len(shape))), _per_channel(b, bias, len(shape)))


def _rms(b, node, x, scale, axis, epsilon, stash_type):
    rank = len(b.shape(x))
    axes = list(range(to_axis(axis, rank), rank))
    mean_square = b.op("ReduceMean", b.op("Mul", x, x), axes=axes, keepdims=1)
    y = b.op("Div", x, b.op("Sqrt", b.op("Add", mean_square, b.const(epsilon, x))))
    return b.op("Mul", y, scale)


def _mean_variance(b, node, x, axes):
    """As ONNX's function body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)."""
    mean = b.op("ReduceMean", x, axes=axes, keepdims=1)
    mean_of_square = b.op("ReduceMean", b.op("Mul", x, x), axes=axes, keepdims=1)
    deviation = b.op("Sqrt", b.op("Sub", mean_of_square, b.op("Mul", mean, mean)))
    return b.op("Div", b.op("Sub", x, mean), b.op("Add", deviation, b.const(1e-9, x)))


def _lp(b, node, x, axis, p):
    axes = [to_axis(axis, len(b.shape(x)))]
    if p == 1:
        norm = b.op("ReduceSum", b.op("Abs", x), axes=axes, keepdims=1)
    else:
        norm = b.op("Sqrt", b.op("ReduceSum", b.op("Mul", x, x), axes=axes, keepdims=1))
    zero = b.op("Equal", norm, b.const(0, x))
    return b.op("Div", x, b.op("Where", zero, b.const(1, x), norm))  # a zero vector stays zero


class LpNormalization(Normalization):
    """LpNormalization: the L1 or L2 norm (p 1 or 2) along one axis."""

    def infer(self, node, ins):
        if self.attr(node, "p") not in (1, 2):
            raise ShapeError(f"p must be 1 or 2, got {self.attr(node, 'p')}")
        to_axis(self.attr(node, "axis"), ins[0].rank)
        return super().infer(node, ins)


EPSILON = 9.999999747378752e-06
"""ONNX's default epsilon, 1e-5 as a float32 attribute."""

register(Normalization("InstanceNormalization", _instance, {"epsilon": EPSILON}, per_channel=True))
register(Normalization("GroupNormalization", _group, {"epsilon": EPSILON, "num_groups": None, "stash_type": 1},
                       since=21, per_channel=True))
register(Normalization("RMSNormalization", _rms, {"axis": -1, "epsilon": EPSILON, "stash_type": 1}, from_axis=True))
register(Normalization("MeanVarianceNormalization", _mean_variance, {"axes": [0, 2, 3]}))
register(LpNormalization("LpNormalization", _lp, {"axis": -1, "p": 2}))
