"""memplan.ScaledDotProductAttention compiled for float32: the same walk over query and key tiles, in the same
planned scratch, with the online softmax of a tile (scale, bias, causal mask, row maximum, exponentials, row
sums) one compiled pass over its scores instead of a dozen NumPy calls per (image, head). The products
Q K^T and P V are BLAS GEMMs (executor/jit/blas.py: MKL's, else numba's np.dot), so the loop runs on one
thread and the GEMMs on BLAS's."""
import math

import numpy as np
from numba import njit

from . import takes
from .blas import dot, sgemm
from .scalar import exp_nonpositive, f32

NO_BIAS, NO_LSE = np.zeros((1, 1, 1, 0), np.float32), np.zeros((1, 1, 0), np.float32)
"""What the compiled loop takes for an omitted bias or LSE: no key or query fits them."""


@njit(fastmath=True, cache=True)
def attention(gemm, q, k, v, bias, y, lse, scale, causal, tq, tk, scores, acc, pv, top, sums):
    """y (B, H, S, Dv) = softmax(scale q k^T + bias, causal) v, query head h reading kv head h // (H / Hkv);
    lse (B, H, S) the rows' log-sum-exp (or NO_LSE); bias broadcast to (B, H, S, T) (or NO_BIAS).
    scores, acc, pv, top and sums are the planned scratch (flat float32), for tq by tk tiles."""
    batch, heads, s, dv = y.shape
    t, groups = k.shape[2], heads // k.shape[1]
    offset, biased, logs = t - s, bias.shape[3] == t, lse.shape[2] == s
    lowest = np.finfo(np.float32).min
    for b in range(batch):
        for h in range(heads):
            hk = h // groups
            for i0 in range(0, s, tq):
                n = min(i0 + tq, s) - i0
                m, total, out = top[:n], sums[:n], acc[:n * dv].reshape(n, dv)
                m[:] = lowest
                total[:] = 0
                out[:, :] = 0
                last = t if not causal else max(0, min(t, i0 + n + offset))
                for j0 in range(0, last, tk):
                    width = min(j0 + tk, t) - j0
                    tile = scores[:n * width].reshape(n, width)
                    dot(gemm, q[b, h, i0:i0 + n], k[b, hk, j0:j0 + width].T, tile)
                    for r in range(n):
                        row = tile[r]
                        hidden = i0 + r + offset - j0 if causal else width
                        if biased:
                            ahead = bias[b, h, i0 + r, j0:j0 + width]
                            for c in range(width):
                                row[c] = row[c] * scale + ahead[c]
                        else:
                            for c in range(width):
                                row[c] *= scale
                        for c in range(max(hidden + 1, 0), width):
                            row[c] = -np.inf
                        peak = m[r]
                        for c in range(width):
                            peak = max(peak, row[c])
                        alpha = exp_nonpositive(m[r] - peak)
                        row_sum = f32(0)
                        for c in range(width):
                            row[c] = exp_nonpositive(row[c] - peak)
                            row_sum += row[c]
                        total[r] = total[r] * alpha + row_sum
                        m[r] = peak
                        for c in range(dv):
                            out[r, c] *= alpha
                    product = pv[:n * dv].reshape(n, dv)
                    dot(gemm, tile, v[b, hk, j0:j0 + width], product)
                    for r in range(n):
                        for c in range(dv):
                            out[r, c] += product[r, c]
                for r in range(n):
                    if logs:
                        lse[b, h, i0 + r] = m[r] + math.log(total[r]) if total[r] > 0 else -np.inf
                    inverse = f32(1) / max(total[r], np.finfo(np.float32).tiny)
                    for c in range(dv):
                        y[b, h, i0 + r, c] = out[r, c] * inverse


def scaled_dot_product_attention(generic):
    """The ScaledDotProductAttention kernel for float32 arrays of C layout; `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        q, k, v, bias = (list(ins) + [None])[:4]
        y, lse = (list(outs) + [None])[:2]
        if not takes(q, k, v, y, lse) or not y.size or bias is not None and bias.dtype != np.float32:
            return generic(xp, step, ins, outs, ws)
        scale = float(step.attrs.get("scale") or 0.0) or 1 / math.sqrt(max(q.shape[-1], 1))
        bias = NO_BIAS if bias is None else np.broadcast_to(bias, (*q.shape[:3], k.shape[2]))
        attention(sgemm(), q, k, v, bias, y, NO_LSE if lse is None else lse, f32(scale), bool(step.attrs.get("causal")),
                  ws["rows"].shape[0], ws["cols"].shape[0], ws["s"], ws["acc"], ws["pv"], ws["m"], ws["l"])
    return run
