"""Softmax and LogSoftmax along one axis. (The elementwise activations compute by their entries in
planner/ops/activation.py.)"""
from . import kernel


@kernel("Softmax", "LogSoftmax")
def softmax(xp, step, ins, outs, ws):
    """exp(x - max) / sum, or (x - max) - log(sum exp(x - max)), the per-row max and sum in the
    workspace's `rows`. LogSoftmax sums the exponentials in the output, then finds the max again in
    the output's first column, so that it needs no row-sized or input-sized temporary."""
    x, y = ins[0], outs[0]
    if not x.size:
        return
    a = step.attrs["axis"] % x.ndim
    r = ws["rows"]
    xp.max(x, axis=a, keepdims=True, out=r)
    xp.subtract(x, r, out=y)
    xp.exp(y, out=y)
    xp.sum(y, axis=a, keepdims=True, out=r, dtype=r.dtype)
    if step.op == "Softmax":
        xp.divide(y, r, out=y)
        return
    xp.log(r, out=r)
    head, tail = ((slice(None),) * a + (part,) for part in (slice(0, 1), slice(1, None)))
    first = y[head]
    xp.max(x, axis=a, keepdims=True, out=first)
    xp.subtract(x[tail], first, out=y[tail])
    xp.subtract(x[head], first, out=first)
    xp.subtract(y, r, out=y)
