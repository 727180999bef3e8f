"""Resize: each resized axis resampled in one pass (nearest, linear or cubic taps), as the ONNX reference does."""
import math
from typing import NamedTuple

import numpy as np

from .registry import schema
from .base import Layout, Schema, axis, constant_shape
from .shape_ops import transposed_along
from .torch_forms import unsupported
from ..errors import ShapeError

COORDINATES = {"half_pixel": False, "pytorch_half_pixel": False, "align_corners": True}
"""The coordinate mappings PyTorch's interpolate shares with ONNX, by its align_corners."""
RESIZE = {("nearest", "asymmetric", "floor"): "nearest", ("nearest", "half_pixel", "round_prefer_ceil"): "nearest-exact",
          **{(mode, c, None): mode for mode in ("linear", "cubic") for c in COORDINATES}}
INTERPOLATE = {("linear", 3): "linear", ("linear", 4): "bilinear", ("linear", 5): "trilinear", ("cubic", 4): "bicubic"}


@schema("Resize")
class Resize(Schema):
    """Resize: the output is floor(input * scale) per resized axis, or `sizes` (kept in aspect by the policy)."""

    ranks = "same"
    attr_inputs = (("roi", 1, 11), ("scales", 2, 11), ("sizes", 3, 11))
    defaults = {"roi": None, "scales": None, "sizes": None, "axes": None, "keep_aspect_ratio_policy": "stretch",
                "mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor",
                "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0}

    def infer(self, node, ins):
        shape = list(ins[0].shape)
        axes = self.attr(node, "axes")
        axes = range(len(shape)) if axes is None else [axis(a, len(shape)) for a in axes]
        scales, sizes = self.attr(node, "scales") or None, self.attr(node, "sizes") or None
        if (scales is None) == (sizes is None):
            raise ShapeError("exactly one of scales and sizes must be given")
        given = scales or sizes
        if len(given) != len(axes):
            raise ShapeError(f"{'scales' if scales else 'sizes'} {tuple(given)} must have one entry per resized axis")
        if scales is not None:
            for a, s in zip(axes, scales):
                shape[a] = int(np.floor(shape[a] * s))
            return [(tuple(shape), ins[0].dtype)]
        policy = self.attr(node, "keep_aspect_ratio_policy")
        empty = [(a, n) for a, n in zip(axes, sizes) if not shape[a] and (n or policy != "stretch")]
        if empty:
            ratio = "" if policy == "stretch" else " or take a ratio from"
            raise ShapeError(f"axis {empty[0][0]} of the input {tuple(shape)} holds no values to resize to "
                             f"{empty[0][1]}{ratio}")
        if policy != "stretch":
            pick = {"not_larger": min, "not_smaller": max}.get(policy)
            if pick is None:
                raise ShapeError(f"keep_aspect_ratio_policy {policy!r} is not stretch, not_larger or not_smaller")
            scale = pick(n / shape[a] for a, n in zip(axes, sizes))
            sizes = [int(scale * shape[a] + 0.5) for a in axes]
        for a, n in zip(axes, sizes):
            shape[a] = n
        return [(tuple(shape), ins[0].dtype)]

    def scales(self, node, in_shape):
        """The scale of every axis (1 where not resized): the given scales, else output over input size,
        or under a keep-aspect policy the one scale it picked."""
        scales, sizes = self.attr(node, "scales") or None, self.attr(node, "sizes") or None
        axes = self.resized_axes(node, len(in_shape))
        if scales is None:
            scales = [n / in_shape[a] if in_shape[a] else 1.0 for a, n in zip(axes, sizes)]  # 0 stays 0
            pick = {"not_larger": min, "not_smaller": max}.get(self.attr(node, "keep_aspect_ratio_policy"))
            scales = [pick(scales)] * len(axes) if pick else scales
        full = [1.0] * len(in_shape)
        for a, s in zip(axes, scales):
            full[a] = float(s)
        return full

    def passes(self, node, in_shape, out_shape):
        """A ResizePass for each axis that changes, in axis order (the reference skips the others too)."""
        rank, roi = len(in_shape), self.attr(node, "roi") or None
        axes = self.resized_axes(node, rank)
        lows, highs = [0.0] * rank, [1.0] * rank
        for k, a in enumerate(axes if roi is not None else ()):
            lows[a], highs[a] = roi[k], roi[k + len(axes)]
        crop = self.attr(node, "coordinate_transformation_mode") == "tf_crop_and_resize"
        out = []
        for a, scale in enumerate(self.scales(node, in_shape)):
            kept = math.isclose(scale, 1) and in_shape[a] == out_shape[a]
            if not (kept and (not crop or math.isclose(lows[a], 0) and math.isclose(highs[a], 1))):
                constant_shape(node, f"the table of its pass along axis {a}", _taps(self, node, scale), out_shape[a])
                out.append(_resize_pass(self, node, a, in_shape[a], out_shape[a], scale, (lows[a], highs[a])))
        return out

    def gradient(self, b, node, dys):
        """Each pass is a linear map of its axis (see ResizePass): dY goes back through their matrices,
        transposed, axis by axis; positions set to extrapolation_value take none."""
        x, dy = node.inputs[0], dys[0]
        in_shape = b.shape(x)
        shape = list(b.shape(node.outputs[0]))
        for p in reversed(self.passes(node, in_shape, shape)):
            matrix = np.zeros((shape[p.axis], in_shape[p.axis]))
            rows = np.broadcast_to(np.arange(shape[p.axis]), p.index.shape)
            np.add.at(matrix, (rows, p.index), 1.0 if p.weight is None else p.weight)
            if p.outside is not None:
                matrix[p.outside] = 0
            dy = transposed_along(b, dy, shape, p.axis, matrix, x)
            shape[p.axis] = in_shape[p.axis]
        return [dy]

    def workspace(self, node, ins, outs, limit):
        """Where the kernel keeps its passes' tables and the results between passes, each region at a
        multiple of 256 bytes (not chunked to `limit`: the passes are not split). Passes compute in
        the output's dtype, or in a float one for integers that they interpolate: `source` is the input
        in that dtype, when it differs; `ping` and `pong` (results between passes, alternately) and
        `tap` (one tap of a pass) are raw bytes; `index{k}` and `weight{k}` are pass k's tables."""
        (out_shape, dtype), in_shape = outs[0], ins[0].shape
        if not math.prod(out_shape):
            return Layout()
        passes, dtype = self.passes(node, in_shape, out_shape), np.dtype(dtype)
        work = dtype
        if dtype.kind != "f" and any(p.weight is not None for p in passes):
            work = np.dtype(np.float32 if dtype.itemsize < 4 else np.float64)
        regions = {}  # name: (shape, dtype), in the order first needed

        def raw(name, shape):
            size = max(regions.get(name, ((0,),))[0][0], math.prod(shape) * work.itemsize)
            regions[name] = ((size,), np.uint8)

        if work != dtype:
            regions["source"] = (in_shape, work)
        shape = list(in_shape)
        for k, p in enumerate(passes):
            shape[p.axis] = out_shape[p.axis]
            if k < len(passes) - 1 or work != dtype:
                raw(("ping", "pong")[k % 2], shape)
            if len(p.index) > 1:
                raw("tap", shape)
            regions[f"index{k}"] = (p.index.shape, np.int64)
            if p.weight is not None:
                regions[f"weight{k}"] = (p.weight.shape, work)
        return Layout.pack(*((name, *region) for name, region in regions.items()), align=256)

    def resized_axes(self, node, rank):
        """The axes `scales` or `sizes` apply to: `axes`, or every axis."""
        axes = self.attr(node, "axes")
        return list(range(rank)) if axes is None else [axis(a, rank) for a in axes]

    def torch_node(self, torch, run, node, ins):
        """F.interpolate over the spatial dims, in the modes and coordinate mappings it shares with ONNX: by the
        given scales (which set the mapping even where the output size rounds), else to the output size."""
        x, out, f = ins[0], run.shape(node.outputs[0]), torch.nn.functional
        mode, name = self.attr(node, "mode"), self.interpolation(node, x.shape, out)
        options = {} if mode == "nearest" else \
            {"align_corners": COORDINATES[self.attr(node, "coordinate_transformation_mode")]}
        if self.attr(node, "scales"):
            scales = self.scales(node, x.shape)[2:]
            return f.interpolate(x, scale_factor=scales, mode=name, recompute_scale_factor=False, **options)
        return f.interpolate(x, out[2:], mode=name, **options)

    def interpolation(self, node, shape, out):
        """F.interpolate's mode for the node, or UnsupportedOpError naming the form it has none for."""
        mode, coordinates = self.attr(node, "mode"), self.attr(node, "coordinate_transformation_mode")
        key = (mode, coordinates, self.attr(node, "nearest_mode") if mode == "nearest" else None)
        name = RESIZE.get(key) if mode == "nearest" else INTERPOLATE.get((RESIZE.get(key), len(shape)))
        if name is None or out[:2] != shape[:2] or self.attr(node, "keep_aspect_ratio_policy") != "stretch" \
                or self.attr(node, "antialias") or coordinates == "align_corners" and self.attr(node, "scales") \
                or mode == "cubic" and (self.attr(node, "cubic_coeff_a") != -0.75 or self.attr(node, "exclude_outside")) \
                or coordinates == "pytorch_half_pixel" and min(out[2:]) == 1:
            raise unsupported(f"{node.op} with mode {mode}, {coordinates} coordinates on {tuple(shape)} -> {tuple(out)}")
        return name


class ResizePass(NamedTuple):
    """Resize along one axis: output position o is the sum over taps t of weight[t, o] * input[index[t, o]]
    (weight None: the one tap is copied as is), then extrapolation_value where `outside` holds (or None)."""

    axis: int
    index: np.ndarray
    weight: np.ndarray | None
    outside: np.ndarray | None


_TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize")


def _source_coordinates(transform, n_in, n_out, scale, roi):
    """Where each output position along an axis falls in the input, by the coordinate transformation."""
    o, length = np.arange(n_out, dtype=np.float64), scale * n_in
    if transform == "align_corners":
        return np.zeros(n_out) if length == 1 else o * (n_in - 1) / (length - 1)
    if transform == "asymmetric":
        return o / scale
    if transform == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if length == 1 else o * (hi - lo) * (n_in - 1) / (length - 1)
        return x + lo * (n_in - 1)
    if transform == "pytorch_half_pixel":
        return np.full(n_out, -0.5) if length == 1 else (o + 0.5) / scale - 0.5
    if transform == "half_pixel_symmetric":
        return n_in / 2 * (1 - n_out / length) + (o + 0.5) / scale - 0.5
    if transform == "half_pixel":
        return (o + 0.5) / scale - 0.5
    raise ShapeError(f"coordinate_transformation_mode {transform!r} is not one of {', '.join(_TRANSFORMS)}")


def _taps(schema, node, scale):
    """How many taps `_filter` gives each output position, without making them."""
    mode = schema.attr(node, "mode")
    if mode not in ("linear", "cubic"):
        return 2
    s = min(scale, 1.0) if schema.attr(node, "antialias") else 1.0
    return 2 - 2 * (math.floor(-(1 if mode == "linear" else 2) / s) + 1)


def _filter(schema, node, ratio, scale):
    """(offsets, weights): the taps around each source coordinate, at offsets from the neighbour left
    of it (`ratio` in (0, 1] away), and their weights; antialiasing widens the filter by 1/scale
    when downscaling."""
    mode = schema.attr(node, "mode")
    if mode == "nearest":
        whole = ratio == 1
        right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": False, "ceil": True}[schema.attr(node, "nearest_mode")] | whole
        return np.arange(2)[:, None], np.stack([~right, right]).astype(np.float64)
    if mode not in ("linear", "cubic"):
        raise ShapeError(f"mode {mode!r} is not nearest, linear or cubic")
    antialias = schema.attr(node, "antialias")
    s = min(scale, 1.0) if antialias else 1.0
    start = 1 - _taps(schema, node, scale) // 2
    offsets = np.arange(start, 2 - start)[:, None]
    d = np.abs((offsets - ratio) * s)
    if mode == "linear":
        weight = np.clip(1 - d, 0, 1)
    else:
        a = schema.attr(node, "cubic_coeff_a")
        weight = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                          np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return offsets, weight / weight.sum(0) if antialias else weight


def _resize_pass(schema, node, a, n_in, n_out, scale, roi):
    """Axis `a`'s ResizePass, as the ONNX reference resamples: neighbours beyond the edges repeat the
    edge (or weigh nothing, with exclude_outside); a pass whose every weight is one 1 is a gather."""
    transform = schema.attr(node, "coordinate_transformation_mode")
    x = _source_coordinates(transform, n_in, n_out, scale, roi)
    ratio = np.where(x == np.floor(x), 1.0, x - np.floor(x))
    offsets, weight = _filter(schema, node, ratio, scale)
    index = (x - ratio).astype(np.int64) + offsets
    if schema.attr(node, "exclude_outside"):
        weight = np.where((index < 0) | (index >= n_in), 0.0, weight)
        total = weight.sum(0)
        weight = weight / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, n_in - 1)
    outside = (x < 0) | (x > n_in - 1) if transform == "tf_crop_and_resize" else None
    outside = outside if outside is not None and outside.any() else None
    if ((weight != 0).sum(0) == 1).all() and (weight.sum(0) == 1).all():
        return ResizePass(a, index[(weight != 0).argmax(0), np.arange(n_out)][None], None, outside)
    return ResizePass(a, index, weight, outside)
