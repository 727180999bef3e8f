"""Sampling ops: RoiAlign (regions of an image pooled to a fixed size) and AffineGrid (the grid of an
affine map, a composite), and the helpers the sampling kernels share (GridSample, planner/ops/
grid_sample.py): they gather from their workspace, so that nothing else is allocated."""
import itertools
import math

import numpy as np

from .registry import register
from .base import Layout, Schema, constant_shape, no_gradient
from .composite import Composite
from .shape_ops import scatter_add_flat
from ..dtypes import is_float
from ..errors import ShapeError


def take_columns(xp, a, indices, out):
    """a[:, indices] into `out`: NumPy is told the indices are in range (else it buffers `out`), CuPy
    takes no mode."""
    if xp is np:
        return np.take(a, indices, axis=1, out=out, mode="clip")
    return xp.take(a, indices, axis=1, out=out)


def front(raw, shape):
    """The contiguous front of a scratch slice, shaped `shape` (the last chunk is shorter)."""
    return raw.reshape(-1)[:math.prod(shape)].reshape(shape)


def work_dtype(schema, dtype):
    """The float dtype a sampling kernel interpolates in for data of `dtype`."""
    return schema.accumulation(dtype) if is_float(dtype) else np.dtype(np.float64)


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
        if not height * width:  # every sample lies outside an image of no pixels: 0, as onnxruntime gives
            y.fill(0)
            return
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

    def gradient(self, b, node, dys):
        """dX for avg mode with a fixed sampling_ratio (adaptive counts depend on the rois' values): dY
        of each bin, over the sample count, times each sample's corner weights, added at the corners
        (one ScatterND). The rois and indices get none, as in PyTorch's."""
        x, rois, batch = node.inputs
        ratio = self.attr(node, "sampling_ratio")
        if self.attr(node, "mode") != "avg" or ratio < 1:
            return [no_gradient(node), None, None]
        (_, c, height, width), dtype = b.shape(x), b.dtype(x)
        constant_shape(node, "the offsets of its gradient's channels", c)
        dy = b.op("Unsqueeze", b.op("Mul", dys[0], b.const(1 / ratio ** 2, x)), axes=[3, 5])  # (R, C, h, 1, w, 1)
        image = b.op("Mul", b.op("Reshape", batch, shape=[-1, 1, 1, 1, 1, 1]), b.const(c * height * width, batch))
        image = b.op("Add", image, b.const((np.arange(c) * height * width).reshape(1, c, 1, 1, 1, 1), batch))
        axes = []
        rows, cols = self.attr(node, "output_height"), self.attr(node, "output_width")
        for first, size, bins, shape in ((1, height, rows, [-1, 1, rows, ratio, 1, 1]),
                                         (0, width, cols, [-1, 1, 1, 1, cols, ratio])):
            corners = self.roi_samples(b, node, rois, first, size, bins, x)
            axes.append([(b.op("Reshape", i, shape=shape), b.op("Reshape", w, shape=shape)) for i, w in corners])
        flats, updates = [], []
        for (row, row_weight), (col, col_weight) in itertools.product(*axes):
            index = b.op("Add", b.op("Add", image, b.op("Mul", row, b.const(width, batch))), col)
            update = b.op("Mul", dy, b.op("Mul", row_weight, col_weight))
            flats.append(b.op("Reshape", index, shape=[-1]))
            updates.append(b.op("Reshape", update, shape=[-1]))
        return [scatter_add_flat(b, b.op("Concat", *flats, axis=0), b.op("Concat", *updates, axis=0), b.shape(x),
                                 dtype), None, None]

    def roi_samples(self, b, node, rois, first, size, bins, like):
        """Along the axis whose roi coordinates are columns `first` and `first` + 2: the near and far
        corners (int64 index, weight) of every sample of every bin, (R, bins * sampling_ratio) each,
        as the kernel's `samples` places them."""
        ratio, scale = self.attr(node, "sampling_ratio"), self.attr(node, "spatial_scale")
        half = self.attr(node, "coordinate_transformation_mode") == "half_pixel"
        start, end = (b.op("Sub", b.op("Mul", b.op("Slice", rois, starts=[k], ends=[k + 1], axes=[1]),
                                        b.const(scale, like)), b.const(0.5 * half, like)) for k in (first, first + 2))
        extent = b.op("Sub", end, start)
        if not half:
            extent = b.op("Max", extent, b.const(1, like))
        constant_shape(node, "the offsets of its samples", bins, ratio)
        offsets = (np.arange(bins)[:, None] + (np.arange(ratio) + 0.5) / ratio).reshape(1, -1)
        pos = b.op("Add", start, b.op("Mul", b.op("Div", extent, b.const(bins, like)), b.const(offsets, like)))
        outside = b.op("Or", b.op("Less", pos, b.const(-1, like)), b.op("Greater", pos, b.const(size, like)))
        pos = b.op("Clip", pos, min=0.0, max=float(size - 1))
        low = b.op("Floor", pos)
        far = b.op("Sub", pos, low)
        near = b.op("Sub", b.const(1, like), far)
        high = b.op("Clip", b.op("Add", low, b.const(1, like)), max=float(size - 1))
        zero = b.const(0, like)
        return [(b.cast(at, np.int64), b.op("Where", outside, zero, weight)) for at, weight in ((low, near), (high, far))]

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
    constant_shape(node, "its grid of coordinates", math.prod(spatial), len(spatial) + 1)
    base = b.const(grid_coordinates(spatial, align_corners), theta)
    grid = b.op("MatMul", base, b.op("Transpose", theta, perm=[0, 2, 1]))
    return b.op("Reshape", grid, shape=[size[0], *spatial, len(spatial)])


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


register(AffineGrid())
register(RoiAlign(10, "output_half_pixel"))
register(RoiAlign(16, "half_pixel"))
