"""Activation kernels: elementwise nonlinearities written into their output (which may be their
input), Clip, and Softmax / LogSoftmax along one axis."""
import math

from . import attr, kernel


def _erf(xp):
    """erf from SciPy on the host or CuPy's on the GPU: NumPy has none."""
    if xp.__name__ == "numpy":
        from scipy.special import erf
    else:
        from cupyx.scipy.special import erf
    return erf


@kernel("Relu")
def relu(xp, step, ins, outs, ws):
    """max(x, 0)."""
    xp.maximum(ins[0], 0, out=outs[0])


@kernel("LeakyRelu")
def leaky_relu(xp, step, ins, outs, ws):
    """x, or alpha x below zero."""
    x, y = ins[0], outs[0]
    xp.copyto(y, xp.where(x < 0, x * attr(step, "alpha"), x))


@kernel("Sigmoid")
def sigmoid(xp, step, ins, outs, ws):
    """1 / (1 + exp(-x)), one ufunc at a time in the output."""
    y = outs[0]
    xp.negative(ins[0], out=y)
    xp.exp(y, out=y)
    xp.add(y, 1, out=y)
    xp.reciprocal(y, out=y)


@kernel("HardSigmoid")
def hard_sigmoid(xp, step, ins, outs, ws):
    """clip(alpha x + beta, 0, 1), in the output."""
    y = outs[0]
    xp.multiply(ins[0], attr(step, "alpha"), out=y)
    xp.add(y, attr(step, "beta"), out=y)
    xp.clip(y, 0, 1, out=y)


@kernel("HardSwish")
def hard_swish(xp, step, ins, outs, ws):
    """x hard_sigmoid(x) with alpha 1/6, beta 1/2."""
    x, y = ins[0], outs[0]
    xp.copyto(y, x * xp.clip(x / 6 + 0.5, 0, 1))


@kernel("Tanh")
def tanh(xp, step, ins, outs, ws):
    xp.tanh(ins[0], out=outs[0])


@kernel("Erf")
def erf(xp, step, ins, outs, ws):
    _erf(xp)(ins[0], out=outs[0])


@kernel("Gelu")
def gelu(xp, step, ins, outs, ws):
    """x/2 (1 + erf(x / sqrt 2)), or with tanh(sqrt(2/pi) (x + 0.044715 x^3)) when approximate="tanh"."""
    x, y = ins[0], outs[0]
    if attr(step, "approximate") == "tanh":
        inner = xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))
    else:
        inner = _erf(xp)(x / math.sqrt(2))
    xp.copyto(y, 0.5 * x * (1 + inner))


@kernel("Clip")
def clip(xp, step, ins, outs, ws):
    """Bounds stay Python numbers: a device scalar would allocate."""
    lo, hi = attr(step, "min"), attr(step, "max")
    x, y = ins[0], outs[0]
    if lo is None and hi is None:
        xp.copyto(y, x)
    elif hi is None:
        xp.maximum(x, lo, out=y)
    elif lo is None:
        xp.minimum(x, hi, out=y)
    else:
        xp.clip(x, lo, hi, out=y)


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
    xp.sum(y, axis=a, keepdims=True, out=r)
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
