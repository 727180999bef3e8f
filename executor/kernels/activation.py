"""Softmax and LogSoftmax along one axis. (The elementwise activations compute by their entries in
planner/ops/activation.py.)"""
from . import attr, kernel


@kernel("Softmax", "LogSoftmax")
def softmax(xp, step, ins, outs, ws):
    """exp(x - max) / sum, or (x - max) - log(sum exp(x - max)); the per-row max and sum live in the
    workspace."""
    x, y = ins[0], outs[0]
    if not x.size:
        return
    a = attr(step, "axis") % x.ndim
    rows = x.shape[:a] + (1,) + x.shape[a + 1:]
    r = ws[:y.dtype.itemsize * (x.size // max(x.shape[a], 1))].view(y.dtype).reshape(rows)
    xp.max(x, axis=a, keepdims=True, out=r)
    xp.subtract(x, r, out=y)
    if step.op == "LogSoftmax":
        xp.subtract(y, xp.log(xp.exp(y).sum(axis=a, keepdims=True)), out=y)
        return
    xp.exp(y, out=y)
    xp.sum(y, axis=a, keepdims=True, out=r)
    xp.divide(y, r, out=y)
