"""Normalisations: BatchNormalization and LayerNormalization (their kernels in executor/kernels/nn.py), and those
made of reductions and elementwise ops (composites, planner/ops/composite.py): InstanceNormalization,
GroupNormalization, RMSNormalization, MeanVarianceNormalization and LpNormalization, whose statistics of narrow
floats are taken in float32, as every composite computes."""
import math
from dataclasses import replace

from .registry import register, schema
from .base import Layout, Schema, broadcast, no_gradient, normalised_dims, per_input_element, same_as_input
from .base import axis as to_axis
from .composite import Composite
from .fused_norm import layer_norm_gradient
from ..dtypes import from_onnx
from ..errors import ShapeError
from ..ir import Tensor


class Normalization(Composite):
    """A normalisation: the output has the input's shape and dtype; its other inputs are weights,
    one per channel (dim 1) where `per_channel`."""

    autocast = "float32"
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


def _one_per_channel(x, *params):
    """Check that each of `params` (Infos or None) is one value per channel of x."""
    for p in params:
        if p is not None and p.shape != (x.shape[1],):
            raise ShapeError(f"parameter of shape {p.shape} must be ({x.shape[1]},), one per channel of {x.shape}")


def _normalised_gradient(b, x, dy, scale, axes, eps):
    """For y = x^ scale + bias, x^ = (x - mean) / sqrt(var + eps) with the statistics taken over
    `axes` of x itself: dx = (g - mean(g) - x^ mean(g x^)) / std where g = dy scale, and dy x^, which
    summed to the scale's shape is its gradient."""
    def mean(t):
        return b.op("ReduceMean", t, axes=axes, keepdims=1)

    centred = b.op("Sub", x, mean(x))
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean(b.op("Mul", centred, centred)), b.const(eps, x))))
    xhat = b.op("Mul", centred, inv)
    g = b.op("Mul", dy, scale)
    dx = b.op("Mul", inv, b.op("Sub", b.op("Sub", g, mean(g)), b.op("Mul", xhat, mean(b.op("Mul", g, xhat)))))
    return dx, b.op("Mul", dy, xhat)


@schema("BatchNormalization")
class BatchNormalization(Schema):
    """BatchNormalization: Y, then running mean and variance (training_mode=1, or opset < 14),
    then the saved batch mean and variance (opset < 14), each one value per channel."""

    statistics = (3, 4)
    autocast = "input"
    ranks = "same"
    defaults = {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}
    inplace = ((0, 0),)
    flops = per_input_element(5)

    def workspace(self, node, ins, outs, limit):
        """Inference needs none. Training (training_mode=1, or statistics outputs asked for) keeps the
        batch mean and variance and, to sum the squares without a temporary, one partial sum per
        image and channel: `mean` and `var` (C,), `partial` (N, C, 1, 1), in X's accumulation dtype
        (float32 for 16-bit floats)."""
        x = ins[0]
        if not (self.attr(node, "training_mode") or any(o is not None for o in outs[1:])):
            return Layout()
        n, c = x.shape[:2]
        acc = self.accumulation(x.dtype)
        return Layout.pack(("mean", (c,), acc), ("var", (c,), acc), ("partial", (n, c, 1, 1), acc))

    def gradient(self, b, node, dys):
        """Through Y, with the batch statistics in training (where the running mean and variance do
        not reach Y) and the running ones in inference."""
        x, scale, bias, mean, var = node.inputs
        shape = b.shape(x)
        per_channel = [1, shape[1], *(1 for _ in shape[2:])]
        axes = [0, *range(2, len(shape))]
        eps = self.attr(node, "epsilon")
        given, work = b.dtype(x), self.accumulation(b.dtype(x))

        def widened(t, dtype):
            return t if dtype == work else b.cast(t, work)

        def channels(p):
            """A per-channel input broadcast against X, in the working dtype."""
            return b.op("Reshape", widened(p, b.dtype(p)), shape=per_channel)

        def summed(t, p):
            """The gradient of per-channel input `p`, summed in p's dtype."""
            return b.op("ReduceSum", t if b.dtype(p) == work else b.cast(t, b.dtype(p)), axes=axes, keepdims=0)

        x, dy = widened(x, given), widened(dys[0], given)
        scale_b = channels(scale)
        if self.attr(node, "training_mode"):
            dx, dy_xhat = _normalised_gradient(b, x, dy, scale_b, axes, eps)
            return [dx if work == given else b.cast(dx, given), summed(dy_xhat, scale), summed(dy, bias), None, None]
        inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", channels(var), b.const(eps, x))))
        centred = b.op("Sub", x, channels(mean))
        xhat, g = b.op("Mul", centred, inv), b.op("Mul", dy, scale_b)
        dx = b.op("Mul", g, inv)
        dvar = b.op("Mul", b.op("Mul", g, centred), b.op("Mul", b.op("Mul", inv, b.op("Mul", inv, inv)), b.const(-0.5, x)))
        return [dx if work == given else b.cast(dx, given), summed(b.op("Mul", dy, xhat), scale), summed(dy, bias),
                summed(b.op("Neg", dx), mean), summed(dvar, var)]

    def training_form(self, node, step):
        """On batch statistics (training_mode=1), its running mean and variance written back into their params."""
        outs, ins = [*node.outputs, "", ""][:3], list(node.inputs)
        for k, (stat, suffix) in enumerate(((node.inputs[3], "running_mean"), (node.inputs[4], "running_var")), 1):
            label = f"{node.name or node.outputs[0]}/{suffix}"
            if len(step.graph.consumers.get(stat, ())) > 1 or node.inputs.count(stat) > 1:
                # an exporter merged equal initializers (a running variance of ones and a scale of ones): the
                # statistic written back gets its own copy, so that no other reader sees it change
                stat = ins[2 + k] = f"{label}/own"
                step.tensors[stat] = replace(step.graph.tensors[node.inputs[2 + k]], name=stat)
            if not outs[k]:
                outs[k] = label
                step.tensors[outs[k]] = Tensor(outs[k], None, None, "activation")
            step.updates.append((outs[k], stat))
        return replace(node, inputs=tuple(ins), attrs={**node.attrs, "training_mode": 1},
                       outputs=(*outs, *node.outputs[3:]))

    def torch_node(self, torch, run, node, ins):
        """Y, and in training the updated running mean and variance (written back into the module's buffers
        when they are ones) and the batch's mean and variance."""
        x, scale, bias, mean, var = ins
        eps, f = self.attr(node, "epsilon"), torch.nn.functional
        if not run.training_mode(node):
            return f.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
        dims = [0, *range(2, x.ndim)]
        with torch.no_grad():
            batch_mean, batch_var = x.mean(dims), x.var(dims, unbiased=False)
            momentum = self.attr(node, "momentum")
            new_mean = mean * momentum + batch_mean * (1 - momentum)
            new_var = var * momentum + batch_var * (1 - momentum)
            buffers = run.graph_buffers()
            for name, new in zip(node.inputs[3:5], (new_mean, new_var)):
                if name in buffers:
                    buffers[name].copy_(new)
        return [f.batch_norm(x, None, None, scale, bias, True, 0.0, eps), new_mean, new_var, batch_mean, batch_var]

    def infer(self, node, ins):
        x, scale, bias, mean, var = ins
        if x.rank < 2:
            raise ShapeError(f"input of shape {x.shape} has no channel dim")
        _one_per_channel(x, scale, bias, mean, var)
        stats = [((x.shape[1],), mean.dtype), ((x.shape[1],), var.dtype)]
        return [(x.shape, x.dtype), *stats, *stats]


@schema("LayerNormalization")
class LayerNormalization(Schema):
    """LayerNormalization over the dims from `axis` on; the optional Mean and InvStdDev keep the
    leading dims and have 1 on the normalised ones, in the stash_type dtype."""

    autocast = "float32"
    split = "norm"
    ranks = "same"
    defaults = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    flops = per_input_element(5)

    def stash_dtype(self, node):
        """The dtype of the statistics (Mean, InvStdDev) and of the arithmetic producing them."""
        return from_onnx(self.attr(node, "stash_type"))

    def workspace(self, node, ins, outs, limit):
        """The Mean and InvStdDev the kernel keeps, one per normalised row, for those not among the
        outputs: `mean` first, then `inv_std`."""
        x = ins[0]
        rows = math.prod(x.shape[:to_axis(self.attr(node, "axis"), x.rank)])
        return Layout.pack(*((name, (rows,), self.stash_dtype(node)) if len(outs) <= k or outs[k] is None else None
                             for k, name in ((1, "mean"), (2, "inv_std"))))

    def gradient(self, b, node, dys):
        """One memplan.LayerNormalizationGrad, which recomputes the row statistics from X chunk by chunk
        (no full-size temporary besides dX); no gradient flows from Mean and InvStdDev."""
        x, scale, *bias = node.inputs
        if dys[0] is None:
            return [no_gradient(node)] * 3
        bias = bias[0] if bias and bias[0] else ""
        grads = layer_norm_gradient(b, node, dys[0], x, "", scale, bias)
        return grads if bias else grads[:2]

    def torch_node(self, torch, run, node, ins):
        """Y over the dims from `axis` on, and the Mean and InvStdDev outputs."""
        x, scale, bias = [*ins, None][:3]
        a, eps = self.attr(node, "axis") % x.ndim, self.attr(node, "epsilon")
        normalised = x.shape[a:]
        bias = None if bias is None else bias.expand(normalised)
        y = torch.nn.functional.layer_norm(x, normalised, scale.expand(normalised), bias, eps)
        if len(node.outputs) == 1:
            return y
        dims = tuple(range(a, x.ndim))
        return [y, x.mean(dims, keepdim=True), torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + eps)]

    def infer(self, node, ins):
        x, scale, bias = [*ins, None][:3]
        a = to_axis(self.attr(node, "axis"), x.rank)
        normalised = normalised_dims(x.shape, a)
        for p in (scale, bias):
            if p is not None and broadcast(normalised, p.shape) != normalised:
                raise ShapeError(f"scale or bias of shape {p.shape} does not broadcast to {normalised}")
        stats = ((*x.shape[:a], *(1 for _ in normalised)), self.stash_dtype(node))
        return [(x.shape, x.dtype), stats, stats]
