"""memplan.BiasActivation compiled: Y = activation(X + bias) in one pass over X, rows in parallel."""
from numba import njit, prange

from ..kernels import override
from . import takes
from .scalar import ACTIVATIONS, FASTMATH, NO_BIAS, activate_row, f32
from .threads import PARALLEL


SERIAL = 1 << 15
"""Elements below which a loop runs on the calling thread alone: waking TBB's workers between the BLAS calls of a
decoded token (a 2,048-wide activation) cost more than the loop (GPT-2 decode on 2 cores: 2 ms a token)."""


@njit(fastmath=FASTMATH, cache=True)
def _bias_activation_row(x, bias, y, r, code, p0, p1):
    """y[r] = activation(x[r] + bias), bias holding a row's values, one added to all, or none; y may be x."""
    width = x.shape[1]
    if bias.shape[0] == width:
        for c in range(width):
            y[r, c] = x[r, c] + bias[c]
        activate_row(y[r], f32(0), code, p0, p1)
    else:
        y[r, :] = x[r, :]
        activate_row(y[r], bias[0] if bias.shape[0] else f32(0), code, p0, p1)


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def bias_activation_rows(x, bias, y, code, p0, p1):
    """y[r] = activation(x[r] + bias) for each row r of the (rows, width) arrays, rows in parallel."""
    for r in prange(x.shape[0]):
        _bias_activation_row(x, bias, y, r, code, p0, p1)


@njit(fastmath=FASTMATH, cache=True)
def bias_activation_serial(x, bias, y, code, p0, p1):
    """bias_activation_rows on the calling thread (fewer than SERIAL elements)."""
    for r in range(x.shape[0]):
        _bias_activation_row(x, bias, y, r, code, p0, p1)


def code(name, approximate="none"):
    """The activation's code in scalar.ACTIVATIONS; Gelu's tanh form has its own."""
    return ACTIVATIONS.index("GeluTanh" if name == "Gelu" and approximate == "tanh" else name)


@override("jit", "BiasActivation", domain="memplan")
def bias_activation(generic):
    """The BiasActivation kernel for float32 arrays of C layout but Tanh's (libm's tanh, one element at a
    time, is slower than NumPy's); `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        x, bias = (list(ins) + [None])[:2]
        y, attrs = outs[0], step.attrs
        if not takes(x, y) or not x.size or attrs["activation"] == "Tanh":
            return generic(xp, step, ins, outs, ws)
        width = x.shape[-1] if bias is None or bias.size == 1 else bias.size
        rows = bias_activation_serial if x.size < SERIAL else bias_activation_rows
        rows(x.reshape(-1, width), NO_BIAS if bias is None else bias.reshape(-1), y.reshape(-1, width),
                             code(attrs["activation"], attrs["approximate"]), f32(attrs["alpha"]), f32(0))
    return run
