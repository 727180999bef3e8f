"""Sampling ops: GridSample (an image read at the points of a grid), AffineGrid (the grid of an affine
map, a composite) and RoiAlign (regions of an image pooled to a fixed size). The kernels gather the
taps of a chunk of points at a time from their workspace, so that nothing else is allocated."""
import itertools
import math

import numpy as np

from . import register
from .base import Layout, Schema
from .composite import Composite
from ..dtypes import is_float
from ..errors import ShapeError

CUBIC_A = -0.75
"""The cubic convolution's coefficient, as PyTorch and the ONNX reference take it."""


def take_columns(xp, a, indices, out):
    """a[:, indices] into `out`: NumPy is told the indices are in range (else it buffers `out`), CuPy
    takes no mode."""
    if xp is np:
        return np.take(a, indices, axis=1, out=out, mode="clip")
    return xp.take(a, indices, axis=1, out=out)


def front(raw, shape):
    """The contiguous front of a scratch slice, shaped `shape` (the last chunk is shorter)."""
    return raw.reshape(-1)[:math.prod(shape)].reshape(shape)


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


def work_dtype(schema, dtype):
    """The float dtype a sampling kernel interpolates in for data of `dtype`."""
    return schema.accumulation(dtype) if is_float(dtype) else np.dtype(np.float64)


class GridSample(Schema):
    """GridSample: Y[n, c, p...] = X[n, c] interpolated at grid[n, p...], whose last dim holds the
    coordinates in [-1, 1] (the innermost spatial dim first). Opset 16 names its modes bilinear,
    nearest, bicubic and takes 4-D X only; opset 20 names them linear, nearest, cubic for any rank.

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
        return [((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype)]

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
        if padding == "border":
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

    def torch(self, torch, x, grid, mode, padding_mode, align_corners):
        mode = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}[self.names[mode]]
        return torch.nn.functional.grid_sample(x, grid.to(x.dtype), mode=mode, padding_mode=padding_mode,
                                               align_corners=bool(align_corners))


register(GridSample(16, {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}))
register(GridSample(20, {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}))


class AffineGrid(Composite):
    """AffineGrid (opset 20): the grid (N, *size[2:], r) of theta (N, r, r + 1) applied to the
    normalized coordinates (x, y[, z], 1) of every point of the output size (x along the last dim),
    as GridSample reads them. Planned as one MatMul of those constant coordinates by theta."""

    arity = None
    ranks = None
    attr_inputs = (("size", 1, 20),)

    def __init__(self):
        super().__init__("AffineGrid", _affine_grid, {"size": None, "align_corners": 0}, since=20)

    def infer(self, node, ins):
        theta, size = ins[0], self.attr(node, "size")
        if size is None or len(size) not in (4, 5) or min(size) < 0:
            raise ShapeError(f"size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
        r = len(size) - 2
        if theta.shape != (size[0], r, r + 1):
            raise ShapeError(f"theta must be ({size[0]}, {r}, {r + 1}) for size {tuple(size)}, got {theta.shape}")
        return [((size[0], *size[2:], r), theta.dtype)]

    def torch(self, torch, theta, size, align_corners):
        return torch.nn.functional.affine_grid(theta, list(size), align_corners=bool(align_corners))


class RoiAlign(Schema):
    """RoiAlign: Y[r, c] (output_height, output_width) pooled from X[batch_indices[r], c] over the region
    rois[r] = (x1, y1, x2, y2) times spatial_scale, each bin the average (or, as onnxruntime does, the
    largest weighted corner) of its bilinear samples: sampling_ratio per axis, or when 0 ceil(region /
    bins), which only the rois' values say. Opset 16's coordinate_transformation_mode half_pixel (its
    default) shifts regions by half a pixel; output_half_pixel, opset 10's behaviour, does not and
    widens regions below one pixel to one.

    The kernel reads the rois on the host (the sample counts are data) and takes one roi and a chunk of
    channels at a time: per sample, each axis's corners and weights, then one gather per corner."""

    op = "RoiAlign"
    mirror = False

    def __init__(self, since, transform):
        self.since = since
        self.defaults = {"mode": "avg", "output_height": 1, "output_width": 1, "sampling_ratio": 0,
                         "spatial_scale": 1.0, "coordinate_transformation_mode": transform}

    def infer(self, node, ins):
        x, rois, indices = ins
        if self.attr(node, "mode") not in ("avg", "max"):
            raise ShapeError(f"mode {self.attr(node, 'mode')!r} is not avg or max")
        if self.attr(node, "coordinate_transformation_mode") not in ("half_pixel", "output_half_pixel"):
            raise ShapeError(f"coordinate_transformation_mode {self.attr(node, 'coordinate_transformation_mode')!r} "
                             "is not half_pixel or output_half_pixel")
        height, width = self.attr(node, "output_height"), self.attr(node, "output_width")
        if height < 1 or width < 1 or self.attr(node, "sampling_ratio") < 0:
            raise ShapeError(f"output_height {height} and output_width {width} must be positive and sampling_ratio "
                             f"{self.attr(node, 'sampling_ratio')} not negative")
        if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 4 or indices.shape != rois.shape[:1]:
            raise ShapeError(f"X {x.shape} must be (N, C, H, W), rois {rois.shape} (R, 4) and batch_indices "
                             f"{indices.shape} (R,)")
        return [((rois.shape[0], x.shape[1], height, width), x.dtype)]

    def workspace(self, node, ins, outs, limit):
        """Per axis (`rows`, `cols`): the sample positions, far and near corner weights, corner indices
        (`rowidx`, `colidx`) and `mask`; `ramp` 0, 1, ...; `flat` and `w`, one corner of every bin;
        `gather` (channels, bins) and `term`, `acc` where the data is not of the work dtype. Channels
        are chunked to fit `limit`."""
        (shape, dtype), x = outs[0], ins[0]
        if not math.prod(shape):
            return Layout()
        bins, work, longer = shape[2] * shape[3], work_dtype(self, dtype), max(shape[2:])
        narrow = work != dtype
        per_channel = bins * (np.dtype(dtype).itemsize + 2 * narrow * work.itemsize)
        channels = max(1, min(x.shape[1], limit // per_channel))
        return Layout.pack(("ramp", (longer,), work), ("rows", (3, shape[2]), work), ("cols", (3, shape[3]), work),
                           ("rowidx", (2, shape[2]), np.int64), ("colidx", (2, shape[3]), np.int64),
                           ("mask", (2, longer), np.bool_), ("flat", shape[2:], np.int64), ("w", shape[2:], work),
                           ("gather", (channels, bins), dtype), ("term", (channels, bins), work) if narrow else None,
                           ("acc", (channels, bins), work) if narrow else None)

    def flops(self, node, ins, outs):
        """Two per corner of each sample (sampling_ratio^2 of them, taken as one when adaptive) of every output."""
        return 8 * max(self.attr(node, "sampling_ratio"), 1) ** 2 * math.prod(outs[0][0])

    def kernel(self, xp, step, ins, outs, ws):
        x, rois, indices = ins
        y = outs[0]
        if not y.size:
            return
        n, channels, height, width = x.shape
        rows, cols = y.shape[2:]
        boxes, batch = ((a if xp is np else xp.asnumpy(a)).tolist() for a in (rois, indices))
        bad = [b for b in batch if not 0 <= b < n]
        if bad:
            raise IndexError(f"batch index {bad[0]} is out of range for {n} images")
        ramp = ws["ramp"]
        ramp.fill(1)
        xp.cumsum(ramp, out=ramp)
        xp.subtract(ramp, 1, out=ramp)
        half = self.attr(step, "coordinate_transformation_mode") == "half_pixel"
        scale, ratio = self.attr(step, "spatial_scale"), self.attr(step, "sampling_ratio")
        xs, chunk = x.reshape(n, channels, height * width), ws["gather"].shape[0]
        for r, (box, b) in enumerate(zip(boxes, batch)):
            start_w, start_h, end_w, end_h = (v * scale - 0.5 * half for v in box)
            extent_h, extent_w = end_h - start_h, end_w - start_w
            if not half:
                extent_h, extent_w = max(extent_h, 1.0), max(extent_w, 1.0)
            bin_h, bin_w = extent_h / rows, extent_w / cols
            grid_h, grid_w = (ratio, ratio) if ratio > 0 else (math.ceil(extent_h / rows), math.ceil(extent_w / cols))
            for c0 in range(0, channels, chunk):
                k = min(chunk, channels - c0)
                out = y[r, c0:c0 + k].reshape(k, rows * cols)
                acc = out if "acc" not in ws else front(ws["acc"], (k, rows * cols))
                samples = [(iy, ix) for iy in range(grid_h) for ix in range(grid_w)]
                for s, (iy, ix) in enumerate(samples):
                    self.samples(xp, ramp[:rows], start_h + (iy + 0.5) * bin_h / grid_h, bin_h, height, width,
                                 ws["rows"], ws["rowidx"], ws["mask"][:, :rows])
                    self.samples(xp, ramp[:cols], start_w + (ix + 0.5) * bin_w / grid_w, bin_w, width, 1,
                                 ws["cols"], ws["colidx"], ws["mask"][:, :cols])
                    self.corners(xp, step, xs[b, c0:c0 + k], acc, ws, k, first=not s)
                if not samples:
                    acc.fill(0)
                elif self.attr(step, "mode") == "avg":
                    xp.divide(acc, max(grid_h * grid_w, 1), out=acc)
                if "acc" in ws:
                    xp.copyto(out, acc, casting="unsafe")

    @staticmethod
    def samples(xp, ramp, start, step, size, stride, rows, index, mask):
        """One sample of each bin along an axis: positions start + bin * step, clamped into the image;
        rows[1] and rows[2] the weights of the far and near corners, 0 for samples more than a pixel
        outside; index[0] and index[1] the near and far corners times `stride`."""
        pos, far, near = rows
        xp.multiply(ramp, step, out=pos)
        xp.add(pos, start, out=pos)
        xp.less(pos, -1, out=mask[0])
        xp.greater(pos, size, out=mask[1])
        xp.logical_or(mask[0], mask[1], out=mask[0])
        xp.clip(pos, 0, size - 1, out=pos)
        xp.floor(pos, out=far)
        xp.copyto(index[0], far, casting="unsafe")
        xp.add(index[0], 1, out=index[1])
        xp.minimum(index[1], size - 1, out=index[1])
        xp.subtract(pos, far, out=far)
        xp.subtract(1, far, out=near)
        xp.copyto(far, 0, where=mask[0])
        xp.copyto(near, 0, where=mask[0])
        xp.multiply(index, stride, out=index)

    def corners(self, xp, step, image, acc, ws, k, first):
        """The four corners of one sample of every bin, weighted, summed into `acc` (avg) or kept where
        larger (max); the first sample's first corner starts it."""
        flat, w = ws["flat"], ws["w"]
        gather = front(ws["gather"], acc.shape)
        term = gather if "term" not in ws else front(ws["term"], acc.shape)
        combine = xp.add if self.attr(step, "mode") == "avg" else xp.maximum
        for (ri, rw), (ci, cw) in itertools.product(((0, 2), (1, 1)), repeat=2):
            xp.add(ws["rowidx"][ri][:, None], ws["colidx"][ci][None, :], out=flat)
            xp.multiply(ws["rows"][rw][:, None], ws["cols"][cw][None, :], out=w)
            take_columns(xp, image, flat.reshape(-1), gather)
            xp.multiply(gather, w.reshape(-1), out=term)
            if first:
                xp.copyto(acc, term)
                first = False
            else:
                combine(acc, term, out=acc)


def grid_coordinates(spatial, align_corners):
    """(points, r + 1): the normalized coordinates of each point of `spatial`, innermost dim first, then 1."""
    axes = [np.linspace(-1, 1, n) if align_corners else (2 * np.arange(n) + 1) / n - 1 for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(math.prod(spatial))], axis=1)


def _affine_grid(b, node, theta, size, align_corners):
    spatial = size[2:]
    base = b.const(grid_coordinates(spatial, align_corners), theta)
    grid = b.op("MatMul", base, b.op("Transpose", theta, perm=[0, 2, 1]))
    return b.op("Reshape", grid, shape=[size[0], *spatial, len(spatial)])


register(AffineGrid())
register(RoiAlign(10, "output_half_pixel"))
register(RoiAlign(16, "half_pixel"))
