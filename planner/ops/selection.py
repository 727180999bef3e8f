"""Ops that pick or mark elements: TopK (the k extremes and their indices), Hardmax and OneHot (ones at
picked places), EyeLike, Size, CastLike. Their kernels see the data as (outer, n, inner) around the
chosen axis and keep every index table in their workspace, so that they allocate nothing."""
import math
from dataclasses import replace

import numpy as np

from .registry import get, register, schema
from .base import Layout, Schema, axis, no_flops, same_as_input, take
from .shape_ops import zeros
from .torch_forms import torch_dtype
from .. import dtypes
from ..errors import ShapeError


def around(shape, a):
    """(outer, n, inner): the elements before axis `a`, along it, and after it."""
    return math.prod(shape[:a]), shape[a], math.prod(shape[a + 1:])


def count_into(xp, out, step=1):
    """Fill `out` (contiguous) with 0, step, 2 step, ... in its flat order, on the device it lives on."""
    flat = out.reshape(-1)
    flat.fill(step)
    xp.cumsum(flat, out=flat)
    xp.subtract(flat, step, out=flat)
    return out


def one_k(value, what):
    """A count given as a scalar or a one-element list (k, depth), as an int."""
    values = np.ravel(value)
    if values.size != 1:
        raise ShapeError(f"{what} must be one value, got {list(values)}")
    return int(values[0])


@schema("TopK")
class TopK(Schema):
    """TopK: the k largest (or smallest) values along `axis`, sorted, and their int64 indices; equal
    values come lowest index first. k is an input known when planning. The kernel picks one extreme
    at a time (arg-extreme of a working copy, then the pick replaced by a sentinel), so it needs no sort
    and no temporaries: O(k n) comparisons per row, for the small k models use."""

    attr_inputs = (("k", 1, 10),)
    defaults = {"k": None, "axis": -1, "largest": 1, "sorted": 1}
    flops = staticmethod(no_flops)

    def k(self, node, shape):
        a = axis(self.attr(node, "axis"), len(shape))
        if self.attr(node, "k") is None:
            raise ShapeError("TopK needs its k input")
        k = one_k(self.attr(node, "k"), "k")
        if not 0 <= k <= shape[a]:
            raise ShapeError(f"k {k} must be from 0 to the size {shape[a]} of axis {a}")
        return a, k

    def infer(self, node, ins):
        a, k = self.k(node, ins[0].shape)
        shape = ins[0].shape[:a] + (k,) + ins[0].shape[a + 1:]
        return [(shape, ins[0].dtype), (shape, np.dtype(np.int64))]

    def workspace(self, node, ins, outs, limit):
        """Rows with the axis last, contiguous (so that an arg-extreme reads them in place): `work` the data,
        `taken` the picked places; per row, the pick, its flat offset and value, and the row's start."""
        a, _ = self.k(node, ins[0].shape)
        outer, n, inner = around(ins[0].shape, a)
        rows, one = (outer, inner, n), (outer, inner, 1)
        return Layout.pack(("work", rows, ins[0].dtype), ("taken", rows, np.bool_), ("pick", one, np.int64),
                           ("other", one, np.int64), ("flat", one, np.int64), ("start", one, np.int64),
                           ("got", one, ins[0].dtype), ("hit", one, np.bool_))

    def sentinel(self, node, dtype):
        """A value no pick prefers to any other: the lowest of the dtype for the largest, else the highest."""
        largest = bool(self.attr(node, "largest"))
        if dtypes.is_float(dtype):
            return dtype.type(-np.inf if largest else np.inf)
        info = np.iinfo(dtype)
        return dtype.type(info.min if largest else info.max)

    def compute(self, xp, node, x, values, indices, ws):
        a, k = self.k(node, x.shape)
        outer, n, inner = around(x.shape, a)
        if not values.size:
            return
        work, taken = ws["work"].reshape(outer, inner, n), ws["taken"].reshape(outer, inner, n)
        pick, other, flat, start, got, hit = (ws[s].reshape(outer, inner, 1)
                                              for s in ("pick", "other", "flat", "start", "got", "hit"))
        xp.copyto(work, x.reshape(outer, n, inner).transpose(0, 2, 1))
        taken.fill(False)
        count_into(xp, start, n)
        extreme, sentinel = xp.argmax if self.attr(node, "largest") else xp.argmin, self.sentinel(node, x.dtype)
        values3, indices3 = values.reshape(outer, k, inner), indices.reshape(outer, k, inner)
        for j in range(k):
            extreme(work, axis=2, out=pick, keepdims=True)
            xp.add(start, pick, out=flat)
            take(xp, work.reshape(-1), flat, 0, got)
            xp.equal(got, sentinel, out=hit)  # all left hold the sentinel's value: the first not taken
            xp.argmin(taken, axis=2, out=other, keepdims=True)
            xp.copyto(pick, other, where=hit)
            xp.add(start, pick, out=flat)
            take(xp, work.reshape(-1), flat, 0, got)  # not taken yet, so the data's value
            xp.copyto(indices3[:, j:j + 1], pick.reshape(outer, 1, inner))
            xp.copyto(values3[:, j:j + 1], got.reshape(outer, 1, inner))
            work.reshape(-1)[flat] = sentinel
            taken.reshape(-1)[flat] = True

    def evaluate(self, node, x):
        a, k = self.k(node, x.shape)
        if self.attr(node, "largest"):  # the reversed data sorted up, read backwards: ties lowest index first
            order = x.shape[a] - 1 - np.flip(np.argsort(np.flip(x, a), axis=a, kind="stable"), a)
        else:
            order = np.argsort(x, axis=a, kind="stable")
        index = np.take(order, np.arange(k), axis=a)
        return [np.take_along_axis(x, index, axis=a), index.astype(np.int64)]

    def kernel(self, xp, step, ins, outs, ws):
        self.compute(xp, step, ins[0], outs[0], outs[1], ws)

    def gradient(self, b, node, dys):
        """dY of the values added into zeros at their indices (ScatterElements with add)."""
        x = node.inputs[0]
        if dys[0] is None:
            return [None]
        a, _ = self.k(node, b.shape(x))
        return [b.op("ScatterElements", zeros(b, b.shape(x), b.dtype(x)), node.outputs[1], dys[0], axis=a,
                     reduction="add")]

    def torch(self, torch, x, k, axis, largest, sorted):
        """A stable sort (equal values keep their order, as ONNX wants), cut to k."""
        a, k = axis % x.ndim, one_k(k, "k")
        values, indices = torch.sort(x, dim=a, descending=bool(largest), stable=True)
        return [values.narrow(a, 0, k), indices.narrow(a, 0, k)]


class Hardmax(Schema):
    """Hardmax: 1 at the first largest value along `axis`, 0 elsewhere. Before opset 13 the input is seen
    as 2-D, the dims from `axis` on (default 1) as one row."""

    flops = staticmethod(no_flops)

    def __init__(self, since, default_axis, flattened):
        self.op, self.since, self.defaults, self.flattened = "Hardmax", since, {"axis": default_axis}, flattened

    def rows(self, node, shape):
        """(outer, n, inner) of the rows whose largest value is marked."""
        a = axis(self.attr(node, "axis"), len(shape))
        if self.flattened:
            return math.prod(shape[:a]), math.prod(shape[a:]), 1
        return around(shape, a)

    infer = staticmethod(same_as_input)

    def workspace(self, node, ins, outs, limit):
        """`rows`: the data with the axis last, when it is not (an arg-extreme over another axis copies
        it); `pick`, the first largest of each; `mask`, the places it marks, in the rows' order."""
        outer, n, inner = self.rows(node, ins[0].shape)
        return Layout.pack(("rows", (outer, inner, n), ins[0].dtype) if inner > 1 else None,
                           ("pick", (outer, inner, 1), np.int64), ("count", (n,), np.int64),
                           ("mask", (outer, inner, n), np.bool_))

    def kernel(self, xp, step, ins, outs, ws):
        outer, n, inner = self.rows(step, ins[0].shape)
        if not outer * n * inner:
            return
        rows = ins[0].reshape(outer, n, inner).transpose(0, 2, 1)
        if inner > 1:
            xp.copyto(ws["rows"].reshape(outer, inner, n), rows)
            rows = ws["rows"].reshape(outer, inner, n)
        mask, pick = ws["mask"].reshape(outer, inner, n), ws["pick"].reshape(outer, inner, 1)
        xp.argmax(rows, axis=2, out=pick, keepdims=True)
        xp.equal(pick, count_into(xp, ws["count"]), out=mask)
        xp.copyto(outs[0].reshape(outer, n, inner), mask.transpose(0, 2, 1))

    def evaluate(self, node, x):
        shape = self.rows(node, x.shape)
        pick = np.argmax(x.reshape(shape), axis=1)[:, None]
        return [(pick == np.arange(shape[1])[:, None]).astype(x.dtype).reshape(x.shape)]

    def torch(self, torch, x, axis):
        a = axis % x.ndim
        rows = x.flatten(a) if self.flattened else x.movedim(a, -1)
        marked = torch.nn.functional.one_hot(rows.argmax(-1), rows.shape[-1]).to(x.dtype)
        return marked.reshape(x.shape) if self.flattened else marked.movedim(-1, a)


@schema("OneHot")
class OneHot(Schema):
    """OneHot: values[1] where an index (of `indices`, negative ones counting from `depth`) meets its
    position along the new axis `axis` of size `depth`, values[0] elsewhere; indices outside
    [-depth, depth) mark nothing. depth is an input known when planning; values stay a tensor (their
    dtype is the output's)."""

    attr_inputs = (("depth", 1, 9),)
    defaults = {"depth": None, "axis": -1}
    flops = staticmethod(no_flops)

    def sizes(self, node, shape):
        """(new axis, depth)."""
        if self.attr(node, "depth") is None:
            raise ShapeError("OneHot needs its depth input")
        depth = one_k(self.attr(node, "depth"), "depth")
        if depth < 1:
            raise ShapeError(f"depth {depth} must be at least 1")
        return axis(self.attr(node, "axis"), len(shape) + 1), depth

    def infer(self, node, ins):
        indices, values = ins[0], ins[2]
        a, depth = self.sizes(node, indices.shape)
        if math.prod(values.shape) != 2:
            raise ShapeError(f"values must hold 2 values (off, on), got shape {values.shape}")
        return [(indices.shape[:a] + (depth,) + indices.shape[a:], values.dtype)]

    def workspace(self, node, ins, outs, limit):
        a, depth = self.sizes(node, ins[0].shape)
        return Layout.pack(("index", ins[0].shape, np.int64), ("shift", ins[0].shape, np.int64),
                           ("count", (depth, 1), np.int64), ("mask", outs[0][0], np.bool_))

    def kernel(self, xp, step, ins, outs, ws):
        indices, _, values = ins
        a, depth = self.sizes(step, indices.shape)
        shape = (math.prod(indices.shape[:a]), depth, math.prod(indices.shape[a:]))
        y, index, shift = outs[0].reshape(shape), ws["index"], ws["shift"]
        xp.copyto(index, indices, casting="unsafe")
        xp.less(index, 0, out=shift)  # depth added to the negative ones (CuPy's ufuncs take no `where`)
        xp.multiply(shift, depth, out=shift)
        xp.add(index, shift, out=index)
        mask = ws["mask"].reshape(shape)
        xp.equal(index.reshape(shape[0], 1, shape[2]), count_into(xp, ws["count"]), out=mask)
        flat = values.reshape(-1)
        xp.copyto(y, flat[0])
        xp.copyto(y, flat[1], where=mask)

    def evaluate(self, node, indices, _, values):
        a, depth = self.sizes(node, indices.shape)
        index = indices.astype(np.int64)
        index = np.expand_dims(np.where(index < 0, index + depth, index), a)
        count = np.arange(depth).reshape([-1] + [1] * (indices.ndim - a))
        flat = values.reshape(-1)
        return [np.where(index == count, flat[1], flat[0]).astype(values.dtype)]

    def torch(self, torch, indices, _, values, depth, axis):
        depth = one_k(depth, "depth")
        a = axis % (indices.ndim + 1)
        index = indices.long()
        index = torch.where(index < 0, index + depth, index).unsqueeze(a)
        count = torch.arange(depth, device=indices.device).reshape([-1] + [1] * (indices.ndim - a))
        flat = values.reshape(-1)
        return torch.where(index == count, flat[1], flat[0])


@schema("EyeLike")
class EyeLike(Schema):
    """EyeLike: a 2-D tensor of the input's shape with ones on diagonal k, zeros elsewhere, of `dtype`
    (default: the input's)."""

    defaults = {"dtype": None, "k": 0}
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        if ins[0].rank != 2:
            raise ShapeError(f"input has rank {ins[0].rank}, EyeLike needs 2")
        dtype = self.attr(node, "dtype")
        return [(ins[0].shape, ins[0].dtype if dtype is None else dtypes.from_onnx(dtype))]

    def diagonal(self, node, y):
        """The view of `y` (2-D, contiguous) over diagonal k."""
        rows, cols = y.shape
        k = self.attr(node, "k")
        first, length = (k, min(rows, cols - k)) if k >= 0 else (-k * cols, min(rows + k, cols))
        return y.reshape(-1)[first:][:max(length, 0) * (cols + 1)][::cols + 1]

    def fold(self, node, ins):
        shape, dtype = self.infer(node, ins)[0]
        return [np.eye(*shape, k=self.attr(node, "k"), dtype=dtype)]

    def kernel(self, xp, step, ins, outs, ws):
        outs[0].fill(0)
        self.diagonal(step, outs[0]).fill(1)

    def torch(self, torch, x, dtype, k):
        like = x.dtype if dtype is None else torch_dtype(torch, dtypes.from_onnx(dtype))
        y = torch.zeros(x.shape, dtype=like, device=x.device)
        y.diagonal(k).fill_(1)
        return y


@schema("Size")
class Size(Schema):
    """Size: the number of elements of the input, an int64 scalar known from its shape."""

    result = np.int64
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        return [((), np.dtype(np.int64))]

    def fold(self, node, ins):
        return [np.array(math.prod(ins[0].shape), np.int64)]

    def kernel(self, xp, step, ins, outs, ws):
        outs[0].fill(ins[0].size)

    def torch(self, torch, x):
        return torch.tensor(x.numel(), dtype=torch.int64, device=x.device)


@schema("CastLike")
class CastLike(Schema):
    """CastLike: input 0 cast to input 1's dtype, planned as the Cast it is (same saturate and round_mode)."""

    ranks = "same"
    defaults = {"saturate": 1, "round_mode": "up"}

    def infer(self, node, ins):
        return [(ins[0].shape, ins[1].dtype)]

    def fold(self, node, ins):
        """Cast's value when input 0's is known: input 1 gives only its dtype (often it is data)."""
        if ins[0].value is None:
            return None
        to = dtypes.to_onnx(ins[1].dtype)
        cast = replace(node, op="Cast", inputs=node.inputs[:1], attrs={**node.attrs, "to": to})
        return get("Cast").evaluate(cast, ins[0].value)

    def decompose(self, b, node):
        return [b.op("Cast", node.inputs[0], to=dtypes.to_onnx(b.dtype(node.inputs[1])), **self.arguments(node))]

    def torch(self, torch, x, like, saturate, round_mode):
        """For graphs run before planning decomposes it (planned graphs hold the Cast)."""
        return x.to(like.dtype)


register(Hardmax(1, 1, True))
register(Hardmax(13, -1, False))
