"""GatherND: slices of data picked by index tuples, its kernel a flat `take` of rows whose flat
indices it builds in its workspace, so that nothing else is allocated."""
import math

import numpy as np

from .registry import register
from .base import Info, Layout, Schema, no_flops, no_gradient, take
from .shape_ops import wrapped, zeros
from ..errors import ShapeError


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
