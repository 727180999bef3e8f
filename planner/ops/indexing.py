"""Gather and GatherElements (their kernels in executor/kernels/shape_ops.py); GatherND: slices of data picked by
index tuples, its kernel a flat `take` of rows whose flat indices it builds in its workspace, so that nothing
else is allocated."""
import math

import numpy as np

from .registry import register, schema
from .base import Info, Layout, Schema, axis, no_flops, no_gradient, take
from .shape_ops import scatter_add_flat, wrapped, zeros
from ..errors import ShapeError


def _indices(idx, dim):
    """Indices in [0, dim) from ONNX's [-dim, dim)."""
    if idx.size and not (-dim <= idx.min() and idx.max() < dim):
        bad = idx.min() if idx.min() < -dim else idx.max()
        raise ShapeError(f"index {bad} is out of range for a dimension of size {dim} (indices go from {-dim} "
                         f"to {dim - 1})")
    return np.where(idx < 0, idx + dim, idx)


def torch_wrapped(torch, idx, dim):
    """Torch indices in [0, dim) from ONNX's [-dim, dim)."""
    return torch.where(idx < 0, idx + dim, idx)


@schema("Gather")
class Gather(Schema):
    defaults = {"axis": 0}

    def infer(self, node, ins):
        data, idx = ins
        a = axis(self.attr(node, "axis"), data.rank)
        if idx.value is not None:
            _indices(idx.value, data.shape[a])
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

    def torch_node(self, torch, run, node, ins):
        data, idx = ins
        a = axis(self.attr(node, "axis"), data.ndim)
        picked = data.index_select(a, torch_wrapped(torch, idx, data.shape[a]).reshape(-1))
        return picked.reshape(data.shape[:a] + idx.shape + data.shape[a + 1:])


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
        """The kernel gathers by flat offsets, int64: `flat`, one per index; `offsets{k}`, axis k's
        position offsets, shaped to broadcast against `flat` (the kernel skips the gathered axis and
        axes of size 1)."""
        shape = ins[1].shape
        if not math.prod(shape):
            return Layout()
        return Layout.pack(("flat", shape, np.int64), *((f"offsets{k}", (n, *(1,) * (len(shape) - k - 1)), np.int64)
                                                        for k, n in enumerate(shape)))

    def torch_node(self, torch, run, node, ins):
        data, idx = ins
        a = axis(self.attr(node, "axis"), data.ndim)
        return torch.gather(data, a, torch_wrapped(torch, idx, data.shape[a]))


class GatherND(Schema):
    """GatherND: the last dim of `indices` (k values) indexes the k dims of data after its first
    `batch_dims`, which indices shares; the output is indices' shape without its last dim, then the
    data dims left: indices.shape[:-1] + data.shape[batch_dims + k:]."""

    op = "GatherND"
    defaults = {"batch_dims": 0}
    flops = staticmethod(no_flops)

    def sizes(self, node, data, indices):
        """(B, M, N, rest, k): the batch, the rows of data one batch holds, the index tuples per batch,
        the elements of one row, and the tuple length."""
        b, k = self.attr(node, "batch_dims"), indices[-1]
        batch = math.prod(data[:b])
        return batch, math.prod(data[b:b + k]), math.prod(indices[b:-1]), math.prod(data[b + k:]), k

    def infer(self, node, ins):
        data, indices = ins[0].shape, ins[1].shape
        b = self.attr(node, "batch_dims")
        if not indices or not 0 <= b < min(len(data), len(indices)):
            raise ShapeError(f"batch_dims {b} must be below the ranks of data {data} and indices {indices}")
        if indices[:b] != data[:b]:
            raise ShapeError(f"indices {indices} and data {data} must share their first {b} (batch) dims")
        if not 1 <= indices[-1] <= len(data) - b:
            raise ShapeError(f"the last dim of indices ({indices[-1]}) must be from 1 to data's rank less "
                             f"batch_dims ({len(data) - b})")
        return [(tuple(indices[:-1]) + tuple(data[b + indices[-1]:]), ins[0].dtype)]

    def workspace(self, node, ins, outs, limit):
        batch, _, n, _, _ = self.sizes(node, ins[0].shape, ins[1].shape)
        return Layout.pack(("rows", (batch * n,), np.int64), ("term", (batch * n,), np.int64))

    def compute(self, xp, node, data, indices, out, rows, term):
        """The flat row of each index tuple, bounds checked (IndexError naming the index), then one take."""
        batch, m, n, rest, k = self.sizes(node, data.shape, indices.shape)
        if not rows.size:
            return out
        b = self.attr(node, "batch_dims")
        tuples = indices.reshape(batch * n, k)
        rows.fill(0)
        stride = m
        for j in range(k):
            dim = data.shape[b + j]
            stride //= dim
            xp.copyto(term, tuples[:, j])
            low, high = int(term.min()), int(term.max())
            if low < -dim or high >= dim:
                raise IndexError(f"index {low if low < -dim else high} is out of bounds for a dimension of size {dim}")
            xp.mod(term, dim, out=term)
            xp.multiply(term, stride, out=term)
            xp.add(rows, term, out=rows)
        for first in range(1, batch):
            rows[first * n:(first + 1) * n] += first * m
        take(xp, data.reshape(batch * m, rest), rows, 0, out.reshape(batch * n, rest))
        return out

    def evaluate(self, node, data, indices):
        shape = self.infer(node, [Info(data.shape, data.dtype), Info(indices.shape, indices.dtype)])[0][0]
        count = self.sizes(node, data.shape, indices.shape)
        rows, term = np.empty(count[0] * count[2], np.int64), np.empty(count[0] * count[2], np.int64)
        return [self.compute(np, node, data, indices, np.empty(shape, data.dtype), rows, term)]

    def kernel(self, xp, step, ins, outs, ws):
        self.compute(xp, step, *ins, outs[0], ws["rows"], ws["term"])

    def gradient(self, b, node, dys):
        """dY added into zeros at the gathered slices (ScatterND with add), for batch_dims 0."""
        data, indices = node.inputs
        if self.attr(node, "batch_dims"):
            return [no_gradient(node), None]
        shape = b.shape(data)
        k = b.shape(indices)[-1]
        return [b.op("ScatterND", zeros(b, shape, b.dtype(data)), wrapped(b, indices, np.array(shape[:k])), dys[0],
                     reduction="add"), None]

    def torch(self, torch, data, indices, batch_dims):
        """Advanced indexing, the batch dims flattened into one indexed by its own position."""
        b = batch_dims
        if not b:
            return data[tuple(indices.unbind(-1))]
        idx = indices.reshape(-1, *indices.shape[b:])
        batch = torch.arange(idx.shape[0]).reshape(-1, *[1] * (idx.ndim - 2))
        picked = data.reshape(idx.shape[0], *data.shape[b:])[(batch, *idx.unbind(-1))]
        return picked.reshape(*data.shape[:b], *picked.shape[1:])


register(GatherND())
