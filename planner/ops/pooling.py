"""Pools beyond the average and max ones of planner/ops/nn.py: LRN, LpPool and GlobalLpPool as composites of
the ops memplan has (narrow floats summed in float32), MaxUnpool, whose kernel puts values at indices, and
MaxRoiPool, the max of each bin of regions read from a tensor."""
import math

import numpy as np

from .registry import get, register, schema
from .base import Layout, Schema, constant_shape, no_flops
from .composite import Composite
from .nn import WINDOW, window
from ..errors import ShapeError


def _powered(b, x, p):
    """|x| ** p, by the cheapest ops for the usual p."""
    if p == 1:
        return b.op("Abs", x)
    if p == 2:
        return b.op("Mul", x, x)
    return b.op("Pow", b.op("Abs", x), b.const(p, x))


def _root(b, s, p):
    """s ** (1 / p)."""
    if p == 1:
        return s
    if p == 2:
        return b.op("Sqrt", s)
    return b.op("Pow", s, b.const(1 / p, s))


class Pool(Composite):
    """A composite over (N, C, spatial...) taking the p-norm of windows, whose output shape follows the
    rule of the pool named `like`."""

    arity = None
    ranks = "same"
    like = None

    def infer(self, node, ins):
        if self.attr(node, "p") < 1:
            raise ShapeError(f"p {self.attr(node, 'p')} must be at least 1")
        return get(self.like).infer(node, ins)


class LpPool(Pool):
    """LpPool: the p-norm of each window, padding counting as zeros; the sums are a Conv with a ones
    kernel over the input's images and channels folded into its batch, its end padding widened to hold
    the windows ceil_mode adds."""

    like = "AveragePool"

    def __init__(self):
        super().__init__("LpPool", self.parts_of, {**WINDOW, "kernel_shape": None, "ceil_mode": 0, "p": 2})

    def parts_of(self, b, node, x, kernel_shape, p, **rest):
        xs, ys = b.shape(x), b.shape(node.outputs[0])
        win = window(self, node, xs[2:], kernel_shape, ys[2:])
        end = [max(0, (o - 1) * s + (k - 1) * d + 1 - i - start)
               for o, s, k, d, i, start in zip(ys[2:], win.strides, kernel_shape, win.dilations, xs[2:], win.begin)]
        folded = b.op("Reshape", _powered(b, x, p), shape=[xs[0] * xs[1], 1, *xs[2:]])
        ones = np.ones(constant_shape(node, "its kernel of ones", 1, 1, *kernel_shape))
        sums = b.op("Conv", folded, b.const(ones, x), strides=list(win.strides),
                    dilations=list(win.dilations), pads=[*win.begin, *end])
        return _root(b, b.op("Reshape", sums, shape=list(ys)), p)


def _global_lp_pool(b, node, x, p):
    return _root(b, b.op("ReduceSum", _powered(b, x, p), axes=list(range(2, len(b.shape(x)))), keepdims=1), p)


class LRN(Composite):
    """LRN: x / (bias + alpha / size * the sum of squares over `size` channels about x's) ** beta. The sums
    are an AveragePool over the channels (padding counted, so each mean is the sum over size)."""

    arity = None
    ranks = "same"

    def infer(self, node, ins):
        x, size = ins[0], self.attr(node, "size")
        if x.rank < 2:
            raise ShapeError(f"input of shape {x.shape} has no channel dim")
        if size < 1:
            raise ShapeError(f"size {size} must be at least 1")
        return [(x.shape, x.dtype)]


def _lrn(b, node, x, alpha, beta, bias, size):
    shape = list(b.shape(x))
    if not shape[1]:  # no channels: no window to average (the pool would refuse it), nothing to scale
        return b.op("Identity", x)
    squares = b.op("Reshape", b.op("Mul", x, x), shape=[shape[0], 1, shape[1], math.prod(shape[2:])])
    before = (size - 1) // 2
    means = b.op("AveragePool", squares, kernel_shape=[size, 1], pads=[before, 0, size - 1 - before, 0],
                 count_include_pad=1)
    scale = b.op("Pow", b.op("Add", b.op("Mul", means, b.const(alpha, x)), b.const(bias, x)), b.const(beta, x))
    return b.op("Div", x, b.op("Reshape", scale, shape=shape))


def _unpooled(shape, kernel_shape, strides, pads):
    """The shape a MaxPool of `kernel_shape`, `strides` and `pads` read to give `shape`: per spatial dim
    (size - 1) * stride - pads + kernel."""
    n = len(kernel_shape)
    strides, pads = strides or [1] * n, pads or [0] * 2 * n
    return (*shape[:2], *((i - 1) * s - b - e + k
                          for i, s, b, e, k in zip(shape[2:], strides, pads, pads[n:], kernel_shape)))


@schema("MaxUnpool")
class MaxUnpool(Schema):
    """MaxUnpool: zeros of the shape a MaxPool read, with X's values put at the flat positions its Indices
    give; output_shape, when given, holds that shape at its start (extra zeros after each dim)."""

    ranks = "same"
    attr_inputs = (("output_shape", 2, 9),)
    defaults = {"kernel_shape": None, "strides": None, "pads": None, "output_shape": None}
    flops = staticmethod(no_flops)

    def unpooled(self, node, shape):
        return _unpooled(shape, *(self.attr(node, k) for k in ("kernel_shape", "strides", "pads")))

    def infer(self, node, ins):
        x, indices = ins[:2]
        kernel, n = self.attr(node, "kernel_shape"), x.rank - 2
        strides, pads = self.attr(node, "strides") or [1] * n, self.attr(node, "pads") or [0] * 2 * n
        if n < 1 or (len(kernel), len(strides), len(pads)) != (n, n, 2 * n):
            raise ShapeError(f"kernel_shape {tuple(kernel)}, strides or pads do not match the input {x.shape}")
        if min(kernel) < 1 or min(strides) < 1 or min(pads) < 0:
            raise ShapeError(f"kernel_shape {tuple(kernel)} and strides {tuple(strides)} must be at least 1 "
                             f"and pads {tuple(pads)} non-negative")
        if indices.shape != x.shape:
            raise ShapeError(f"indices of shape {indices.shape} must have the input's shape {x.shape}")
        unpooled = self.unpooled(node, x.shape)
        out = tuple(self.attr(node, "output_shape") or unpooled)
        if min(unpooled) < 0 or len(out) != x.rank or out[:2] != x.shape[:2] or \
                any(o < u for o, u in zip(out, unpooled)):
            raise ShapeError(f"output_shape {out} must hold the unpooled shape {unpooled}")
        return [(out, x.dtype)]

    def workspace(self, node, ins, outs, limit):
        """Where output_shape is larger than the unpooled shape: `flat`, the indices moved to the output's
        flat positions, and `term`, one term of that move, each int64 of the input's shape."""
        if tuple(outs[0][0]) == self.unpooled(node, ins[0].shape):
            return Layout()
        return Layout.pack(("flat", ins[0].shape, np.int64), ("term", ins[0].shape, np.int64))

    def kernel(self, xp, step, ins, outs, ws):
        """Zeros, then one put of X at its indices (moved first where output_shape is larger), checked to
        lie in the unpooled shape (IndexError naming the index)."""
        x, indices, y = ins[0], ins[1], outs[0]
        y.fill(0)
        if not x.size:
            return
        unpooled = self.unpooled(step, x.shape)
        size = math.prod(unpooled)
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= size:
            raise IndexError(f"index {low if low < 0 else high} is out of bounds for the {size} positions of the "
                             f"unpooled shape {unpooled}")
        if "flat" in ws:
            indices = self.moved(xp, indices, unpooled, y.shape, ws["flat"], ws["term"])
        xp.put(y.reshape(-1), indices.reshape(-1), x.reshape(-1), mode="wrap")  # in range already

    @staticmethod
    def moved(xp, indices, unpooled, shape, flat, term):
        """Flat positions in the unpooled shape as flat positions of `shape`, which holds it at its start:
        each step along dim d passes (shape[d + 1] - unpooled[d + 1]) * prod(shape[d + 2:]) more positions
        than in the unpooled shape, and indices // prod(unpooled[d + 1:]) steps are taken along dims to d."""
        xp.copyto(flat, indices)
        for d in range(len(shape) - 1):
            extra = (shape[d + 1] - unpooled[d + 1]) * math.prod(shape[d + 2:])
            if extra:
                xp.floor_divide(indices, math.prod(unpooled[d + 1:]), out=term)
                xp.multiply(term, extra, out=term)
                xp.add(flat, term, out=flat)
        return flat

    def gradient(self, b, node, dys):
        """dY at each index: a Gather from dY flattened (cut to the unpooled shape first where larger)."""
        x, indices = node.inputs[:2]
        dy, unpooled = dys[0], self.unpooled(node, b.shape(x))
        if tuple(b.shape(node.outputs[0])) != unpooled:
            dy = b.op("Slice", dy, starts=[0] * len(unpooled), ends=list(unpooled), axes=list(range(len(unpooled))))
        return [b.op("Gather", b.op("Reshape", dy, shape=[-1]), indices, axis=0), None]

    def torch(self, torch, x, indices, kernel_shape, strides, pads, output_shape):
        """A scatter into zeros of the unpooled shape, set at the start of output_shape's zeros when given."""
        shape = _unpooled(x.shape, kernel_shape, strides, pads)
        y = x.new_zeros(math.prod(shape)).scatter(0, indices.reshape(-1), x.reshape(-1)).reshape(shape)
        if not output_shape:
            return y
        out = x.new_zeros(output_shape)
        out[tuple(slice(0, n) for n in shape)] = y
        return out


@schema("MaxRoiPool")
class MaxRoiPool(Schema):
    """MaxRoiPool: Y[r, c] (pooled_shape) the largest value of each bin of X[rois[r, 0], c] in the region
    rois[r, 1:] = (x1, y1, x2, y2) times spatial_scale, rounded to pixels (both ends in); bin (i, j) spans
    floor(i * size / pooled) to ceil((i + 1) * size / pooled) of it, in float32, clipped to the image,
    and is 0 where that leaves it empty: Caffe's ROI pooling, as torchvision and onnxruntime compute it
    (onnxruntime starts each bin's max at FLT_MIN, so it differs where a whole bin is negative).

    The rois are read on the host (their values place the bins); one reduction per bin over all channels."""

    ranks = "same"
    mirror = False
    defaults = {"pooled_shape": None, "spatial_scale": 1.0}

    def infer(self, node, ins):
        x, rois = ins
        pooled = self.attr(node, "pooled_shape")
        if len(pooled) != 2 or min(pooled) < 1:
            raise ShapeError(f"pooled_shape {tuple(pooled)} must be two positive sizes")
        if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 5 or rois.dtype != x.dtype:
            raise ShapeError(f"X {x.shape} must be (N, C, H, W) and rois {rois.shape} (R, 5) of its dtype")
        return [((rois.shape[0], x.shape[1], *pooled), x.dtype)]

    def flops(self, node, ins, outs):
        """At most one comparison per value of the image, per roi."""
        return ins[1].shape[0] * math.prod(ins[0].shape[1:])

    def bins(self, step, box, sizes):
        """Per axis (rows, then columns), each bin's [start, end) in the image for one roi's (x1, y1, x2, y2)."""
        scale = np.float32(self.attr(step, "spatial_scale"))
        corners = np.float32(box) * scale
        x1, y1, x2, y2 = (int(np.copysign(np.floor(np.abs(v) + 0.5), v)) for v in corners.tolist())  # C's round
        out = []
        for start, end, pooled, size in zip((y1, x1), (y2, x2), self.attr(step, "pooled_shape"), sizes):
            step_size = np.float32(max(end - start + 1, 1)) / np.float32(pooled)
            edges = np.arange(pooled + 1, dtype=np.float32) * step_size
            lows, highs = (np.clip(f(e) + start, 0, size).astype(int).tolist() for f, e in
                           ((np.floor, edges[:-1]), (np.ceil, edges[1:])))
            out.append(list(zip(lows, highs)))
        return out

    def kernel(self, xp, step, ins, outs, ws):
        x, rois = ins
        y = outs[0]
        for r, (batch, *box) in enumerate((rois if xp is np else xp.asnumpy(rois)).tolist()):
            if not 0 <= int(batch) < x.shape[0]:
                raise IndexError(f"batch index {int(batch)} of roi {r} is out of range for {x.shape[0]} images")
            rows, cols = self.bins(step, box, x.shape[2:])
            for i, (h0, h1) in enumerate(rows):
                for j, (w0, w1) in enumerate(cols):
                    if h1 <= h0 or w1 <= w0:
                        y[r, :, i, j].fill(0)
                    else:
                        xp.max(x[int(batch), :, h0:h1, w0:w1], axis=(1, 2), out=y[r, :, i, j])

    def torch(self, torch, x, rois, pooled_shape, spatial_scale):
        """torchvision's roi_pool, which reads rois as (batch index, x1, y1, x2, y2) too."""
        from torchvision.ops import roi_pool
        return roi_pool(x, rois, list(pooled_shape), spatial_scale)


register(LpPool())
register(Pool("GlobalLpPool", _global_lp_pool, {"p": 2}, like="GlobalAveragePool"))
register(LRN("LRN", _lrn, {"alpha": 1e-4, "beta": 0.75, "bias": 1.0, "size": None}))
