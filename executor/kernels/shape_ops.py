"""Kernels of ops that move data without arithmetic: views, Transpose, Concat, Split, Slice, Gather,
Expand, Tile, Pad, Shape. Each copies from a view of its input into its output."""
import numpy as np

from planner import ops
from planner.ops.shape_ops import scatter_nd

from . import attr, evaluated, kernel


@kernel("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Expand")
def reshaping(xp, step, ins, outs, ws):
    """Bytes unchanged (or broadcast, for Expand); the executor skips these when the plan made the
    output a view of the input."""
    x, y = ins[0], outs[0]
    xp.copyto(y, x.reshape(y.shape) if x.size == y.size and step.op != "Expand" else xp.broadcast_to(x, y.shape))


@kernel("Shape")
def shape(xp, step, ins, outs, ws):
    outs[0][...] = xp.asarray(ops.get("Shape")._dims(step, ins[0].shape), dtype=outs[0].dtype)


@kernel("Transpose")
def transpose(xp, step, ins, outs, ws):
    xp.copyto(outs[0], ins[0].transpose(ops.get("Transpose")._perm(step, ins[0].ndim)))


@kernel("Concat")
def concat(xp, step, ins, outs, ws):
    a = attr(step, "axis") % outs[0].ndim
    at = 0
    for x in ins:
        index = (slice(None),) * a + (slice(at, at + x.shape[a]),)
        xp.copyto(outs[0][index], x)
        at += x.shape[a]


@kernel("Split")
def split(xp, step, ins, outs, ws):
    x = ins[0]
    a = attr(step, "axis") % x.ndim
    at = 0
    for y, size in zip(outs, ops.get("Split")._sizes(step, x.shape[a])):
        if y is not None:
            xp.copyto(y, x[(slice(None),) * a + (slice(at, at + size),)])
        at += size


@kernel("Slice")
def slice_(xp, step, ins, outs, ws):
    xp.copyto(outs[0], ins[0][ops.get("Slice")._index(step, ins[0].shape)])


@kernel("Gather")
def gather(xp, step, ins, outs, ws):
    data, idx = ins
    xp.take(data, idx, axis=attr(step, "axis") % data.ndim, out=outs[0])  # negative indices count from the end


@kernel("GatherElements")
def gather_elements(xp, step, ins, outs, ws):
    data, idx = ins
    a = attr(step, "axis") % data.ndim
    xp.copyto(outs[0], xp.take_along_axis(data, xp.where(idx < 0, idx + data.shape[a], idx), axis=a))


@kernel("ScatterND")
def scatter(xp, step, ins, outs, ws):
    data, idx, updates = ins
    if outs[0] is not data:
        xp.copyto(outs[0], data)
    scatter_nd(xp, outs[0], idx, updates, attr(step, "reduction"))


@kernel("Tile", "Pad")
def through_numpy(xp, step, ins, outs, ws):
    evaluated(xp, step, ins, outs)


@kernel("Resize")
def resize(xp, step, ins, outs, ws):
    """Linear resizing in the common coordinate modes runs on the device, one axis at a time out of
    the planned workspace; every other mode goes through ONNX's reference implementation on the host."""
    x, y = ins[0], outs[0]
    if not ops.get("Resize").native(step) or not x.size or not y.size:
        _reference_resize(xp, step, x, y)
        return
    schema = ops.get("Resize")
    axes = schema.resampled_axes(step, x.shape, y.shape)
    if not axes:
        xp.copyto(y, x)
        return
    src, bufs = x, _resize_buffers(ws, x, y, step)
    for k, a in enumerate(axes):
        shape = y.shape[:a + 1] + src.shape[a + 1:]
        dst = y if k == len(axes) - 1 else bufs[k % 2][:_size(shape)].reshape(shape)
        tap = bufs[2][:_size(shape)].reshape(shape)
        i0, i1, w0, w1 = _linear_taps(xp, step, a, x.shape[a], y.shape[a], bufs[3:], y.dtype)
        bcast = (1,) * a + (-1,) + (1,) * (y.ndim - a - 1)
        xp.take(src, i0, axis=a, out=dst)
        xp.multiply(dst, w0.reshape(bcast), out=dst)
        xp.take(src, i1, axis=a, out=tap)
        xp.multiply(tap, w1.reshape(bcast), out=tap)
        xp.add(dst, tap, out=dst)
        src = dst


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))


def _resize_buffers(ws, x, y, step):
    """Two ping-pong buffers and a tap buffer of the largest pass, then room for the tables."""
    n, tables_at = ops.get("Resize").layout(step, x.shape, y.shape, y.dtype)
    flat = ws[:3 * n * y.dtype.itemsize].view(y.dtype)
    return [flat[:n], flat[n:2 * n], flat[2 * n:], ws[tables_at:]]


def _linear_taps(xp, step, a, n_in, n_out, room, dtype):
    """Source indices and weights of each output position along axis `a`, written into the workspace."""
    scale = ops.get("Resize").axis_scale(step, a, n_in, n_out)
    o = np.arange(n_out, dtype=np.float64)
    mode = attr(step, "coordinate_transformation_mode")
    if mode == "align_corners":  # the resized length is n_in * scale, unrounded, as the spec computes it
        pos = o * (n_in - 1) / (n_in * scale - 1) if n_in * scale != 1 else np.zeros(n_out)
    elif mode == "asymmetric":
        pos = o / scale
    else:
        pos = (o + 0.5) / scale - 0.5
        if mode == "pytorch_half_pixel" and n_out == 1:
            pos = np.zeros(n_out)
    pos = np.clip(pos, 0, n_in - 1)
    i0 = np.floor(pos).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = (pos - i0).astype(dtype)
    tables = (i0, i1, (1 - w1).astype(dtype), w1)
    out, at = [], 0
    for t in tables:
        view = room[0][at:at + t.nbytes].view(t.dtype)
        view.set(t) if hasattr(view, "set") else view.__setitem__(Ellipsis, t)
        out.append(view)
        at += t.nbytes
    return out


def _reference_resize(xp, step, x, y):
    from onnx.reference.ops.op_resize import Resize
    host = x if xp is np else xp.asnumpy(x)
    names = ("roi", "scales", "sizes")
    extra = [None if attr(step, n) is None else np.asarray(attr(step, n), np.float32 if n != "sizes" else np.int64)
             for n in names]
    kwargs = {k: v for k, v in step.attrs.items() if k not in names}
    y[...] = xp.asarray(Resize.eval(host, *extra, **kwargs))
