"""Ops that move or reinterpret data without arithmetic: Shape, Reshape, Transpose, Concat, Slice, ..."""
import math
from typing import NamedTuple

import numpy as np

from . import schema
from .base import Schema, axis, broadcast, no_flops, no_gradient
from ..errors import ShapeError


@schema("Shape")
class Shape(Schema):
    defaults = {"start": 0, "end": None}
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        return [((len(self._dims(node, ins[0].shape)),), np.int64)]

    def fold(self, node, ins):
        return [np.array(self._dims(node, ins[0].shape), dtype=np.int64)]

    def _dims(self, node, shape):
        end = self.attr(node, "end")
        return shape[self.attr(node, "start"):len(shape) if end is None else end]


def reshaped(shape, target, allowzero=0):
    """ONNX Reshape's target shape with its 0 (copy) and -1 (infer) entries resolved."""
    target = list(target)
    if not allowzero:
        target = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    size = math.prod(shape)
    if target.count(-1) > 1:
        raise ShapeError(f"target shape {tuple(target)} has more than one -1")
    if -1 in target:
        rest = math.prod(d for d in target if d != -1)
        if rest == 0 or size % rest:
            raise ShapeError(f"cannot reshape {tuple(shape)} to {tuple(target)}")
        target[target.index(-1)] = size // rest
    if math.prod(target) != size:
        raise ShapeError(f"cannot reshape {tuple(shape)} ({size} elements) to {tuple(target)}")
    return tuple(int(d) for d in target)


class View(Schema):
    """Ops whose output is input 0's bytes under another shape: Reshape, Flatten, Squeeze, Unsqueeze, Identity."""

    identity = True

    def view_shape(self, node, shape):
        raise NotImplementedError

    def infer(self, node, ins):
        return [(self.view_shape(node, ins[0].shape), ins[0].dtype)]

    def evaluate(self, node, x):
        return [x.reshape(self.view_shape(node, x.shape))]

    def gradient(self, b, node, dys):
        return [b.op("Reshape", dys[0], shape=list(b.shape(node.inputs[0])))]


@schema("Reshape")
class Reshape(View):
    attr_inputs = (("shape", 1, 5),)
    defaults = {"allowzero": 0}

    def view_shape(self, node, shape):
        return reshaped(shape, self.attr(node, "shape"), self.attr(node, "allowzero"))


@schema("Flatten")
class Flatten(View):
    """Flatten: a 2-D view, the dims before `axis` in rows and the rest in columns."""

    defaults = {"axis": 1}
    def view_shape(self, node, shape):
        a = self.attr(node, "axis")
        if not -len(shape) <= a <= len(shape):
            raise ShapeError(f"axis {a} is out of range for rank {len(shape)}")
        a += len(shape) if a < 0 else 0
        return math.prod(shape[:a]), math.prod(shape[a:])


@schema("Transpose")
class Transpose(Schema):
    defaults = {"perm": None}

    def infer(self, node, ins):
        perm = self._perm(node, ins[0].rank)
        return [(tuple(ins[0].shape[p] for p in perm), ins[0].dtype)]

    def evaluate(self, node, x):
        return [np.transpose(x, self._perm(node, x.ndim))]

    def gradient(self, b, node, dys):
        perm = self._perm(node, len(b.shape(node.inputs[0])))
        return [b.op("Transpose", dys[0], perm=[int(k) for k in np.argsort(perm)])]

    def _perm(self, node, rank):
        perm = self.attr(node, "perm")
        if perm is None:
            return tuple(reversed(range(rank)))
        perm = tuple(axis(p, rank) for p in perm)
        if sorted(perm) != list(range(rank)):
            raise ShapeError(f"perm {tuple(self.attr(node, 'perm'))} is not a permutation of {rank} axes")
        return perm


@schema("Concat")
class Concat(Schema):
    def infer(self, node, ins):
        first = ins[0]
        a = axis(self.attr(node, "axis"), first.rank)
        for i in ins[1:]:
            if i.dtype != first.dtype:
                raise ShapeError(f"inputs have different dtypes {first.dtype} and {i.dtype}")
            if i.rank != first.rank or any(d != e for k, (d, e) in enumerate(zip(i.shape, first.shape)) if k != a):
                raise ShapeError(f"shapes {first.shape} and {i.shape} differ outside axis {a}")
        shape = list(first.shape)
        shape[a] = sum(i.shape[a] for i in ins)
        return [(tuple(shape), first.dtype)]

    def evaluate(self, node, *xs):
        return [np.concatenate(xs, axis=self.attr(node, "axis"))]

    def gradient(self, b, node, dys):
        """dY split back into the inputs' extents along the axis."""
        shapes = [b.shape(i) for i in node.inputs]
        a = axis(self.attr(node, "axis"), len(shapes[0]))
        parts = b.op("Split", dys[0], outputs=len(shapes), axis=a, split=[s[a] for s in shapes])
        return list(parts) if len(shapes) > 1 else [parts]


@schema("Split")
class Split(Schema):
    """Split: sizes from `split`, else `num_outputs` (or one per output) equal chunks, the last one smaller."""

    attr_inputs = (("split", 1, 13),)
    defaults = {"axis": 0, "split": None, "num_outputs": None}

    def infer(self, node, ins):
        a = axis(self.attr(node, "axis"), ins[0].rank)
        shape = list(ins[0].shape)
        outs = []
        for size in self._sizes(node, shape[a]):
            shape[a] = size
            outs.append((tuple(shape), ins[0].dtype))
        return outs

    def evaluate(self, node, x):
        a = axis(self.attr(node, "axis"), x.ndim)
        return np.split(x, np.cumsum(self._sizes(node, x.shape[a]))[:-1], axis=a)

    def gradient(self, b, node, dys):
        """The outputs' gradients concatenated back, zeros for outputs nothing differentiates."""
        parts = [dy if dy else b.const(np.zeros(b.shape(o)), node.inputs[0]) for dy, o in zip(dys, node.outputs)]
        return [b.op("Concat", *parts, axis=axis(self.attr(node, "axis"), len(b.shape(node.inputs[0]))))]

    def _sizes(self, node, dim):
        split = self.attr(node, "split")
        if split is not None:
            if len(split) != len(node.outputs) or sum(split) != dim or min(split, default=0) < 0:
                raise ShapeError(f"split {tuple(split)} must give {len(node.outputs)} sizes summing to {dim}")
            return list(split)
        n = self.attr(node, "num_outputs") or len(node.outputs)
        chunk = -(-dim // n)
        last = dim - chunk * (n - 1)
        if last < 0:
            raise ShapeError(f"a dimension of size {dim} cannot be split into {n} chunks of {chunk}")
        return [chunk] * (n - 1) + [last]


@schema("Slice")
class Slice(Schema):
    attr_inputs = (("starts", 1, 10), ("ends", 2, 10), ("axes", 3, 10), ("steps", 4, 10))
    defaults = {"axes": None, "steps": None}

    def infer(self, node, ins):
        index = self._index(node, ins[0].shape)
        return [(tuple(len(range(*s.indices(d))) for s, d in zip(index, ins[0].shape)), ins[0].dtype)]

    def evaluate(self, node, x):
        return [x[self._index(node, x.shape)]]

    def gradient(self, b, node, dys):
        """dY padded with zeros back to the input's extent. Along an axis of step k != 1, dY is first put
        in increasing order (reversed, for k < 0) and spread k apart, zeros between."""
        dy, shape, out = dys[0], b.shape(node.inputs[0]), list(b.shape(node.outputs[0]))
        begins, ends = [], []
        for a, (s, n) in enumerate(zip(self._index(node, shape), shape)):
            start, _, step = s.indices(n)
            m, k = out[a], abs(step)
            if step < 0:
                dy = b.op("Slice", dy, starts=[-1], ends=[-m - 1], axes=[a], steps=[-1])
                start += (m - 1) * step
            if k != 1:
                apart = b.op("Pad", b.op("Unsqueeze", dy, axes=[a + 1]), pads=[0, k - 1], axes=[a + 1])
                out[a] = m * k
                dy = b.op("Reshape", apart, shape=out)
            begins.append(start)
            ends.append(n - start - out[a])
        return [b.op("Pad", dy, pads=begins + ends)]

    def _index(self, node, shape):
        """One Python slice per dim, clamped as the spec says (negative steps included)."""
        starts, ends = self.attr(node, "starts"), self.attr(node, "ends")
        axes = self.attr(node, "axes")
        axes = range(len(starts)) if axes is None else [axis(a, len(shape)) for a in axes]
        steps = self.attr(node, "steps") or [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) < len(axes):
            raise ShapeError("starts, ends, axes and steps must have one entry per distinct axis")
        index = [slice(None)] * len(shape)
        for start, end, a, step in zip(starts, ends, axes, steps):
            dim = shape[a]
            start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            elif step < 0:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            else:
                raise ShapeError("slice steps must not be 0")
            index[a] = slice(start, None if end < 0 else end, step)
        return tuple(index)


def _indices(idx, dim):
    """Indices in [0, dim) from ONNX's [-dim, dim)."""
    if idx.size and not (-dim <= idx.min() and idx.max() < dim):
        raise ShapeError(f"indices out of range for a dimension of size {dim}")
    return np.where(idx < 0, idx + dim, idx)


@schema("Gather")
class Gather(Schema):
    defaults = {"axis": 0}

    def infer(self, node, ins):
        data, idx = ins
        a = axis(self.attr(node, "axis"), data.rank)
        return [(data.shape[:a] + idx.shape + data.shape[a + 1:], data.dtype)]

    def evaluate(self, node, data, idx):
        a = axis(self.attr(node, "axis"), data.ndim)
        return [np.take(data, _indices(idx, data.shape[a]), axis=a)]

    def gradient(self, b, node, dys):
        """dY added into zeros at the gathered places, repeats accumulating: a ScatterND into the data
        with the axis moved first (and dY with the indices' dims first)."""
        data, idx = node.inputs
        shape, r = b.shape(data), len(b.shape(idx))
        a = axis(self.attr(node, "axis"), len(shape))
        dy, first = dys[0], [shape[a], *shape[:a], *shape[a + 1:]]
        if a:
            dy = b.op("Transpose", dy, perm=[*range(a, a + r), *range(a), *range(a + r, len(shape) + r - 1)])
        dx = b.op("ScatterND", zeros(b, first, b.dtype(data)), b.op("Unsqueeze", wrapped(b, idx, shape[a]), axes=[-1]),
                  dy, reduction="add")
        return [b.op("Transpose", dx, perm=[*range(1, a + 1), 0, *range(a + 1, len(shape))]) if a else dx, None]


@schema("GatherElements")
class GatherElements(Schema):
    defaults = {"axis": 0}

    def infer(self, node, ins):
        data, idx = ins
        axis(self.attr(node, "axis"), data.rank)
        if idx.rank != data.rank:
            raise ShapeError(f"indices have rank {idx.rank}, data has rank {data.rank}")
        return [(idx.shape, data.dtype)]

    def evaluate(self, node, data, idx):
        a = axis(self.attr(node, "axis"), data.ndim)
        return [np.take_along_axis(data, _indices(idx, data.shape[a]), axis=a)]

    def gradient(self, b, node, dys):
        """dY added into zeros at the gathered elements, by their flat offsets into the data: each index
        (wrapped) times its axis's stride, plus the position along every other axis times that one's."""
        data, idx = node.inputs
        shape, positions = b.shape(data), b.shape(idx)
        a = axis(self.attr(node, "axis"), len(shape))
        strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
        flat = b.op("Mul", wrapped(b, idx, shape[a]), b.const(strides[a], idx))
        for k, n in enumerate(positions):
            if k != a and n > 1:
                along = (np.arange(n) * strides[k]).reshape(-1, *[1] * (len(shape) - k - 1))
                flat = b.op("Add", flat, b.const(along, idx))
        return [scatter_add_flat(b, flat, dys[0], shape, b.dtype(data)), None]

    def workspace(self, node, ins, outs, limit):
        """The kernel gathers by flat offsets: one int64 per index, then each axis's position offsets."""
        n = math.prod(ins[1].shape)
        return 8 * (n + sum(ins[1].shape)) if n else 0


@schema("Squeeze")
class Squeeze(View):
    attr_inputs = (("axes", 1, 13),)
    defaults = {"axes": None}
    def view_shape(self, node, shape):
        axes = self.attr(node, "axes")
        if axes is None:
            return tuple(d for d in shape if d != 1)
        axes = {axis(a, len(shape)) for a in axes}
        if any(shape[a] != 1 for a in axes):
            raise ShapeError(f"cannot squeeze axes {sorted(axes)} of shape {shape}: not all have size 1")
        return tuple(d for k, d in enumerate(shape) if k not in axes)


@schema("Unsqueeze")
class Unsqueeze(View):
    attr_inputs = (("axes", 1, 13),)
    def view_shape(self, node, shape):
        given = self.attr(node, "axes")
        rank = len(shape) + len(given)
        axes = {axis(a, rank) for a in given}
        if len(axes) < len(given):
            raise ShapeError(f"axes {tuple(given)} repeat an axis")
        rest = iter(shape)
        return tuple(1 if k in axes else next(rest) for k in range(rank))


@schema("Expand")
class Expand(Schema):
    attr_inputs = (("shape", 1, 8),)

    def infer(self, node, ins):
        return [(broadcast(ins[0].shape, tuple(self.attr(node, "shape"))), ins[0].dtype)]

    def evaluate(self, node, x):
        return [np.broadcast_to(x, broadcast(x.shape, tuple(self.attr(node, "shape")))).copy()]

    def gradient(self, b, node, dys):
        return [b.unbroadcast(dys[0], b.shape(node.outputs[0]), b.shape(node.inputs[0]))]


@schema("Tile")
class Tile(Schema):
    attr_inputs = (("repeats", 1, 6),)

    def infer(self, node, ins):
        repeats = self.attr(node, "repeats")
        if len(repeats) != ins[0].rank or min(repeats, default=0) < 0:
            raise ShapeError(f"repeats {tuple(repeats)} must be {ins[0].rank} non-negative numbers")
        return [(tuple(d * r for d, r in zip(ins[0].shape, repeats)), ins[0].dtype)]

    def evaluate(self, node, x):
        return [np.tile(x, self.attr(node, "repeats"))]

    def gradient(self, b, node, dys):
        """dY seen with each axis split into (repeat, dim), summed over the repeats."""
        shape, repeats = b.shape(node.inputs[0]), self.attr(node, "repeats")
        split = b.op("Reshape", dys[0], shape=[n for r, d in zip(repeats, shape) for n in (r, d)])
        return [b.op("ReduceSum", split, axes=list(range(0, 2 * len(shape), 2)), keepdims=0)]


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@schema("Pad")
class Pad(Schema):
    """Pad: `pads` holds the begin then end counts of each axis in `axes`; negative counts crop."""

    attr_inputs = (("pads", 1, 11), ("constant_value", 2, 11), ("axes", 3, 18))
    defaults = {"mode": "constant", "constant_value": 0, "axes": None}

    def infer(self, node, ins):
        shape = tuple(d + b + e for d, (b, e) in zip(ins[0].shape, self._pads(node, ins[0].rank)))
        if min(shape, default=0) < 0:
            raise ShapeError(f"pads {tuple(self.attr(node, 'pads'))} crop more than the input shape {ins[0].shape}")
        return [(shape, ins[0].dtype)]

    def evaluate(self, node, x):
        pads = self._pads(node, x.ndim)
        x = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, pads))]
        widths = [(max(b, 0), max(e, 0)) for b, e in pads]
        if self.attr(node, "mode") == "constant":
            return [np.pad(x, widths, constant_values=np.asarray(self.attr(node, "constant_value"), x.dtype))]
        return [np.pad(x, widths, mode=self.attr(node, "mode"))]

    def gradient(self, b, node, dys):
        """Constant padding: the padded border cut off again (a negative pad, which crops, pads back).
        The other modes copy input positions along each axis (`pad_source`): dY goes back through that
        copy's matrix, axis by axis."""
        x, mode = node.inputs[0], self.attr(node, "mode")
        pads = self._pads(node, len(b.shape(x)))
        if mode == "constant":
            return [b.op("Pad", dys[0], pads=[-p for p, _ in pads] + [-p for _, p in pads])]
        dy, shape = dys[0], list(b.shape(node.outputs[0]))
        for a, (n, (begin, end)) in enumerate(zip(b.shape(x), pads)):
            if begin or end:
                lo = max(-begin, 0)
                source = lo + pad_source(mode, np.arange(shape[a]) - max(begin, 0), n - lo - max(-end, 0))
                copy = np.zeros((shape[a], n))
                copy[np.arange(shape[a]), source] = 1
                dy = transposed_along(b, dy, shape, a, copy, x)
                shape[a] = n
        return [dy]

    def _pads(self, node, rank):
        """(begin, end) for every axis of the input."""
        pads, axes = self.attr(node, "pads"), self.attr(node, "axes")
        axes = range(rank) if axes is None else [axis(a, rank) for a in axes]
        if len(pads) != 2 * len(axes):
            raise ShapeError(f"pads {tuple(pads)} must have 2 entries per padded axis ({len(axes)})")
        if self.attr(node, "mode") not in _PAD_MODES:
            raise ShapeError(f"mode {self.attr(node, 'mode')!r} is not one of {', '.join(_PAD_MODES)}")
        per_axis = [(0, 0)] * rank
        for k, a in enumerate(axes):
            per_axis[a] = (pads[k], pads[k + len(axes)])
        return per_axis


def pad_source(mode, j, n):
    """The input position (of `n`) that positions `j` (counted from the input's start) copy in `mode`."""
    if mode == "edge":
        return np.clip(j, 0, n - 1)
    if mode == "wrap":
        return j % n
    period = max(2 * (n - 1), 1)  # reflect, as NumPy repeats it past the far end
    j = j % period
    return np.where(j < n, j, period - j)


def transposed_along(b, dy, shape, a, matrix, like):
    """`dy` (of `shape`) times `matrix` (out, in) along axis `a`, transposed: the gradient of a linear map
    of that axis (Resize's passes, Pad's copies). A MatMul over dY with the axis last or, seen as
    (before, out, after), one from the left; the matrix a constant of `like`'s dtype."""
    if a == len(shape) - 1:
        return b.op("MatMul", dy, b.const(matrix, like))
    before, after = math.prod(shape[:a]), math.prod(shape[a + 1:])
    out = b.op("MatMul", b.const(matrix.T, like), b.op("Reshape", dy, shape=[before, shape[a], after]))
    return b.op("Reshape", out, shape=[*shape[:a], matrix.shape[1], *shape[a + 1:]])


@schema("Resize")
class Resize(Schema):
    """Resize: the output is floor(input * scale) per resized axis, or `sizes` (kept in aspect by the policy)."""

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
        axes = self._axes(node, len(in_shape))
        if scales is None:
            scales = [n / in_shape[a] for a, n in zip(axes, sizes)]
            pick = {"not_larger": min, "not_smaller": max}.get(self.attr(node, "keep_aspect_ratio_policy"))
            scales = [pick(scales)] * len(axes) if pick else scales
        full = [1.0] * len(in_shape)
        for a, s in zip(axes, scales):
            full[a] = float(s)
        return full

    def passes(self, node, in_shape, out_shape):
        """A ResizePass for each axis that changes, in axis order (the reference skips the others too)."""
        rank, roi = len(in_shape), self.attr(node, "roi") or None
        axes = self._axes(node, rank)
        lows, highs = [0.0] * rank, [1.0] * rank
        for k, a in enumerate(axes if roi is not None else ()):
            lows[a], highs[a] = roi[k], roi[k + len(axes)]
        crop = self.attr(node, "coordinate_transformation_mode") == "tf_crop_and_resize"
        out = []
        for a, scale in enumerate(self.scales(node, in_shape)):
            kept = math.isclose(scale, 1) and in_shape[a] == out_shape[a]
            if not (kept and (not crop or math.isclose(lows[a], 0) and math.isclose(highs[a], 1))):
                out.append(_resize_pass(self, node, a, in_shape[a], out_shape[a], scale, (lows[a], highs[a])))
        return out

    def layout(self, node, in_shape, out_shape, dtype):
        """Where the kernel keeps its passes' tables and the results between passes (see ResizeLayout).
        Passes compute in the output's dtype, or in a float one for integers that they interpolate."""
        passes, dtype = self.passes(node, in_shape, out_shape), np.dtype(dtype)
        work = dtype
        if dtype.kind != "f" and any(p.weight is not None for p in passes):
            work = np.dtype(np.float32 if dtype.itemsize < 4 else np.float64)
        nbytes = {}

        def need(region, n):
            nbytes[region] = max(nbytes.get(region, 0), n)

        if work != dtype:
            need("source", math.prod(in_shape) * work.itemsize)
        shape = list(in_shape)
        for k, p in enumerate(passes):
            shape[p.axis] = out_shape[p.axis]
            size = math.prod(shape) * work.itemsize
            if k < len(passes) - 1 or work != dtype:
                need(("ping", "pong")[k % 2], size)
            if len(p.index) > 1:
                need("tap", size)
            need(f"index{k}", p.index.nbytes)
            if p.weight is not None:
                need(f"weight{k}", p.weight.size * work.itemsize)
        offsets, at = {}, 0
        for region, n in nbytes.items():
            offsets[region], at = at, at + -(-n // 256) * 256
        return ResizeLayout(passes, work, offsets, at)

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
        """The layout's bytes (not chunked to `limit`: the passes are not split)."""
        (out_shape, dtype), x = outs[0], ins[0]
        return self.layout(node, x.shape, out_shape, dtype).nbytes if math.prod(out_shape) else 0

    def _axes(self, node, rank):
        axes = self.attr(node, "axes")
        return list(range(rank)) if axes is None else [axis(a, rank) for a in axes]


class ResizePass(NamedTuple):
    """Resize along one axis: output position o is the sum over taps t of weight[t, o] * input[index[t, o]]
    (weight None: the one tap is copied as is), then extrapolation_value where `outside` holds (or None)."""

    axis: int
    index: np.ndarray
    weight: np.ndarray | None
    outside: np.ndarray | None


class ResizeLayout(NamedTuple):
    """Resize's passes, the dtype `work` they compute in, and {region: byte offset} in the workspace
    for: `source` (the input in `work`, when that is not its dtype), `ping` and `pong` (results
    between passes, alternately), `tap` (one tap of a pass), `index{k}` and `weight{k}` (pass k's)."""

    passes: list
    work: np.dtype
    offsets: dict
    nbytes: int


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
    start = int(np.floor(-(1 if mode == "linear" else 2) / s)) + 1
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


@schema("ScatterND")
class ScatterND(Schema):
    """ScatterND: data with slices at `indices` (last dim indexes data's leading dims) replaced by, or
    combined (add, mul, max, min) with, `updates`. The gradient of Gather adds into zeros with it."""

    defaults = {"reduction": "none"}
    inplace = ((0, 0),)

    def infer(self, node, ins):
        data, idx, updates = ins
        k = idx.shape[-1] if idx.rank else 0
        if not 1 <= k <= data.rank or updates.shape != idx.shape[:-1] + data.shape[k:]:
            raise ShapeError(f"indices {idx.shape} and updates {updates.shape} do not fit data {data.shape}")
        return [(data.shape, data.dtype)]

    def evaluate(self, node, data, idx, updates):
        out = data.copy()
        scatter_nd(np, out, idx, updates, self.attr(node, "reduction"))
        return [out]

    def gradient(self, b, node, dys):
        """For the none and add reductions. Data: dY, with zeros where `none` overwrote it; updates: dY
        at their places, gathered by flat offset into data's leading dims."""
        data, idx, updates = node.inputs
        reduction, dy = self.attr(node, "reduction"), dys[0]
        if reduction not in ("none", "add"):
            return [no_gradient(node)] * 3
        shape, k = b.shape(data), b.shape(idx)[-1]
        if reduction == "none":
            dy = b.op("ScatterND", dy, idx, zeros(b, b.shape(updates), b.dtype(data)))
        lead = shape[:k]
        strides = [math.prod(lead[j + 1:]) for j in range(k)]
        flat = b.op("ReduceSum", b.op("Mul", wrapped(b, idx, list(lead)), b.const(strides, idx)), axes=[-1], keepdims=0)
        rows = b.op("Reshape", dys[0], shape=[math.prod(lead), *shape[k:]])
        return [dy, None, b.op("Gather", rows, flat)]


def zeros(b, shape, dtype):
    """A new tensor of zeros."""
    return b.op("ConstantOfShape", shape=list(shape), value=np.zeros(1, dtype))


def wrapped(b, idx, dims):
    """Indices in [0, dim) from ONNX's [-dim, dim), `dims` broadcasting against them."""
    return b.op("Where", b.op("Less", idx, b.const(0, idx)), b.op("Add", idx, b.const(dims, idx)), idx)


def scatter_add_flat(b, flat, dy, shape, dtype):
    """Zeros of `shape` with dY added at the flat offsets `flat` (of dY's shape), repeats accumulating."""
    total = b.op("ScatterND", zeros(b, [math.prod(shape)], dtype), b.op("Unsqueeze", flat, axes=[-1]), dy,
                 reduction="add")
    return b.op("Reshape", total, shape=list(shape))


def scatter_nd(xp, out, idx, updates, reduction):
    """`out[idx[..., :]] (op)= updates` in place; repeated indices accumulate for add and mul."""
    where = tuple(np.moveaxis(idx, -1, 0)) if xp is np else tuple(xp.moveaxis(idx, -1, 0))
    if reduction == "none":
        out[where] = updates
        return
    ufunc = {"add": xp.add, "mul": xp.multiply, "max": xp.maximum, "min": xp.minimum}.get(reduction)
    if ufunc is None:
        raise ShapeError(f"reduction {reduction!r} is not none, add, mul, max or min")
    if xp is np:
        ufunc.at(out, where, updates)
    else:
        import cupyx
        scatter = {"add": cupyx.scatter_add, "max": cupyx.scatter_max, "min": cupyx.scatter_min}.get(reduction)
        if scatter is None:
            raise ShapeError(f"reduction {reduction!r} has no CuPy scatter")
        scatter(out, where, updates)


@schema("Identity")
class Identity(View):
    def view_shape(self, node, shape):
        return shape
