"""SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (rules in planner/ops/loss.py): for the first,
log-softmax over dim 1 into the log_prob output, or without it each position's log-sum-exp, chunk of rows
by chunk of rows; then for both each position's loss and weight, then the reduction. The GPU gathers with
one fused kernel (backends/cupy_kernels.py)."""
import numpy as np

from . import kernel


def log_softmax(xp, scores, ws, log_prob):
    """log_prob = scores - log(sum exp(scores)) over dim 1: the exponentials in log_prob itself, taken
    as `log_sum_exp`'s one chunk."""
    log_sum_exp(xp, scores, ws, log_prob)
    xp.subtract(scores, ws["rows"], out=log_prob)


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


def stored(outs):
    """Whether the log-probabilities are an output (else only the loss is computed)."""
    return len(outs) > 1 and outs[1] is not None


def log_sum_exp(xp, scores, ws, chunk=None):
    """Into `rows`, each position's log(sum(exp(scores))) over dim 1: per chunk of rows, the row maximum,
    then the chunk less it exponentiated in `chunk` (default the workspace's), summed into `losses` (free
    until the losses are taken)."""
    rows, chunk = ws["rows"], ws["chunk"] if chunk is None else chunk
    sums = ws["losses"].reshape(rows.shape)
    for start in range(0, scores.shape[0], chunk.shape[0]):
        rows_of = slice(start, start + chunk.shape[0])
        x, r, s = scores[rows_of], rows[rows_of], sums[rows_of]
        e = chunk[:x.shape[0]]
        xp.max(x, axis=1, keepdims=True, out=r)
        xp.subtract(x, r, out=e)
        xp.exp(e, out=e)
        xp.sum(e, axis=1, keepdims=True, out=s)
    xp.log(sums, out=sums)
    xp.add(rows, sums, out=rows)


def add_log_sum_exp(xp, ws):
    """losses (-score at the label times the weight) += log-sum-exp times the weight: -log_prob at the
    label times the weight."""
    lse = ws["rows"].reshape(ws["weights"].shape)
    xp.multiply(lse, ws["weights"], out=lse)
    xp.add(ws["losses"], lse, out=ws["losses"])


def take_labels(xp, step, log_prob, labels, class_weights, ws):
    """Each position's weight (its label's, 1 without class weights, 0 where ignored) and loss,
    -log_prob at its label times the weight, into the workspace (given the scores for log_prob, the
    score, which `add_log_sum_exp` completes). On NumPy the label lookups make
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
    if stored(outs):
        log_softmax(xp, scores, ws, outs[1])
        take_labels(xp, step, outs[1], labels, class_weights, ws)
    else:
        log_sum_exp(xp, scores, ws)
        take_labels(xp, step, scores, labels, class_weights, ws)
        add_log_sum_exp(xp, ws)
    reduce(xp, step, ws, outs[0])


@kernel("NegativeLogLikelihoodLoss")
def negative_log_likelihood(xp, step, ins, outs, ws):
    log_prob, labels, class_weights = [*ins, None][:3]
    take_labels(xp, step, log_prob, labels, class_weights, ws)
    reduce(xp, step, ws, outs[0])
