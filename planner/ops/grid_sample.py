"""GridSample: an image read at the points of a grid, interpolated (nearest, linear, cubic) in any number
of spatial dims; its kernel gathers the taps of a chunk of points at a time from its workspace."""
import itertools
import math

import numpy as np

from .registry import register
from .base import Layout, Schema, constant_shape
from .sampling import front, take_columns, work_dtype
from .shape_ops import scatter_add_flat
from ..errors import ShapeError

CUBIC_A = -0.75
"""The cubic convolution's coefficient, as PyTorch and the ONNX reference take it."""


def reflect(xp, v, low, high, t, mask):
    """v reflected by the nearer border into [low, high] until inside, as PyTorch's grid sampler does;
    `t` three scratch rows like v, `mask` a bool row."""
    span = high - low
    if span <= 0:
        v.fill(low)
        return
    xp.subtract(low, v, out=t[0])
    xp.subtract(v, high, out=t[1])
    xp.maximum(t[0], t[1], out=t[0])  # how far outside
    xp.divide(t[0], span, out=t[1])
    xp.floor(t[1], out=t[1])  # whole spans crossed
    xp.multiply(t[1], span, out=t[2])
    xp.subtract(t[0], t[2], out=t[0])  # what is left of the last span
    xp.fmod(t[1], 2, out=t[1])
    xp.multiply(t[0], -2, out=t[2])
    xp.add(t[2], span, out=t[2])
    xp.multiply(t[2], t[1], out=t[2])
    xp.add(t[2], t[0], out=t[2])  # distance from the border it ends nearest: the rest, or the span less it
    xp.less(v, low, out=mask)
    xp.add(t[2], low, out=t[1])
    xp.copyto(v, t[1], where=mask)
    xp.greater(v, high, out=mask)
    xp.subtract(high, t[2], out=t[1])
    xp.copyto(v, t[1], where=mask)


class GridSample(Schema):
    """GridSample: Y[n, c, p...] = X[n, c] interpolated at grid[n, p...], whose last dim holds the
    coordinates in [-1, 1] (the innermost spatial dim first). Opset 16 names its modes bilinear,
    nearest, bicubic and takes 4-D X only; opset 20 names them linear, nearest, cubic for any rank.
    Border padding clamps the point, but for cubic each of its taps, as PyTorch and onnxruntime do
    (the ONNX reference clamps a cubic point too, which drops the taps inside the image).

    The kernel works on chunks of one image's points: each point's coordinate per spatial dim, then
    per dim the taps' indices (already times the dim's stride) and weights, then for every combination
    of taps one gather of all channels, weighted and added into the output."""

    op = "GridSample"
    ranks = "same"
    mirror = False
    TAPS = {"nearest": 1, "linear": 2, "cubic": 4}

    def __init__(self, since, names):
        self.since, self.names = since, names
        self.defaults = {"mode": next(iter(names)), "padding_mode": "zeros", "align_corners": 0}

    def mode(self, node):
        mode = self.attr(node, "mode")
        if mode not in self.names:
            raise ShapeError(f"mode {mode!r} is not one of {', '.join(self.names)}")
        return self.names[mode]

    def infer(self, node, ins):
        x, grid = ins
        self.mode(node)
        padding = self.attr(node, "padding_mode")
        if padding not in ("zeros", "border", "reflection"):
            raise ShapeError(f"padding_mode {padding!r} is not zeros, border or reflection")
        if self.since < 20 and x.rank != 4:
            raise ShapeError(f"GridSample before opset 20 takes 4-D X (N, C, H, W), got shape {x.shape}")
        if x.rank < 3 or grid.rank != x.rank or grid.shape[0] != x.shape[0] or grid.shape[-1] != x.rank - 2:
            raise ShapeError(f"grid {grid.shape} must be (N, out..., {x.rank - 2}) with N = {x.shape[0]} for X "
                             f"{x.shape} (N, C, in...)")
        out = (x.shape[0], x.shape[1], *grid.shape[1:-1])
        if math.prod(out) and not math.prod(x.shape[2:]):
            raise ShapeError(f"X {x.shape} has no pixels to sample (onnxruntime refuses it too)")
        return [(out, x.dtype)]

    def chunk(self, node, ins, limit):
        """Points per chunk: as many as `limit` holds (at least one), at most one image's."""
        x, grid = ins
        rank, taps = x.rank - 2, self.TAPS[self.mode(node)]
        work = work_dtype(self, x.dtype).itemsize
        per_point = (work * (6 + rank) + 1 + (8 + work) * (rank * taps + 1) +
                     x.shape[1] * (np.dtype(x.dtype).itemsize + 2 * work))
        return max(1, min(math.prod(grid.shape[1:-1]), limit // per_point))

    def workspace(self, node, ins, outs, limit):
        """`coord` the chunk's coordinates per dim, `tmp` six rows of scratch, `mask`; `index` and
        `weight` (dim, tap, point); `flat` and `w`, one combination of taps; `gather` the channels at
        it and `term` (when the data is not of the work dtype) weighted; `acc` the sum when the output
        is not of the work dtype. Chunked to fit `limit`."""
        x = ins[0]
        if not math.prod(outs[0][0]):
            return Layout()
        p, rank, taps = self.chunk(node, ins, limit), x.rank - 2, self.TAPS[self.mode(node)]
        work, channels = work_dtype(self, x.dtype), x.shape[1]
        return Layout.pack(("coord", (rank, p), work), ("tmp", (6, p), work), ("mask", (p,), np.bool_),
                           ("index", (rank, taps, p), np.int64), ("weight", (rank, taps, p), work),
                           ("flat", (p,), np.int64), ("w", (p,), work), ("gather", (channels, p), x.dtype),
                           ("term", (channels, p), work) if work != x.dtype else None,
                           ("acc", (channels, p), work) if work != x.dtype else None)

    def flops(self, node, ins, outs):
        """Two per tap of every output element."""
        return 2 * self.TAPS[self.mode(node)] ** (ins[0].rank - 2) * math.prod(outs[0][0])

    def kernel(self, xp, step, ins, outs, ws):
        x, grid = ins
        y = outs[0]
        if not y.size:
            return
        n, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
        rank, points, p = len(spatial), math.prod(grid.shape[1:-1]), ws["flat"].shape[0]
        taps = self.TAPS[self.mode(step)]
        strides = [math.prod(spatial[j + 1:]) for j in range(rank)]
        xs, ys = x.reshape(n, channels, -1), y.reshape(n, channels, points)
        gs = grid.reshape(n, points, rank)
        for image in range(n):
            for start in range(0, points, p):
                m = min(p, points - start)
                for j in range(rank):
                    self.taps(xp, step, gs[image, start:start + m, rank - 1 - j], spatial[j], strides[j], j, m, ws)
                acc = ys[image, :, start:start + m] if "acc" not in ws else front(ws["acc"], (channels, m))
                gather = front(ws["gather"], (channels, m))
                term = gather if "term" not in ws else front(ws["term"], (channels, m))
                flat, w = ws["flat"][:m], ws["w"][:m]
                acc.fill(0)
                for combo in itertools.product(range(taps), repeat=rank):
                    xp.copyto(flat, ws["index"][0, combo[0], :m])
                    xp.copyto(w, ws["weight"][0, combo[0], :m])
                    for j in range(1, rank):
                        xp.add(flat, ws["index"][j, combo[j], :m], out=flat)
                        xp.multiply(w, ws["weight"][j, combo[j], :m], out=w)
                    take_columns(xp, xs[image], flat, gather)
                    xp.multiply(gather, w, out=term)
                    xp.add(acc, term, out=acc)
                if "acc" in ws:
                    xp.copyto(ys[image, :, start:start + m], acc, casting="unsafe")

    def taps(self, xp, step, coords, size, stride, j, m, ws):
        """Dim j's taps for a chunk of m points (`coords` their normalized coordinates along it): indices
        times `stride` into ws["index"][j] and weights into ws["weight"][j]."""
        align, padding, mode = self.attr(step, "align_corners"), self.attr(step, "padding_mode"), self.mode(step)
        row, t, mask = ws["coord"][j, :m], ws["tmp"][:, :m], ws["mask"][:m]
        xp.copyto(row, coords)
        xp.add(row, 1, out=row)
        if align:
            xp.multiply(row, (size - 1) / 2, out=row)
        else:
            xp.multiply(row, size / 2, out=row)
            xp.subtract(row, 0.5, out=row)
        if mode == "nearest":
            xp.rint(row, out=row)
        low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border" and mode != "cubic":
            xp.less(row, low, out=mask)
            xp.copyto(row, 0, where=mask)
            xp.greater(row, high, out=mask)
            xp.copyto(row, size - 1, where=mask)
        elif padding == "reflection":
            reflect(xp, row, low, high, t[3:], mask)
        base, frac, at, horner = t[0], t[1], t[2], t[3]
        (xp.trunc if mode == "nearest" else xp.floor)(row, out=base)
        xp.subtract(row, base, out=frac)
        first = -1 if mode == "cubic" else 0
        for k in range(self.TAPS[mode]):
            offset, weight, index = first + k, ws["weight"][j, k, :m], ws["index"][j, k, :m]
            if mode == "nearest":
                weight.fill(1)
            else:
                xp.subtract(frac, offset, out=weight)
                xp.absolute(weight, out=weight)
                self.kernel_weight(xp, mode, weight, horner, inner=offset in (0, 1))
            xp.add(base, offset, out=at)
            if padding == "zeros":
                xp.less(at, 0, out=mask)
                xp.copyto(weight, 0, where=mask)
                xp.greater(at, size - 1, out=mask)
                xp.copyto(weight, 0, where=mask)
            elif padding == "reflection":
                reflect(xp, at, low, high, t[3:], mask)
                xp.trunc(at, out=at)
            xp.clip(at, 0, size - 1, out=at)
            xp.copyto(index, at, casting="unsafe")
            xp.multiply(index, stride, out=index)

    @staticmethod
    def kernel_weight(xp, mode, s, horner, inner):
        """The interpolation kernel at distances `s`, in place: 1 - s (linear), or Keys' cubic on [0, 1]
        (`inner`) or [1, 2]."""
        if mode == "linear":
            xp.subtract(1, s, out=s)
            return
        a = CUBIC_A
        if inner:
            xp.multiply(s, a + 2, out=horner)
            xp.subtract(horner, a + 3, out=horner)
            xp.multiply(horner, s, out=horner)
            xp.multiply(horner, s, out=horner)
            xp.add(horner, 1, out=s)
            return
        xp.multiply(s, a, out=horner)
        xp.subtract(horner, 5 * a, out=horner)
        xp.multiply(horner, s, out=horner)
        xp.add(horner, 8 * a, out=horner)
        xp.multiply(horner, s, out=horner)
        xp.subtract(horner, 4 * a, out=s)

    def gradient(self, b, node, dys):
        """Y is a sum over the taps' combinations of weights times gathered X. dX adds dY times each
        weight at its tap (one ScatterND over all of them); dgrid sums, over channels and combinations,
        dY times the gathered X times the weight's derivative along each dim (the other dims' weights,
        the kernel's slope along it: none for nearest), times d coordinate / d grid (0 where border
        padding held the coordinate at the edge, negated where reflection turned it an odd number of
        times)."""
        x, grid = node.inputs
        xs, gs, dtype = b.shape(x), b.shape(grid), b.dtype(x)
        (n, c, *spatial), points, rank = xs, math.prod(gs[1:-1]), len(xs) - 2
        constant_shape(node, "the offsets of its gradient's images", n, c, 1)
        g = grid if b.dtype(grid) == dtype else b.cast(grid, dtype)
        g = b.op("Reshape", g, shape=[n, 1, points, rank])
        dims = [self.interpolation_taps(b, node, g, j, spatial, x, (n, 1, points)) for j in range(rank)]
        dy = b.op("Reshape", dys[0], shape=[n, c, points])
        flat_x = b.op("Reshape", x, shape=[-1])
        flats, updates, sums = [], [], [None] * rank
        for combo in itertools.product(range(self.TAPS[self.mode(node)]), repeat=rank):
            taps = [dims[j][1][t] for j, t in enumerate(combo)]  # (index, weight, slope)
            index = taps[0][0]
            for tap in taps[1:]:
                index = b.op("Add", index, tap[0])
            index = b.op("Add", index, b.const((np.arange(n * c) * math.prod(spatial)).reshape(n, c, 1), index))
            gathered = b.op("Gather", flat_x, index, axis=0)
            flats.append(index)
            updates.append(b.op("Mul", dy, product(b, [tap[1] for tap in taps])))
            for j in range(rank):
                term = b.op("Mul", gathered, product(b, [tap[2] if k == j else tap[1] for k, tap in enumerate(taps)]))
                sums[j] = term if sums[j] is None else b.op("Add", sums[j], term)
        dx = scatter_add_flat(b, b.op("Concat", *flats, axis=2), b.op("Concat", *updates, axis=2), xs, dtype)
        dg = [b.op("Mul", b.op("ReduceSum", b.op("Mul", sums[j], dy), axes=[1], keepdims=1), dims[j][0])
              for j in reversed(range(rank))]
        dg = b.op("Reshape", b.op("Concat", *(b.op("Unsqueeze", d, axes=[3]) for d in dg), axis=3), shape=list(gs))
        return [dx, dg if b.dtype(grid) == dtype else b.cast(dg, b.dtype(grid))]

    def interpolation_taps(self, b, node, g, j, spatial, like, taps_shape):
        """Spatial dim j's (d coordinate / d grid, [(index times stride, weight, d weight / d coordinate)
        of each tap]) for the grid g (N, 1, points, rank), each of `taps_shape` (N, 1, points), as the kernel's
        `taps`."""
        size, rank, align = spatial[j], len(spatial), self.attr(node, "align_corners")
        scale = (size - 1) / 2 if align else size / 2
        part = b.op("Reshape", b.op("Slice", g, starts=[rank - 1 - j], ends=[rank - j], axes=[3]),
                    shape=list(taps_shape))
        u = b.op("Add", b.op("Mul", part, b.const(scale, like)), b.const(scale if align else scale - 0.5, like))
        mode = self.mode(node)
        if mode == "nearest":
            u = b.op("Round", u)
        slope = b.const(scale, like)
        zero, top = b.const(0, like), b.const(size - 1, like)
        low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        padding = self.attr(node, "padding_mode")
        if padding == "border" and mode != "cubic":
            below, above = b.op("Less", u, b.const(low, like)), b.op("Greater", u, b.const(high, like))
            u = b.op("Where", below, zero, b.op("Where", above, top, u))
            slope = b.op("Where", b.op("Or", below, above), zero, slope)
        elif padding == "reflection":
            u, sign = reflected(b, u, low, high, like)
            slope = b.op("Mul", slope, sign)
        base = u if mode == "nearest" else b.op("Floor", u)  # the cast to indices truncates, as the kernel does
        frac = b.op("Sub", u, base)
        taps = []
        for offset in range(-1, 3) if mode == "cubic" else range(self.TAPS[mode]):
            at = b.op("Add", base, b.const(offset, like))
            weight, derivative = self.kernel_slope(b, mode, frac, offset, like)
            if padding == "zeros":
                inside = b.op("And", b.op("GreaterOrEqual", at, zero), b.op("LessOrEqual", at, top))
                weight, derivative = b.op("Where", inside, weight, zero), b.op("Where", inside, derivative, zero)
            elif padding == "reflection":
                at = reflected(b, at, low, high, like)[0]  # the cast below truncates, as the kernel does
            index = b.cast(b.op("Clip", at, min=0.0, max=float(size - 1)), np.int64)
            taps.append((b.op("Mul", index, b.const(math.prod(spatial[j + 1:]), index)), weight, derivative))
        return slope, taps

    @staticmethod
    def kernel_slope(b, mode, frac, offset, like):
        """(weight, d weight / d coordinate) of the tap at `offset` from the coordinate's floor, `frac`
        past it: 1 and 0 (nearest); the kernel at s = |frac - offset| and its slope, s growing with
        the coordinate for taps at or before the floor and shrinking for those after."""
        if mode == "nearest":
            return b.const(1, like), b.const(0, like)
        s = b.op("Abs", b.op("Sub", frac, b.const(offset, like)))
        towards = 1 if offset <= 0 else -1
        if mode == "linear":
            return b.op("Sub", b.const(1, like), s), b.const(-towards, like)
        a = CUBIC_A
        inner = (a + 2, -(a + 3), 0, 1) if offset in (0, 1) else (a, -5 * a, 8 * a, -4 * a)  # cubic coefficients
        weight, slope = b.const(inner[0], like), b.const(3 * inner[0], like)
        for k, coefficient in enumerate(inner[1:], 1):
            weight = b.op("Add", b.op("Mul", weight, s), b.const(coefficient, like))
            if k < 3:
                slope = b.op("Add", b.op("Mul", slope, s), b.const((3 - k) * coefficient, like))
        return weight, b.op("Mul", slope, b.const(towards, like))

    def torch(self, torch, x, grid, mode, padding_mode, align_corners):
        mode = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}[self.names[mode]]
        return torch.nn.functional.grid_sample(x, grid.to(x.dtype), mode=mode, padding_mode=padding_mode,
                                               align_corners=bool(align_corners))


def reflected(b, u, low, high, like):
    """(u reflected into [low, high] as `reflect` does, d reflected / d u): 1 inside; outside, -1 or 1 as
    the number of whole spans beyond the border is even or odd; 0 where the range is one point."""
    span = high - low
    if span <= 0:
        return b.op("Mul", u, b.const(0, like)), b.op("Mul", u, b.const(0, like))
    lo, hi = b.const(low, like), b.const(high, like)
    outside = b.op("Max", b.op("Sub", lo, u), b.op("Sub", u, hi))
    turns = b.op("Floor", b.op("Div", outside, b.const(span, like)))
    rest = b.op("Sub", outside, b.op("Mul", turns, b.const(span, like)))
    odd = b.op("Sub", turns, b.op("Mul", b.op("Floor", b.op("Mul", turns, b.const(0.5, like))), b.const(2, like)))
    shift = b.op("Add", rest, b.op("Mul", odd, b.op("Sub", b.const(span, like), b.op("Mul", rest, b.const(2, like)))))
    below, above = b.op("Less", u, lo), b.op("Greater", u, hi)
    value = b.op("Where", below, b.op("Add", lo, shift), b.op("Where", above, b.op("Sub", hi, shift), u))
    sign = b.op("Sub", b.op("Mul", odd, b.const(2, like)), b.const(1, like))
    return value, b.op("Where", b.op("Or", below, above), sign, b.const(1, like))


def product(b, names):
    """The product of several tensors, as one Mul after another."""
    out = names[0]
    for name in names[1:]:
        out = b.op("Mul", out, name)
    return out


register(GridSample(16, {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}))
register(GridSample(20, {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}))
