"""Loss ops: SoftmaxCrossEntropyLoss, the fused log-softmax and negative log-likelihood that the
cross_entropy loss of a training step is made of."""
import numpy as np

from . import schema
from .base import Layout, Schema
from .. import dtypes
from ..errors import ShapeError

REDUCTIONS = ("none", "sum", "mean")


@schema("SoftmaxCrossEntropyLoss")
class SoftmaxCrossEntropyLoss(Schema):
    """loss[i] = -log_softmax(scores, axis=1)[i, labels[i]] * weights[labels[i]] over the positions i of
    `labels` (scores without dim 1), 0 where labels[i] == ignore_index; reduced by "none", "sum", or
    "mean" (divided by the sum of the weights taken, their count without weights). Outputs the loss
    and, optionally, the log-probabilities."""

    mirror = False
    defaults = {"reduction": "mean", "ignore_index": None}

    def infer(self, node, ins):
        scores, labels, weights = [*ins, None][:3]
        reduction = self.attr(node, "reduction")
        if reduction not in REDUCTIONS:
            raise ShapeError(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
        if scores.rank < 2 or labels.shape != (scores.shape[0], *scores.shape[2:]):
            raise ShapeError(f"labels of shape {labels.shape} do not index scores of shape {scores.shape} "
                             "(N, C, d1, ...) by class")
        if labels.dtype.kind not in "iu":
            raise ShapeError(f"labels must be integers, got {labels.dtype}")
        if weights is not None and weights.shape != scores.shape[1:2]:
            raise ShapeError(f"weights of shape {weights.shape} do not have one value per class {scores.shape[1]}")
        loss = labels.shape if reduction == "none" else ()
        return [(loss, scores.dtype), (scores.shape, scores.dtype)]

    def workspace(self, node, ins, outs, limit):
        """In the scores' dtype: per position of the labels, the row maximum (`rows`, N x 1 x d...), its
        loss (`losses`, first the row's sum of exponentials) and its weight (`weights`); `log_prob`
        when the log-probabilities are not an output; the weights' sum (`total`)."""
        scores, labels = ins[:2]
        stored = len(outs) > 1 and outs[1] is not None
        n, dtype = labels.shape, scores.dtype
        return Layout.pack(("rows", (n[0], 1, *n[1:]), dtype), ("losses", n, dtype), ("weights", n, dtype),
                           None if stored else ("log_prob", scores.shape, dtype), ("total", (), dtype))

    def flops(self, node, ins, outs):
        return 5 * int(np.prod(ins[0].shape))

    def gradient(self, b, node, dys):
        """d scores = (softmax - onehot(labels)) * weight of the label * d loss (/ the weights' sum for
        "mean"), along dim 1; zero at ignored positions. The log-probabilities are the output's when
        the node has it, else recomputed from the scores."""
        scores, labels, *weights = node.inputs
        shape = b.shape(scores)
        log_prob = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] else b.op("LogSoftmax", scores, axis=1)
        ignore = self.attr(node, "ignore_index")
        ignored = None if ignore is None else b.op("Equal", labels, b.const(ignore, labels))
        safe = labels if ignored is None else b.op("Where", ignored, b.const(0, labels), labels)
        if weights and weights[0]:
            taken = b.op("Gather", weights[0], safe, axis=0)
        else:
            taken = b.op("ConstantOfShape", shape=list(b.shape(labels)), value=np.ones(1, b.dtype(scores)))
        if ignored is not None:
            taken = b.op("Where", ignored, b.const(0, scores), taken)
        factor = b.op("Mul", taken, dys[0])
        if self.attr(node, "reduction") == "mean":
            factor = b.op("Div", factor, b.op("ReduceSum", taken, keepdims=0))
        classes = b.const(np.arange(shape[1]).reshape(1, -1, *(1 for _ in shape[2:])), labels)
        onehot = b.op("Cast", b.op("Equal", b.op("Unsqueeze", safe, axes=[1]), classes),
                      to=dtypes.to_onnx(b.dtype(scores)))
        grad = b.op("Mul", b.op("Sub", b.op("Exp", log_prob), onehot), b.op("Unsqueeze", factor, axes=[1]))
        return [grad, None, None][:len(node.inputs)]

