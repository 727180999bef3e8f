"""Ops that write parts of a tensor: ScatterElements (updates at element indices along an axis, combined
or not), TensorScatter (a KV cache's rows written at each sample's position), ReverseSequence (each
sample's first steps reversed). The scatters write their output in place of their data where the plan
allows; the positions they write are computed in their workspace, or read from small index inputs."""
import math

import numpy as np

from .registry import get, schema
from .base import Schema, axis, constant_shape, no_flops, no_gradient
from .selection import count_into
from .shape_ops import scatter_nd, zeros
from ..errors import ShapeError

_REDUCTIONS = ("none", "add", "mul", "max", "min")


@schema("ScatterElements")
class ScatterElements(Schema):
    """ScatterElements: data with updates[i] written at the place of i with its `axis` coordinate
    replaced by indices[i] (negative ones counting from the end), or combined (add, mul, max, min) with
    what is there, repeats accumulating. The kernel writes by flat offsets built in its workspace, laid
    out as GatherElements' (the gather it inverts)."""

    defaults = {"axis": 0, "reduction": "none"}
    inplace = ((0, 0),)
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        data, indices, updates = ins
        dim = data.shape[axis(self.attr(node, "axis"), data.rank)]
        known = indices.value
        if known is not None and known.size and not -dim <= known.min() <= known.max() < dim:
            bad = known.min() if known.min() < -dim else known.max()
            raise ShapeError(f"index {bad} is out of range for axis {self.attr(node, 'axis')} of size {dim}")
        if not data.rank == indices.rank or indices.shape != updates.shape:
            raise ShapeError(f"indices {indices.shape} and updates {updates.shape} must have one shape, of the "
                             f"rank of data {data.shape}")
        if self.attr(node, "reduction") not in _REDUCTIONS:
            raise ShapeError(f"reduction {self.attr(node, 'reduction')!r} is not one of {', '.join(_REDUCTIONS)}")
        if updates.dtype != data.dtype:
            raise ShapeError(f"updates ({updates.dtype}) and data ({data.dtype}) have different dtypes")
        return [(data.shape, data.dtype)]

    def workspace(self, node, ins, outs, limit):
        return get("GatherElements").workspace(node, ins, outs, limit)

    def offsets(self, xp, node, shape, indices, ws):
        """ws["flat"]: each index (bounds checked, wrapped) times its axis's stride, plus the position
        along every other axis times that one's."""
        a = axis(self.attr(node, "axis"), len(shape))
        strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
        flat, dim = ws["flat"], shape[a]
        low, high = int(indices.min()), int(indices.max())
        if low < -dim or high >= dim:
            raise IndexError(f"index {low if low < -dim else high} is out of bounds for axis {a} with size {dim}")
        xp.remainder(indices, dim, out=flat)
        xp.multiply(flat, strides[a], out=flat)
        for k, n in enumerate(indices.shape):
            if k != a and n > 1:
                xp.add(flat, count_into(xp, ws[f"offsets{k}"], strides[k]), out=flat)
        return flat

    def compute(self, xp, node, data, indices, updates, out, ws):
        if out is not data:
            xp.copyto(out, data)
        if indices.size:
            flat = self.offsets(xp, node, data.shape, indices, ws)
            scatter_nd(xp, out.reshape(-1), flat[..., None], updates, self.attr(node, "reduction"))
        return out

    def kernel(self, xp, step, ins, outs, ws):
        self.compute(xp, step, *ins, outs[0], ws)

    def evaluate(self, node, data, indices, updates):
        shape = indices.shape
        ws = {"flat": np.empty(shape, np.int64),
              **{f"offsets{k}": np.empty((n, *(1,) * (len(shape) - k - 1)), np.int64) for k, n in enumerate(shape)}}
        return [self.compute(np, node, data, indices, updates, data.copy(), ws)]

    def gradient(self, b, node, dys):
        """For the none and add reductions. Data: dY, with zeros where `none` overwrote it; updates: dY
        gathered back from their places."""
        data, indices, updates = node.inputs
        reduction, a, dy = self.attr(node, "reduction"), self.attr(node, "axis"), dys[0]
        if reduction not in ("none", "add"):
            return [no_gradient(node)] * 3
        kept = dy if reduction == "add" else b.op("ScatterElements", dy, indices,
                                                  zeros(b, b.shape(updates), b.dtype(data)), axis=a)
        return [kept, None, b.op("GatherElements", dy, indices, axis=a)]

    def torch(self, torch, data, indices, updates, axis, reduction):
        a = axis % data.ndim
        index = torch.where(indices < 0, indices + data.shape[a], indices)
        if reduction == "none":
            return data.scatter(a, index, updates)
        reduce = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction]
        return data.scatter_reduce(a, index, updates, reduce, include_self=True)


@schema("TensorScatter", since=24)
class TensorScatter(Schema):
    """TensorScatter: the cache with each sample's update written along `axis` from its write index
    (write_indices, 0 when omitted); in "circular" mode positions wrap around the cache's length. The
    write indices are read on the host, one run of rows per sample (two where a circular one wraps)."""

    defaults = {"axis": -2, "mode": "linear"}
    inplace = ((0, 0),)
    flops = staticmethod(no_flops)

    def infer(self, node, ins):
        cache, update = ins[0], ins[1]
        write = ins[2] if len(ins) > 2 else None
        a = axis(self.attr(node, "axis"), cache.rank)
        if a == 0:
            raise ShapeError("axis must not be 0, the batch axis")
        if self.attr(node, "mode") not in ("linear", "circular"):
            raise ShapeError(f"mode {self.attr(node, 'mode')!r} is not linear or circular")
        if update.rank != cache.rank or any(u != c for k, (u, c) in enumerate(zip(update.shape, cache.shape))
                                            if k != a) or update.shape[a] > cache.shape[a]:
            raise ShapeError(f"update {update.shape} must be the cache's shape {cache.shape}, no longer on axis {a}")
        if write is not None and write.shape != cache.shape[:1]:
            raise ShapeError(f"write_indices must have shape {cache.shape[:1]}, one per sample, got {write.shape}")
        return [(cache.shape, cache.dtype)]

    def kernel(self, xp, step, ins, outs, ws):
        cache, update, y = ins[0], ins[1], outs[0]
        write = ins[2] if len(ins) > 2 else None
        if y is not cache:
            xp.copyto(y, cache)
        a = axis(step.attrs["axis"], cache.ndim)
        length, count = cache.shape[a], update.shape[a]
        starts = [0] * cache.shape[0] if write is None else write.tolist()
        for sample, start in enumerate(starts):
            if step.attrs["mode"] == "circular":
                start %= length
            elif not 0 <= start <= length - count:
                raise IndexError(f"write index {start} of sample {sample} leaves no room for {count} positions "
                                 f"of {length}")
            first = min(count, length - start)
            runs = [(start, 0, first), (0, first, count - first)]
            for at, source, size in runs:
                if size:
                    where = (sample, *(slice(None),) * (a - 1))
                    xp.copyto(y[(*where, slice(at, at + size))], update[(*where, slice(source, source + size))])

    def gradient(self, b, node, dys):
        """The cache's: dY with the written places zeroed (the same scatter, of zeros); the update's: dY
        read back from those places (the first ones without write indices, else GatherElements at each
        sample's write index plus the step, wrapped in circular mode)."""
        cache, update, *write = node.inputs
        shape = b.shape(update)
        a = axis(self.attr(node, "axis"), len(shape))
        kept = b.op("TensorScatter", dys[0], zeros(b, shape, b.dtype(cache)), *write, **self.arguments(node))
        if not any(write):
            return [kept, b.op("Slice", dys[0], starts=[0], ends=[shape[a]], axes=[a]), *[None] * len(write)]
        steps = np.arange(constant_shape(node, "its gradient's steps", shape[a])[0])
        steps = steps.reshape([-1 if k == a else 1 for k in range(len(shape))])
        places = b.op("Add", b.op("Reshape", write[0], shape=[-1] + [1] * (len(shape) - 1)), b.const(steps, write[0]))
        if self.attr(node, "mode") == "circular":
            places = b.op("Mod", places, b.const(b.shape(cache)[a], write[0]))
        places = b.op("Expand", places, shape=list(shape))
        return [kept, b.op("GatherElements", dys[0], places, axis=a), None]

    def torch(self, torch, cache, update, write_indices=None, axis=-2, mode="linear"):
        a = axis % cache.ndim
        y, length, count = cache.clone(), cache.shape[a], update.shape[a]
        for sample in range(cache.shape[0]):
            start = 0 if write_indices is None else int(write_indices[sample])
            positions = torch.arange(count, device=cache.device) + start
            if mode == "circular":
                positions = positions % length
            y[sample].index_copy_(a - 1, positions, update[sample])
        return y


@schema("ReverseSequence")
class ReverseSequence(Schema):
    """ReverseSequence: for each sample along `batch_axis`, its first sequence_lens[sample] steps along
    `time_axis` in reverse order, the rest as they are. The lengths are read on the host."""

    defaults = {"time_axis": 0, "batch_axis": 1}
    flops = staticmethod(no_flops)

    def axes(self, node):
        time, batch = self.attr(node, "time_axis"), self.attr(node, "batch_axis")
        if {time, batch} != {0, 1}:
            raise ShapeError(f"time_axis {time} and batch_axis {batch} must be 0 and 1, one each")
        return time, batch

    def infer(self, node, ins):
        x, lens = ins
        time, batch = self.axes(node)
        if x.rank < 2 or lens.shape != (x.shape[batch],):
            raise ShapeError(f"sequence_lens {lens.shape} must hold one length per sample of input {x.shape} "
                             f"(axis {batch})")
        return [(x.shape, x.dtype)]

    def kernel(self, xp, step, ins, outs, ws):
        (x, lens), y = ins, outs[0]
        time, batch = self.axes(step)
        xp.copyto(y, x)
        for sample, n in enumerate(lens.tolist()):
            if not 0 <= n <= x.shape[time]:
                raise IndexError(f"sequence length {n} of sample {sample} is outside [0, {x.shape[time]}]")
            if n > 1:
                into, source = [slice(None)] * x.ndim, [slice(None)] * x.ndim
                into[batch] = source[batch] = sample
                into[time], source[time] = slice(0, n), slice(n - 1, None, -1)
                xp.copyto(y[tuple(into)], x[tuple(source)])

    def gradient(self, b, node, dys):
        """The same reversal of dY (it is its own inverse)."""
        return [b.op("ReverseSequence", dys[0], node.inputs[1], **self.arguments(node)), None]

    def torch(self, torch, x, lens, time_axis, batch_axis):
        y, time = x.clone(), time_axis - (time_axis > batch_axis)
        for sample, n in enumerate(lens.tolist()):
            steps = x.select(batch_axis, sample).narrow(time, 0, n)
            y.select(batch_axis, sample).narrow(time, 0, n).copy_(steps.flip(time))
        return y
