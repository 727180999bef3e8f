"""SoftmaxCrossEntropyLoss (rule in planner/ops/loss.py): log-softmax over dim 1 into the log_prob
output (or the workspace), then each position's loss and weight, then the reduction. The GPU gathers
with one fused kernel (backends/cupy_kernels.py)."""
import numpy as np

from . import attr, kernel


def scratch(step, ins, outs, ws):
    """Views over the workspace: row maxima (N, 1, d...), losses and weights (N, d...), log_prob."""
    scores, labels = ins[:2]
    dtype, n = scores.dtype, labels.size
    rows = ws[:n * dtype.itemsize].view(dtype).reshape(labels.shape[0], 1, *labels.shape[1:])
    losses, weights = (ws[k * n * dtype.itemsize:(k + 1) * n * dtype.itemsize].view(dtype).reshape(labels.shape)
                       for k in (1, 2))
    log_prob = outs[1] if len(outs) > 1 and outs[1] is not None else \
        ws[3 * n * dtype.itemsize:(3 * n + scores.size) * dtype.itemsize].view(dtype).reshape(scores.shape)
    total = ws[(ws.nbytes // dtype.itemsize - 1) * dtype.itemsize:].view(dtype)[:1].reshape(())
    return rows, losses, weights, log_prob, total


def reduce(xp, step, losses, weights, loss, total):
    """The loss output from the per-position losses and weights."""
    reduction = attr(step, "reduction")
    if reduction == "none":
        xp.copyto(loss, losses)
        return
    xp.sum(losses, out=loss)
    if reduction == "mean":
        xp.sum(weights, out=total)
        xp.divide(loss, total, out=loss)


@kernel("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(xp, step, ins, outs, ws):
    scores, labels, class_weights = [*ins, None][:3]
    rows, losses, weights, log_prob, total = scratch(step, ins, outs, ws)
    xp.max(scores, axis=1, keepdims=True, out=rows)
    xp.subtract(scores, rows, out=log_prob)
    xp.subtract(log_prob, xp.log(xp.exp(log_prob).sum(axis=1, keepdims=True)), out=log_prob)
    ignore = attr(step, "ignore_index")
    ignored = np.zeros(labels.shape, bool) if ignore is None else labels == ignore
    safe = np.where(ignored, 0, labels)
    weights[...] = 1 if class_weights is None else class_weights[safe]
    weights[ignored] = 0
    picked = np.take_along_axis(log_prob, safe.reshape(labels.shape[0], 1, *labels.shape[1:]), axis=1)
    np.multiply(-picked.reshape(labels.shape), weights, out=losses)
    reduce(xp, step, losses, weights, outs[0], total)
