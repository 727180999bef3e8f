"""Kernels of ops that move data (and Resize, which moves and weighs it): views, Shape, Transpose,
Concat, Split, Slice, Gather, GatherElements, Expand, Tile, Pad, Resize.

Each copies from views of its inputs into its outputs. What else it needs (index and weight tables)
is computed on the host from the static shapes and copied into the step's workspace, so that nothing
is allocated on the device while a plan runs.
"""
import itertools
import math

import numpy as np

from planner import ops
from planner.ops.shape_ops import pad_source, scatter_nd
from planner.ops.base import take

from . import cut, kernel


def _upload(xp, dst, host):
    """Copy host values into the view `dst` (CuPy's `set` copies straight into it, allocating nothing)."""
    host = np.ascontiguousarray(np.asarray(host, dtype=dst.dtype).reshape(dst.shape))
    if xp is np:
        dst[...] = host
    else:
        dst.set(host)


def _along(a, index):
    """An index taking `index` on axis `a` (and all of every axis before it)."""
    return (slice(None),) * a + (index,)


@kernel("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
def view(xp, step, ins, outs, ws):
    """The input's bytes under the output's shape; runs only where the plan did not make the output a view."""
    xp.copyto(outs[0], ins[0].reshape(outs[0].shape))


@kernel("Shape")
def shape(xp, step, ins, outs, ws):
    _upload(xp, outs[0], ops.get("Shape").sliced_dims(step, ins[0].shape))


@kernel("Expand")
def expand(xp, step, ins, outs, ws):
    xp.copyto(outs[0], ins[0])  # copyto broadcasts its source


@kernel("Transpose")
def transpose(xp, step, ins, outs, ws):
    xp.copyto(outs[0], ins[0].transpose(ops.get("Transpose").permutation(step, ins[0].ndim)))


@kernel("Concat")
def concat(xp, step, ins, outs, ws):
    """Each input into its stretch of the output along the axis."""
    a, at = step.attrs["axis"] % outs[0].ndim, 0
    for x in ins:
        xp.copyto(outs[0][_along(a, slice(at, at + x.shape[a]))], x)
        at += x.shape[a]


@kernel("Split")
def split(xp, step, ins, outs, ws):
    """Each output from its stretch of the input along the axis (omitted outputs skipped)."""
    x, at = ins[0], 0
    a = step.attrs["axis"] % x.ndim
    for y, size in zip(outs, ops.get("Split").split_sizes(step, x.shape[a])):
        if y is not None:
            xp.copyto(y, x[_along(a, slice(at, at + size))])
        at += size


@kernel("Slice")
def slice_(xp, step, ins, outs, ws):
    xp.copyto(outs[0], ins[0][ops.get("Slice").slices(step, ins[0].shape)])


@kernel("Gather")
def gather(xp, step, ins, outs, ws):
    """Negative indices count from the end; on NumPy they are checked first, then taken straight into the
    output (see ops.base.take)."""
    data, idx = ins
    a = step.attrs["axis"] % data.ndim
    n = data.shape[a]
    low, high = (int(idx.min()), int(idx.max())) if idx.size and xp is np else (0, 0)
    if low < -n or high >= n:
        raise IndexError(f"index {low if low < -n else high} is out of bounds for axis {a} with size {n}")
    take(xp, data, idx, a, outs[0])


@kernel("GatherElements")
def gather_elements(xp, step, ins, outs, ws):
    """A gather from the flattened data at offsets built in the workspace's `flat`: each index (wrapped
    when negative) times its axis's stride, plus the position along every other axis times that one's
    (from `offsets{k}`)."""
    (data, idx), y = ins, outs[0]
    if not y.size:
        return
    a = step.attrs["axis"] % data.ndim
    strides = [math.prod(data.shape[k + 1:]) for k in range(data.ndim)]
    flat = ws["flat"]
    xp.copyto(flat, idx)
    xp.remainder(flat, data.shape[a], out=flat)
    xp.multiply(flat, strides[a], out=flat)
    for k, n in enumerate(idx.shape):
        if k != a and n > 1:
            offsets = ws[f"offsets{k}"]
            _upload(xp, offsets, np.arange(n) * strides[k])
            xp.add(flat, offsets, out=flat)
    if xp is np:
        np.take(data.reshape(-1), flat, out=y, mode="clip")  # in range already; "raise" would buffer the output
    else:
        xp.take(data.reshape(-1), flat, out=y)


@kernel("ScatterND")
def scatter(xp, step, ins, outs, ws):
    data, idx, updates = ins
    if outs[0] is not data:
        xp.copyto(outs[0], data)
    scatter_nd(xp, outs[0], idx, updates, step.attrs["reduction"])


@kernel("Tile")
def tile(xp, step, ins, outs, ws):
    """The output seen with each axis split into (repeat, dim): the input broadcast over the repeats."""
    x, y = ins[0], outs[0]
    pairs = [n for r, d in zip(step.attrs["repeats"], x.shape) for n in (r, d)]
    xp.copyto(y.reshape(pairs), x.reshape([n for d in x.shape for n in (1, d)]))


@kernel("Pad")
def pad(xp, step, ins, outs, ws):
    """Constant mode fills the output and copies the kept input (negative pads crop it) inside. The
    other modes copy blocks of the kept input: along each axis the output splits into runs whose input
    positions step by -1, 0 (broadcast) or 1, and each combination of runs over the axes is one copy
    (from the input, never from the output itself, which CuPy would first copy aside)."""
    x, y = ins[0], outs[0]
    pads, mode = ops.get("Pad").pad_widths(step, x.ndim), step.attrs["mode"]
    kept = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, pads))]
    if mode == "constant":
        y.fill(np.asarray(step.attrs["constant_value"], y.dtype).reshape(())[()])
        xp.copyto(y[(*(slice(max(b, 0), max(b, 0) + n) for n, (b, _) in zip(kept.shape, pads)), ...)], kept)
        return
    if not kept.size:
        return
    blocks = []
    for n, (b, _), length in zip(kept.shape, pads, y.shape):
        source = pad_source(mode, np.arange(length) - max(b, 0), n)
        blocks.append([(slice(lo, hi), _taken(source[lo], stride, hi - lo)) for lo, hi, stride in _runs(source)])
    for block in itertools.product(*blocks):
        xp.copyto(y[(*(to for to, _ in block), ...)], kept[(*(taken for _, taken in block), ...)])


def _runs(source):
    """(start, stop, stride): runs of consecutive positions whose sources step by one same -1, 0 or 1."""
    runs, start = [], 0
    for p in range(1, len(source) + 1):
        step = source[p] - source[p - 1] if p < len(source) else None
        if step is not None and abs(step) <= 1 and (p == start + 1 or step == source[start + 1] - source[start]):
            continue
        runs.append((start, p, int(source[start + 1] - source[start]) if p > start + 1 else 1))
        start = p
    return runs


def _taken(first, stride, length):
    """The slice of `length` positions from `first` on by `stride` (0: the one position, to broadcast)."""
    if stride == 0:
        return slice(first, first + 1)
    end = first + stride * length
    return slice(first, end if end >= 0 else None, stride)


@kernel("Resize")
def resize(xp, step, ins, outs, ws):
    """One resized axis at a time (see planner.ops.resize.ResizePass): the taps gathered, weighed and
    summed between buffers of the workspace (see Resize.workspace); integers interpolate in a float
    dtype, that of the workspace's `source`, then round. The passes' tables are the schema's, computed
    on the host from the static shapes and copied into the workspace."""
    x, y = ins[0], outs[0]
    if not y.size:
        return
    passes = ops.get("Resize").passes(step, x.shape, y.shape)
    src, shape = x, list(x.shape)
    work = ws["source"].dtype if "source" in ws else y.dtype
    if work != y.dtype:
        src = ws["source"]
        xp.copyto(src, x)
    for k, p in enumerate(passes):
        shape[p.axis] = y.shape[p.axis]
        last = k == len(passes) - 1
        dst = y if last and work == y.dtype else cut(ws[("ping", "pong")[k % 2]], shape, work)
        index = ws[f"index{k}"]
        _upload(xp, index, p.index)
        weight = ws.get(f"weight{k}")
        if weight is not None:
            _upload(xp, weight, p.weight)
        tap = cut(ws["tap"], shape, work) if len(p.index) > 1 else None
        _resample(xp, src, dst, p.axis, index, weight, tap)
        if p.outside is not None:
            edges = np.flatnonzero(np.diff(np.concatenate([[0], p.outside.astype(np.int8), [0]])))
            for lo, hi in edges.reshape(-1, 2):
                dst[_along(p.axis, slice(lo, hi))].fill(step.attrs["extrapolation_value"])
        src = dst
    if src is not y:
        if y.dtype.kind in "iu" and src.dtype != y.dtype:
            info = np.iinfo(y.dtype)
            xp.rint(src, out=src)
            xp.clip(src, info.min, info.max, out=src)
        xp.copyto(y, src, casting="unsafe")


def _resample(xp, src, dst, a, index, weight, tap):
    """dst = the sum over taps t of weight[t] * src gathered at index[t] along axis `a` (`tap` holds one
    weighed tap); without weights, the one tap as it is."""
    xp.take(src, index[0], axis=a, out=dst)
    if weight is None:
        return
    along = (-1,) + (1,) * (dst.ndim - a - 1)
    xp.multiply(dst, weight[0].reshape(along), out=dst)
    for i, w in zip(index[1:], weight[1:]):
        xp.take(src, i, axis=a, out=tap)
        xp.multiply(tap, w.reshape(along), out=tap)
        xp.add(dst, tap, out=dst)
