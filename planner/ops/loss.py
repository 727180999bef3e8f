"""Loss ops: SoftmaxCrossEntropyLoss, the fused log-softmax and negative log-likelihood that the
cross_entropy loss of a training step is made of, and NegativeLogLikelihoodLoss, its second half alone
(the loss of log-probabilities given). Both take each position's label the same way and share the
workspace and the kernel's lookups; the gradient of the first is one op of its own (loss_grad.py)."""
import math
from dataclasses import replace

import numpy as np

from .registry import get, schema
from .base import Layout, Schema, constant_shape
from .. import dtypes
from ..errors import ShapeError

REDUCTIONS = ("none", "sum", "mean")
CHUNK_BYTES = 1 << 20
"""Scores per chunk of rows, in bytes, where a kernel goes through the scores in chunks: small enough that
the passes over a chunk find it still in cache, large enough that a pass is one array operation."""


class LabelLoss(Schema):
    """loss[i] = -log_prob[i, labels[i]] * weights[labels[i]] over the positions i of `labels` (input 0
    without dim 1), 0 where labels[i] == ignore_index; reduced by "none", "sum", or "mean" (divided by
    the sum of the weights taken, their count without weights)."""

    mirror = False
    defaults = {"reduction": "mean", "ignore_index": None}

    def infer(self, node, ins):
        scores, labels, weights = [*ins, None][:3]
        reduction = self.attr(node, "reduction")
        if reduction not in REDUCTIONS:
            raise ShapeError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
        if scores.rank < 2 or labels.shape != (scores.shape[0], *scores.shape[2:]):
            raise ShapeError(f"labels of shape {labels.shape} do not index input of shape {scores.shape} "
                             "(N, C, d1, ...) by class")
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"labels must be integers, got {labels.dtype}")
        if weights is not None and weights.shape != scores.shape[1:2]:
            raise ShapeError(f"weights of shape {weights.shape} do not have one value per class {scores.shape[1]}")
        return [(labels.shape if reduction == "none" else (), scores.dtype)]

    @staticmethod
    def label_slices(ins):
        """In the input's dtype: per position of the labels, its loss (`losses`) and its weight
        (`weights`); the weights' sum (`total`)."""
        n, dtype = ins[1].shape, ins[0].dtype
        return ("losses", n, dtype), ("weights", n, dtype), ("total", (), dtype)

    def workspace(self, node, ins, outs, limit):
        """`label_slices`."""
        return Layout.pack(*self.label_slices(ins))

    def flops(self, node, ins, outs):
        return 2 * int(np.prod(ins[1].shape))

    def picked(self, b, node, dy):
        """(onehot, factor): the one-hot of each position's label along dim 1 in input 0's dtype, and
        the label's weight times dy (over the weights' sum for "mean"), 0 at ignored positions,
        unsqueezed at dim 1: d loss / d log_prob = -onehot * factor."""
        scores, labels, *weights = node.inputs
        shape = b.shape(scores)
        ignore = self.attr(node, "ignore_index")
        ignored = None if ignore is None else b.op("Equal", labels, b.const(ignore, labels))
        safe = labels if ignored is None else b.op("Where", ignored, b.const(0, labels), labels)
        if weights and weights[0]:
            taken = b.op("Gather", weights[0], safe, axis=0)
        else:
            taken = b.op("ConstantOfShape", shape=list(b.shape(labels)), value=np.ones(1, b.dtype(scores)))
        if ignored is not None:
            taken = b.op("Where", ignored, b.const(0, scores), taken)
        factor = b.op("Mul", taken, dy)
        if self.attr(node, "reduction") == "mean":
            factor = b.op("Div", factor, b.op("ReduceSum", taken, keepdims=0))
        classes = b.const(np.arange(constant_shape(node, "its classes", shape[1])[0]).reshape(
            1, -1, *(1 for _ in shape[2:])), labels)
        onehot = b.op("Cast", b.op("Equal", b.op("Unsqueeze", safe, axes=[1]), classes),
                      to=dtypes.to_onnx(b.dtype(scores)))
        return onehot, b.op("Unsqueeze", factor, axes=[1])


@schema("NegativeLogLikelihoodLoss", since=12)
class NegativeLogLikelihoodLoss(LabelLoss):
    """NegativeLogLikelihoodLoss: the loss of log-probabilities (N, C, d1, ...) given as input 0."""

    autocast = "float32"

    def gradient(self, b, node, dys):
        """d input = -onehot(labels) * factor (`LabelLoss.picked`); labels and weights get none."""
        onehot, factor = self.picked(b, node, dys[0])
        return [b.op("Neg", b.op("Mul", onehot, factor)), None, None][:len(node.inputs)]

    def torch(self, torch, log_prob, labels, weights=None, *, reduction, ignore_index):
        return torch.nn.functional.nll_loss(log_prob, labels.long(), weights, reduction=reduction,
                                            ignore_index=-100 if ignore_index is None else ignore_index)


@schema("SoftmaxCrossEntropyLoss")
class SoftmaxCrossEntropyLoss(LabelLoss):
    """SoftmaxCrossEntropyLoss: the loss of log_softmax(scores, axis=1). Outputs the loss and,
    optionally, the log-probabilities."""

    autocast = "float32"

    def infer(self, node, ins):
        loss = super().infer(node, ins)[0]
        return [loss, (ins[0].shape, ins[0].dtype)]

    def workspace(self, node, ins, outs, limit):
        """`label_slices`, and `rows` (N x 1 x d...) in the scores' dtype: each row's maximum (then, without
        the log_prob output, its log-sum-exp); `losses` holds each row's sum of exponentials first. Without
        the log_prob output, `chunk`: whole rows (dim 0) of exponentials, as many as CHUNK_BYTES holds (at
        most `limit`, at least one row), so that no scores-sized scratch is made."""
        scores, labels = ins[:2]
        stored = len(outs) > 1 and outs[1] is not None
        n, dtype = labels.shape, scores.dtype
        row = math.prod(scores.shape[1:]) * dtype.itemsize
        rows = max(1, min(scores.shape[0], min(CHUNK_BYTES, limit) // max(row, 1)))
        return Layout.pack(*self.label_slices(ins), ("rows", (n[0], 1, *n[1:]), dtype),
                           None if stored else ("chunk", (rows, *scores.shape[1:]), dtype))

    def flops(self, node, ins, outs):
        return 5 * int(np.prod(ins[0].shape))

    def gradient(self, b, node, dys):
        """d scores = (softmax - onehot(labels)) * factor along dim 1, as one memplan.SoftmaxCrossEntropyGrad
        from the scores (it recomputes the softmax row by row, so no scores-sized tensor but its output
        is made); plus LogSoftmax's gradient where the log-probabilities are an output that gets one.
        Labels and weights get none."""
        scores, labels, *weights = node.inputs
        dloss, dlog_prob = [*dys, None][:2]
        ignore = self.attr(node, "ignore_index")
        grads = [] if dloss is None else [b.op(
            "SoftmaxCrossEntropyGrad", scores, labels, weights[0] if weights else "", dloss, domain="memplan",
            reduction=self.attr(node, "reduction"), **({} if ignore is None else {"ignore_index": ignore}))]
        if dlog_prob is not None:
            log_softmax = replace(node, op="LogSoftmax", inputs=(scores,), outputs=node.outputs[1:2], attrs={"axis": 1})
            grads.append(get("LogSoftmax").gradient(b, log_softmax, [dlog_prob])[0])
        return [grads[0] if len(grads) == 1 else b.op("Add", *grads), None, None][:len(node.inputs)]

    def torch_node(self, torch, run, node, ins):
        """The loss, then the log-probabilities."""
        scores, labels, weights = [*ins, None][:3]
        f, ignore = torch.nn.functional, self.attr(node, "ignore_index")
        log_prob = f.log_softmax(scores, 1)
        return [f.nll_loss(log_prob, labels.long(), weights, ignore_index=-100 if ignore is None else ignore,
                           reduction=self.attr(node, "reduction")), log_prob]
