"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (rules in planner/ops/loss.py): log-softmax
over dim 1 into the log_prob output (or the workspace) for the first, then for both each position's
loss and weight, then the reduction. The GPU gathers with one fused kernel (backends/cupy_kernels.py)."""
import numpy as np

from . import kernel


def log_softmax(xp, scores, ws, log_prob):
    """log_prob = scores - max - log(sum exp(scores - max)) over dim 1: the exponentials summed in
    log_prob itself, their sum kept in the workspace's `losses` (free until the losses are taken)."""
    rows = ws["rows"]
    sums = ws["losses"].reshape(rows.shape)
    xp.max(scores, axis=1, keepdims=True, out=rows)
    xp.subtract(scores, rows, out=log_prob)
    xp.exp(log_prob, out=log_prob)
    xp.sum(log_prob, axis=1, keepdims=True, out=sums)
    xp.log(sums, out=sums)
    xp.subtract(scores, rows, out=log_prob)
    xp.subtract(log_prob, sums, out=log_prob)


def reduce(xp, step, ws, loss):
    """The loss output from the per-position losses and weights."""
    losses, reduction = ws["losses"], step.attrs["reduction"]
    if reduction == "none":
        xp.copyto(loss, losses)
        return
    xp.sum(losses, out=loss)
    if reduction == "mean":
        xp.sum(ws["weights"], out=ws["total"])
        xp.divide(loss, ws["total"], out=loss)


def log_prob_of(outs, ws):
    """Where the log-probabilities go: the second output, or the workspace when it is omitted."""
    return outs[1] if len(outs) > 1 and outs[1] is not None else ws["log_prob"]


def take_labels(xp, step, log_prob, labels, class_weights, ws):
    """Each position's weight (its label's, 1 without class weights, 0 where ignored) and loss,
    -log_prob at its label times the weight, into the workspace. On NumPy the label lookups make
    temporaries of one value per position (not per score)."""
    losses, weights = ws["losses"], ws["weights"]
    ignore = step.attrs["ignore_index"]
    ignored = np.zeros(labels.shape, bool) if ignore is None else labels == ignore
    safe = np.where(ignored, 0, labels)
    weights[...] = 1 if class_weights is None else class_weights[safe]
    weights[ignored] = 0
    picked = np.take_along_axis(log_prob, safe.reshape(labels.shape[0], 1, *labels.shape[1:]), axis=1)
    np.multiply(-picked.reshape(labels.shape), weights, out=losses)


@kernel("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(xp, step, ins, outs, ws):
    scores, labels, class_weights = [*ins, None][:3]
    log_prob = log_prob_of(outs, ws)
    log_softmax(xp, scores, ws, log_prob)
    take_labels(xp, step, log_prob, labels, class_weights, ws)
    reduce(xp, step, ws, outs[0])


@kernel("NegativeLogLikelihoodLoss")
def negative_log_likelihood(xp, step, ins, outs, ws):
    log_prob, labels, class_weights = [*ins, None][:3]
    take_labels(xp, step, log_prob, labels, class_weights, ws)
    reduce(xp, step, ws, outs[0])
