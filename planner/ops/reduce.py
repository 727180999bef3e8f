"""Reductions over a set of axes, one entry each: ReduceSum, ReduceMean, ReduceMax, ReduceMin and
ReduceProd compute with one NumPy/CuPy reduction into the output; ReduceSumSquare, ReduceL1, ReduceL2,
ReduceLogSum and ReduceLogSumExp are composites of those (planner/ops/composite.py)."""
import math
import warnings

import numpy as np

from .registry import register
from .base import Schema, axis, no_gradient, per_input_element
from .composite import Composite
from .torch_forms import unsupported
from ..dtypes import to_onnx


def max_gradient(b, x, y, dy, axes):
    """The input gradient of a maximum (or minimum) `y` of `x` over `axes` (y and dy keeping them): dY
    shared evenly by the elements equal to the extreme."""
    hit = b.op("Cast", b.op("Equal", x, y), to=to_onnx(b.dtype(x)))
    return b.op("Mul", hit, b.op("Div", dy, b.op("ReduceSum", hit, axes=axes, keepdims=1)))


def _extreme_identity(dtype, lowest):
    """The value of a max (lowest) or min (highest) over an empty set, as ONNX gives it."""
    if dtype == bool:
        return not lowest
    if dtype.kind in "iu":
        return np.iinfo(dtype).min if lowest else np.iinfo(dtype).max
    return -np.inf if lowest else np.inf


class AxesRule(Schema):
    """What every reduction shares: `axes` (all when empty, or none with noop_with_empty_axes), an
    attribute before opset 18 (13 for ReduceSum) and an input after, and `keepdims`."""

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

    def reduced_axes(self, node, rank):
        """The reduced axes, sorted; None when the op leaves its input as it is."""
        axes = self.attr(node, "axes")
        if not axes:
            return None if self.attr(node, "noop_with_empty_axes") else tuple(range(rank))
        return tuple(sorted({axis(a, rank) for a in axes}))


class Reduction(AxesRule):
    """A reduction by the array module's `fn` ("sum", "mean", "max", ...); `empty(dtype)` is its value
    over an empty set where the array module has none; `grad(b, node, x, kept_shape, dy_kept, axes)`
    the input's gradient from dY with the reduced axes kept, or None for no gradient."""

    def __init__(self, op, fn, grad=None, empty=None, axes_since=18, autocast=None):
        self.op, self.fn, self.grad, self.empty, self.autocast = op, fn, grad, empty, autocast
        self.attr_inputs = (("axes", 1, axes_since),)

    def evaluate(self, node, x):
        axes = self.reduced_axes(node, x.ndim)
        if axes is None:
            return [x]
        keep = bool(self.attr(node, "keepdims"))
        extra = {} if self.empty is None else {"initial": self.empty(x.dtype)}
        with warnings.catch_warnings():  # the mean of an empty set is NaN (ONNX leaves it undefined); no warning
            warnings.simplefilter("ignore", RuntimeWarning)
            return [np.asarray(getattr(np, self.fn)(x, axes, keepdims=keep, **extra)).astype(x.dtype)]

    def kernel(self, xp, step, ins, outs, ws):
        """The output is seen with the reduced axes kept (size 1), so one `out=` call fills it; sums,
        means and products of 16-bit floats accumulate in float32 (a bfloat16 sum of ones stops at
        256). An empty input and an integer mean (whose sum would wrap in the output's dtype) take the
        NumPy form on the host."""
        x, y = ins[0], outs[0]
        axes = self.reduced_axes(step, x.ndim)
        if axes is None:
            xp.copyto(y, x)
        elif x.size == 0 or self.fn == "mean" and y.dtype.kind in "biu":
            self.evaluate_into(xp, step, ins, outs)
        else:
            kept = y if self.attr(step, "keepdims") else y.reshape([1 if k in axes else d for k, d in enumerate(x.shape)])
            wide = self.accumulation(x.dtype)
            extra = {"dtype": wide} if wide != x.dtype and self.fn in ("sum", "mean", "prod") else {}
            getattr(xp, self.fn)(x, axis=axes, keepdims=True, out=kept, **extra)

    def gradient(self, b, node, dys):
        if self.grad is None:
            return [no_gradient(node)]
        x, dy = node.inputs[0], dys[0]
        shape = b.shape(x)
        axes = self.reduced_axes(node, len(shape))
        if axes is None:
            return [dy]
        kept_shape = [1 if k in axes else d for k, d in enumerate(shape)]
        return [self.grad(b, node, x, kept_shape, b.op("Reshape", dy, shape=kept_shape), axes)]

    def torch_node(self, torch, run, node, ins):
        x = ins[0]
        axes = self.reduced_axes(node, x.ndim)
        if axes is None:
            return x
        if self.fn in ("max", "min") and not x.numel():
            raise unsupported(f"{node.op} with an empty input")
        keep = bool(self.attr(node, "keepdims"))
        if self.fn == "prod":  # torch.prod takes one dim: from the last
            for d in reversed(axes):
                x = torch.prod(x, d, keepdim=keep)
            return x
        return getattr(torch, {"max": "amax", "min": "amin"}.get(self.fn, self.fn))(x, dim=axes, keepdim=keep)


def _spread(b, node, x, kept_shape, dy, axes):
    """Sum: dY spread back over the reduced axes."""
    return b.op("Expand", dy, shape=list(b.shape(x)))


def _mean_spread(b, node, x, kept_shape, dy, axes):
    """Mean: dY spread back and divided by the count of the reduced elements."""
    shape = b.shape(x)
    spread = b.op("Expand", dy, shape=list(shape))
    return b.op("Mul", spread, b.const(1 / max(math.prod(shape[a] for a in axes), 1), x))


def _extreme(b, node, x, kept_shape, dy, axes):
    """Max and min: see `max_gradient`."""
    return max_gradient(b, x, b.op("Reshape", node.outputs[0], shape=kept_shape), dy, list(axes))


register(Reduction("ReduceSum", "sum", _spread, axes_since=13, autocast="float32"))
register(Reduction("ReduceMean", "mean", _mean_spread))
register(Reduction("ReduceMax", "max", _extreme, empty=lambda dtype: _extreme_identity(dtype, lowest=True)))
register(Reduction("ReduceMin", "min", _extreme, empty=lambda dtype: _extreme_identity(dtype, lowest=False)))
register(Reduction("ReduceProd", "prod", autocast="float32"))


class ReductionOf(AxesRule, Composite):
    """A reduction made of others (`parts(b, node, x, axes, keepdims, noop)` with the node's attributes),
    computed in float32 for narrow floats like every composite."""

    autocast = "float32"
    ranks = None
    arity = None

    def __init__(self, op, parts):
        self.op, self.parts = op, parts


def _reduce(b, op, x, axes, keepdims, noop_with_empty_axes):
    return b.op(op, x, axes=axes, keepdims=keepdims, noop_with_empty_axes=noop_with_empty_axes)


def _sum_square(b, node, x, **attrs):
    return _reduce(b, "ReduceSum", b.op("Mul", x, x), **attrs)


def _l1(b, node, x, **attrs):
    return _reduce(b, "ReduceSum", b.op("Abs", x), **attrs)


def _l2(b, node, x, **attrs):
    return b.op("Sqrt", _sum_square(b, node, x, **attrs))


def _log_sum(b, node, x, **attrs):
    return b.op("Log", _reduce(b, "ReduceSum", x, **attrs))


def _log_sum_exp(b, node, x, keepdims, **attrs):
    """max + log(sum(exp(x - max))): no exponential overflows."""
    top = _reduce(b, "ReduceMax", x, keepdims=1, **attrs)
    total = _reduce(b, "ReduceSum", b.op("Exp", b.op("Sub", x, top)), keepdims=keepdims, **attrs)
    return b.op("Add", b.op("Log", total), top if keepdims else _reduce(b, "ReduceMax", x, keepdims=0, **attrs))


for _op, _parts in (("ReduceSumSquare", _sum_square), ("ReduceL1", _l1), ("ReduceL2", _l2),
                    ("ReduceLogSum", _log_sum), ("ReduceLogSumExp", _log_sum_exp)):
    register(ReductionOf(_op, _parts))
