"""Ops that move data without arithmetic: Shape, Transpose, Concat, Split, Slice, Expand, Tile, Pad, ScatterND
(the views are in views.py, Gather in indexing.py, Resize in resize.py)."""
import math

import numpy as np

from .registry import schema
from .base import Schema, axis, broadcast, no_flops, no_gradient
from .torch_forms import torch_pads, unsupported
from ..errors import ShapeError


@schema("Shape")
class Shape(Schema):
    result = np.int64
    defaults = {"start": 0, "end": None}
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        return [((len(self.sliced_dims(node, ins[0].shape)),), np.int64)]

    def fold(self, node, ins):
        return [np.array(self.sliced_dims(node, ins[0].shape), dtype=np.int64)]

    def sliced_dims(self, node, shape):
        """The dims Shape returns: `shape` from `start` to `end`."""
        end = self.attr(node, "end")
        return shape[self.attr(node, "start"):len(shape) if end is None else end]


@schema("Transpose")
class Transpose(Schema):
    split = "transpose"
    ranks = "same"
    defaults = {"perm": None}

    def infer(self, node, ins):
        perm = self.permutation(node, ins[0].rank)
        return [(tuple(ins[0].shape[p] for p in perm), ins[0].dtype)]

    def evaluate(self, node, x):
        return [np.transpose(x, self.permutation(node, x.ndim))]

    def gradient(self, b, node, dys):
        perm = self.permutation(node, len(b.shape(node.inputs[0])))
        return [b.op("Transpose", dys[0], perm=[int(k) for k in np.argsort(perm)])]

    def permutation(self, node, rank):
        """The axes in their new order: `perm`, or all of them reversed."""
        perm = self.attr(node, "perm")
        if perm is None:
            return tuple(reversed(range(rank)))
        perm = tuple(axis(p, rank) for p in perm)
        if sorted(perm) != list(range(rank)):
            raise ShapeError(f"perm {tuple(self.attr(node, 'perm'))} is not a permutation of {rank} axes")
        return perm

    def torch_node(self, torch, run, node, ins):
        return ins[0].permute(self.permutation(node, ins[0].ndim))


@schema("Concat")
class Concat(Schema):
    split = "concat"
    ranks = "same"
    mirror = False

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

    def torch_node(self, torch, run, node, ins):
        return torch.cat(ins, self.attr(node, "axis"))


@schema("Split")
class Split(Schema):
    """Split: sizes from `split`, else `num_outputs` (or one per output) equal chunks, the last one smaller."""

    split = "split"
    ranks = "same"
    attr_inputs = (("split", 1, 13),)
    defaults = {"axis": 0, "split": None, "num_outputs": None}

    def infer(self, node, ins):
        a = axis(self.attr(node, "axis"), ins[0].rank)
        shape = list(ins[0].shape)
        outs = []
        for size in self.split_sizes(node, shape[a]):
            shape[a] = size
            outs.append((tuple(shape), ins[0].dtype))
        return outs

    def evaluate(self, node, x):
        a = axis(self.attr(node, "axis"), x.ndim)
        return np.split(x, np.cumsum(self.split_sizes(node, x.shape[a]))[:-1], axis=a)

    def gradient(self, b, node, dys):
        """The outputs' gradients concatenated back, zeros for outputs nothing differentiates."""
        parts = [dy if dy else b.const(np.zeros(b.shape(o)), node.inputs[0]) for dy, o in zip(dys, node.outputs)]
        return [b.op("Concat", *parts, axis=axis(self.attr(node, "axis"), len(b.shape(node.inputs[0]))))]

    def split_sizes(self, node, dim):
        """Each output's size along the split axis of size `dim`."""
        split = self.attr(node, "split")
        if split is not None:
            if len(split) != len(node.outputs) or sum(split) != dim or min(split, default=0) < 0:
                raise ShapeError(f"split {tuple(split)} must give {len(node.outputs)} sizes summing to {dim}")
            return list(split)
        n = self.attr(node, "num_outputs")
        if n is None and dim % len(node.outputs):
            raise ShapeError(f"a dimension of size {dim} does not split evenly into {len(node.outputs)} outputs; "
                             "give `split` (or, from opset 18, `num_outputs` for a smaller last chunk)")
        n = n or len(node.outputs)
        if n < 1:
            raise ShapeError(f"num_outputs {n} must be at least 1")
        chunk = -(-dim // n)
        last = dim - chunk * (n - 1)
        if last < 0:
            raise ShapeError(f"a dimension of size {dim} cannot be split into {n} chunks of {chunk}")
        return [chunk] * (n - 1) + [last]

    def torch_node(self, torch, run, node, ins):
        a = self.attr(node, "axis") % ins[0].ndim
        return torch.split(ins[0], self.split_sizes(node, ins[0].shape[a]), a)


@schema("Slice")
class Slice(Schema):
    split = "slice"
    ranks = "same"
    attr_inputs = (("starts", 1, 10), ("ends", 2, 10), ("axes", 3, 10), ("steps", 4, 10))
    defaults = {"axes": None, "steps": None}

    def infer(self, node, ins):
        index = self.slices(node, ins[0].shape)
        return [(tuple(len(range(*s.indices(d))) for s, d in zip(index, ins[0].shape)), ins[0].dtype)]

    def evaluate(self, node, x):
        return [x[self.slices(node, x.shape)]]

    def gradient(self, b, node, dys):
        """dY padded with zeros back to the input's extent. Along an axis of step k != 1, dY is first put
        in increasing order (reversed, for k < 0) and spread k apart, zeros between."""
        dy, shape, out = dys[0], b.shape(node.inputs[0]), list(b.shape(node.outputs[0]))
        begins, ends = [], []
        for a, (s, n) in enumerate(zip(self.slices(node, shape), shape)):
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

    def slices(self, node, shape):
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

    def torch_node(self, torch, run, node, ins):
        """Positive steps as a Python index; negative ones (which torch refuses) by index_select."""
        x, index = ins[0], self.slices(node, ins[0].shape)
        x = x[tuple(s if (s.step or 1) > 0 else slice(None) for s in index)]
        for a, s in enumerate(index):
            if (s.step or 1) < 0:
                x = x.index_select(a, torch.arange(*s.indices(x.shape[a]), device=x.device))
        return x


@schema("Expand")
class Expand(Schema):
    split = "expand"
    attr_inputs = (("shape", 1, 8),)

    def infer(self, node, ins):
        return [(broadcast(ins[0].shape, tuple(self.attr(node, "shape"))), ins[0].dtype)]

    def evaluate(self, node, x):
        return [np.broadcast_to(x, broadcast(x.shape, tuple(self.attr(node, "shape")))).copy()]

    def gradient(self, b, node, dys):
        return [b.unbroadcast(dys[0], b.shape(node.outputs[0]), b.shape(node.inputs[0]))]

    def torch_node(self, torch, run, node, ins):
        return ins[0].expand(run.shape(node.outputs[0]))


@schema("Tile")
class Tile(Schema):
    ranks = "same"
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

    def torch_node(self, torch, run, node, ins):
        return ins[0].repeat(self.attr(node, "repeats"))


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@schema("Pad")
class Pad(Schema):
    """Pad: `pads` holds the begin then end counts of each axis in `axes`; negative counts crop."""

    ranks = "same"
    attr_inputs = (("pads", 1, 11), ("constant_value", 2, 11), ("axes", 3, 18))
    defaults = {"mode": "constant", "constant_value": 0, "axes": None}

    def infer(self, node, ins):
        widths = self.pad_widths(node, ins[0].rank)
        shape = tuple(d + b + e for d, (b, e) in zip(ins[0].shape, widths))
        if min(shape, default=0) < 0:
            raise ShapeError(f"pads {tuple(self.attr(node, 'pads'))} crop more than the input shape {ins[0].shape}")
        mode = self.attr(node, "mode")
        empty = [a for a, (d, (b, e)) in enumerate(zip(ins[0].shape, widths)) if d + min(b, 0) + min(e, 0) == 0
                 and max(b, e) > 0]
        if mode != "constant" and empty:
            raise ShapeError(f"mode {mode!r} copies values along the axis it pads, but axis {empty[0]} of the input "
                             f"{ins[0].shape} holds none")
        return [(shape, ins[0].dtype)]

    def evaluate(self, node, x):
        pads = self.pad_widths(node, x.ndim)
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
        pads = self.pad_widths(node, len(b.shape(x)))
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

    def pad_widths(self, node, rank):
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

    def torch_node(self, torch, run, node, ins):
        if self.attr(node, "mode") != "constant":
            raise unsupported(f"{node.op} with mode {self.attr(node, 'mode')}")
        value = float(np.asarray(self.attr(node, "constant_value")).reshape(-1)[0])
        return torch.nn.functional.pad(ins[0], torch_pads(*zip(*self.pad_widths(node, ins[0].ndim))), value=value)


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
        if reduction in ("max", "min") and out.dtype == np.float64:  # measured on an H100, 2026-11-27
            raise ShapeError(f"reduction {reduction!r} of float64 has no exact CuPy scatter "
                             "(cupyx.scatter_max/min round to float32)")
        import cupyx
        scatter = {"add": cupyx.scatter_add, "max": cupyx.scatter_max, "min": cupyx.scatter_min}.get(reduction)
        if scatter is None:
            raise ShapeError(f"reduction {reduction!r} has no CuPy scatter")
        scatter(out, where, updates)
