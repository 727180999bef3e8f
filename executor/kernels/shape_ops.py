"""Kernels of ops that move data without arithmetic: views, Transpose, Concat, Split, Slice, Gather,
Expand, Tile, Pad, Shape. Each copies from a view of its input into its output."""
import numpy as np

from planner import ops

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


@kernel("Tile", "Pad")
def through_numpy(xp, step, ins, outs, ws):
    evaluated(xp, step, ins, outs)


@kernel("Resize")
def resize(xp, step, ins, outs, ws):
    """Resize through ONNX's reference implementation, on the host."""
    from onnx.reference.ops.op_resize import Resize
    host = [None if a is None else (a if xp is np else xp.asnumpy(a)) for a in ins]
    names = ("roi", "scales", "sizes")
    extra = [None if attr(step, n) is None else np.asarray(attr(step, n), np.float32 if n != "sizes" else np.int64)
             for n in names]
    kwargs = {k: v for k, v in step.attrs.items() if k not in names}
    outs[0][...] = xp.asarray(Resize.eval(host[0], *extra, **kwargs))
