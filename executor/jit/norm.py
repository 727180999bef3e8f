"""memplan.AddLayerNormalization compiled for float32: each row's residual add, statistics and scaled output in
one pass over it, on the calling thread, instead of a dozen NumPy calls (a decoded token's norms are one row of a
few thousand values, where the calls' cost is all there is)."""
import numpy as np
from numba import njit

from planner.ops.fused_norm import rows_and_columns
from ..kernels import override
from . import takes
from .scalar import f32

NONE = np.zeros((1, 0), np.float32)
"""What the compiled loop takes for an omitted skip, bias or Sum: no row fits it."""


@njit(error_model="numpy", cache=True)
def add_layer_norm(x, skip, scale, bias, y, total, epsilon, rms):
    """y = norm(x + skip) * scale + bias over each row of the (rows, cols) arrays (skip, bias and total NONE where
    omitted; total takes x + skip), in float32 as the NumPy kernel but its sums, which are float64 (exact where
    NumPy's pairwise float32 sums are close) cast to float32 (so that a variance beyond float32 is inf, as there); y
    may be x, skip or total."""
    rows, cols = x.shape
    added, biased, summed = skip.shape[1] == cols, bias.shape[1] == cols, total.shape[1] == cols
    for r in range(rows):
        mean = 0.0
        for c in range(cols):
            v = x[r, c] + skip[r, c] if added else x[r, c]
            if summed:
                total[r, c] = v
            y[r, c] = v
            mean += v
        centre = f32(0) if rms else f32(mean / cols)
        square = 0.0
        for c in range(cols):
            d = y[r, c] - centre
            square += np.float64(d) * d
        inv = f32(1) / np.sqrt(f32(square / cols) + epsilon)
        for c in range(cols):
            v = (y[r, c] - centre) * inv * scale[0, c]
            y[r, c] = v + bias[0, c] if biased else v


@override("jit", "AddLayerNormalization", domain="memplan")
def add_layer_normalization(generic):
    """The AddLayerNormalization kernel for float32 arrays of C layout whose scale and bias hold one row's values;
    `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        x, skip, scale, bias = (list(ins) + [None] * 4)[:4]
        y, total = (list(outs) + [None])[:2]
        rows, cols, _ = rows_and_columns(x.shape, step.attrs["axis"] % x.ndim)
        if not takes(x, skip, scale, bias, y, total) or not x.size or scale.size != cols or \
                bias is not None and bias.size != cols:
            return generic(xp, step, ins, outs, ws)
        flat = [NONE if a is None else a.reshape(-1, cols) for a in (x, skip, scale, bias, y, total)]
        add_layer_norm(*flat, f32(step.attrs["epsilon"]), bool(step.attrs["rms"]))
    return run
