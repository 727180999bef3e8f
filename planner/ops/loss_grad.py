"""SoftmaxCrossEntropyGrad: the gradient of SoftmaxCrossEntropyLoss as one op, so that a training step
makes one scores-sized tensor for it (dscores) instead of one per op of the composed rule (log-softmax,
exp, one-hot, subtract, scale), the largest tensors of a language model's step."""
import math

import numpy as np

from .registry import schema
from .base import FLOATS, Layout, take
from .into import iota
from .loss import CHUNK_BYTES, LabelLoss
from ..errors import ShapeError


@schema("SoftmaxCrossEntropyGrad", domain="memplan")
class SoftmaxCrossEntropyGrad(LabelLoss):
    """Inputs (scores, labels, weights or "", dloss), attributes as SoftmaxCrossEntropyLoss's (classes on
    dim 1 of (N, C, d1, ...)); output dscores = (softmax(scores) - onehot(labels)) * factor, the factor
    of each position its label's weight (1 without weights, 0 where ignored) times dloss (the loss's
    gradient: a scalar, or one per position for reduction "none"), over the weights' sum for "mean"."""

    types = (("T", "Tind", "T", "T"), {"T": FLOATS, "Tind": {"tensor(int32)", "tensor(int64)"}})

    def infer(self, node, ins):
        if len(ins) != 4 or ins[3] is None:
            raise ShapeError("SoftmaxCrossEntropyGrad takes (scores, labels, weights or '', dloss)")
        loss = super().infer(node, ins[:3])[0]
        if ins[3].shape != loss[0]:
            raise ShapeError(f"dloss of shape {ins[3].shape} is not the loss's {loss[0]} "
                             f"(reduction {self.attr(node, 'reduction')!r})")
        return [(ins[0].shape, ins[0].dtype)]

    def workspace(self, node, ins, outs, limit):
        """One value per position, not per score (so not bounded by `limit`): `rows`, each row's maximum
        then its sum of exponentials, and `factor`, in the accumulation dtype (float32 for 16-bit
        scores); `total`, the weights' sum; `picked`, the values at the labels; `index`, their flat
        indices in dscores; `term`, the labels made safe (ignored ones 0); `ignored` with an ignore_index."""
        scores, labels = ins[:2]
        acc, positions = self.accumulation(scores.dtype), math.prod(labels.shape)
        rows = (labels.shape[0], 1, *labels.shape[1:])
        ignored = self.attr(node, "ignore_index") is not None
        return Layout.pack(("rows", rows, acc), ("factor", rows, acc), ("total", (), acc),
                           ("picked", (positions,), scores.dtype), ("index", (positions,), np.int64),
                           ("term", (positions,), np.int64), ("ignored", (positions,), np.bool_) if ignored else None)

    def flops(self, node, ins, outs):
        """Per score: max, subtract, exp, sum, scale."""
        return 5 * math.prod(ins[0].shape)

    def kernel(self, xp, step, ins, outs, ws):
        """The positions' factors and label indices first; then per chunk of rows, straight into dscores:
        exp(x - max), scaled by factor / its sum, and the factor taken off at each label (take, put)."""
        scores, labels, weights, dloss = ins
        out = outs[0]
        if not out.size:
            return
        self.factors(xp, step, labels, weights, dloss, ws)
        self.label_indices(xp, scores.shape, ws)
        rows, factor, picked, index = ws["rows"], ws["factor"], ws["picked"], ws["index"]
        inner = math.prod(scores.shape[2:])
        flat = out.reshape(-1)
        per_chunk = max(1, CHUNK_BYTES // (math.prod(scores.shape[1:]) * scores.dtype.itemsize))
        for start in range(0, scores.shape[0], per_chunk):
            rows_of = slice(start, start + per_chunk)
            x, y, r, f = scores[rows_of], out[rows_of], rows[rows_of], factor[rows_of]
            xp.max(x, axis=1, keepdims=True, out=r)
            xp.subtract(x, r, out=y)
            xp.exp(y, out=y)
            xp.sum(y, axis=1, keepdims=True, dtype=r.dtype, out=r)
            xp.divide(f, r, out=r)
            xp.multiply(y, r, out=y)
            at = slice(start * inner, start * inner + y.shape[0] * inner)
            chosen = picked[at]  # one view object for input and output: CuPy copies an input it sees overlap
            take(xp, flat, index[at], 0, chosen)
            xp.subtract(chosen, f.reshape(-1), out=chosen)
            xp.put(flat, index[at], chosen, mode="wrap")

    def factors(self, xp, step, labels, weights, dloss, ws):
        """Each position's factor into `factor` and its label, made safe, into `term`."""
        factor, term, picked = ws["factor"].reshape(-1), ws["term"], ws["picked"]
        labels = labels.reshape(-1)
        xp.copyto(term, labels)
        ignore = step.attrs["ignore_index"]
        if ignore is not None:
            ignored = ws["ignored"]
            xp.equal(labels, ignore, out=ignored)
            xp.copyto(term, 0, where=ignored)
        if weights is None:
            factor.fill(1)
        else:
            take(xp, weights, term, 0, picked)
            xp.copyto(factor, picked)
        if ignore is not None:
            xp.copyto(factor, 0, where=ignored)
        mean = step.attrs["reduction"] == "mean"
        if mean:
            xp.sum(factor, out=ws["total"])
        xp.multiply(factor, dloss.reshape(-1) if dloss.ndim else dloss, out=factor)
        if mean:
            xp.divide(factor, ws["total"], out=factor)

    @staticmethod
    def label_indices(xp, shape, ws):
        """Into `index`, the flat index in dscores (N, C, d...) of each position's safe label in `term`:
        (n C + label) inner + j for the position n inner + j, inner the product of d."""
        index, term = ws["index"], ws["term"]
        classes, inner = shape[1], math.prod(shape[2:])
        xp.multiply(term, inner, out=term)
        iota(xp, index)
        xp.add(index, term, out=index)
        if classes > 1:
            xp.subtract(index, term, out=term)
            xp.floor_divide(term, inner, out=term)
            xp.multiply(term, (classes - 1) * inner, out=term)
            xp.add(index, term, out=index)
