"""memplan.ScaledDotProductAttention compiled for float32: the same walk over query and key tiles, in the same
planned scratch, with the online softmax of a tile (scale, softcap, masks, bias, row maximum, exponentials, row
sums) one compiled pass over its scores instead of a dozen NumPy calls per (image, head). The products
Q K^T and P V are BLAS GEMMs (executor/jit/blas.py: MKL's, else numba's np.dot), so the loop runs on one
thread and the GEMMs on BLAS's. Dropout and relative-position terms are left to the shared kernel."""
import math

import numpy as np
from numba import njit

from planner.ops.attention_tiles import FILL_MODES, Form, finite
from ..kernels import override
from . import takes
from .blas import dot, sgemm
from .scalar import FASTMATH, exp_nonpositive, f32

NO_BIAS, NO_LSE, NO_MASK = np.zeros((1, 1, 1, 0), np.float32), np.zeros((1, 1, 0), np.float32), np.zeros((1, 1, 1, 0), bool)
"""What the compiled loop takes for an omitted bias, LSE or mask: no key or query fits them."""
SET, ADD, SET_AFTER_BIAS = (FILL_MODES.index(mode) for mode in ("set", "add", "set_after_bias"))


@njit(fastmath=FASTMATH, cache=True)
def attention(gemm, q, k, v, bias, mask, y, lse, form, causal, window, mode, empty_nan, finite_bias, tq, tk, scores, acc,
              pv, top, sums):
    """y (B, H, S, Dv) = softmax(fill(cap(scale q k^T)) + bias) v, query head h reading kv head h // (H / Hkv);
    lse (B, H, S) the rows' log-sum-exp (or NO_LSE); bias broadcast to (B, H, S, T) (or NO_BIAS), and the bool
    mask (False hides a key, as the band does; or NO_MASK); `form` the
    float32 (scale, softcap, fill) and the ints the masks (attention_tiles.Form). scores, acc, pv, top and
    sums are the planned scratch (flat float32), for tq by tk tiles. Hidden keys are skipped where the fill is -inf
    and every value they meet is finite (attention_tiles.Tiles.group; `finite_bias` says the bias's part)."""
    batch, heads, s, dv = y.shape
    t, groups = k.shape[2], heads // k.shape[1]
    scale, softcap, fill = form[0], form[1], form[2]
    offset, biased, logs, skips = t - s, bias.shape[3] == t, lse.shape[2] == s, fill == -np.inf
    masked = mask.shape[3] == t
    lowest = np.finfo(np.float32).min
    for b in range(batch):
        for h in range(heads):
            hk = h // groups
            skip = skips and finite_bias and np.isfinite(np.sum(v[b, hk])) and \
                (mode != ADD or np.isfinite(np.sum(k[b, hk])))
            for i0 in range(0, s, tq):
                n = min(i0 + tq, s) - i0
                m, total, out = top[:n], sums[:n], acc[:n * dv].reshape(n, dv)
                m[:] = lowest
                total[:] = 0
                out[:, :] = 0
                first, last = 0, t
                if causal and skip:
                    last = max(0, min(t, i0 + n + offset))
                    if window:
                        first = min(last, max(0, i0 + offset - window + 1))
                for j0 in range(first, last, tk):
                    width = min(j0 + tk, last) - j0
                    tile = scores[:n * width].reshape(n, width)
                    if n == 1:  # a decoded token: dot products in the loop, cheaper than a BLAS call per head
                        for c in range(width):
                            x = f32(0)
                            for e in range(q.shape[3]):
                                x += q[b, h, i0, e] * k[b, hk, j0 + c, e]
                            tile[0, c] = x
                    else:
                        dot(gemm, q[b, h, i0:i0 + n], k[b, hk, j0:j0 + width].T, tile)
                    for r in range(n):
                        row = tile[r]
                        seen_to = i0 + r + offset - j0 if causal else width  # keys c <= seen_to are seen
                        seen_from = seen_to - window + 1 if causal and window else -1
                        for c in range(width):
                            x = row[c] * scale
                            if softcap > 0:
                                x = f32(math.tanh(x / softcap)) * softcap
                            hidden = c > seen_to or c < seen_from or (masked and not mask[b, h, i0 + r, j0 + c])
                            if hidden and mode == SET:
                                x = fill
                            elif hidden and mode == ADD:
                                x += fill
                            if biased:
                                x += bias[b, h, i0 + r, j0 + c]
                            if hidden and mode == SET_AFTER_BIAS:
                                x = fill
                            row[c] = x
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
                    if n == 1:
                        product[0, :] = 0
                        for c in range(width):
                            weight = tile[0, c]
                            for e in range(dv):
                                product[0, e] += weight * v[b, hk, j0 + c, e]
                    else:
                        dot(gemm, tile, v[b, hk, j0:j0 + width], product)
                    for r in range(n):
                        for c in range(dv):
                            out[r, c] += product[r, c]
                for r in range(n):
                    if logs:
                        lse[b, h, i0 + r] = m[r] + math.log(total[r]) if total[r] > 0 else \
                            -np.inf if total[r] == 0 else np.nan
                    if total[r] > 0:
                        inverse = f32(1) / total[r]
                        for c in range(dv):
                            y[b, h, i0 + r, c] = out[r, c] * inverse
                    else:  # every score -inf, or a NaN: NaN, or zero probabilities times V (NaN where V is not finite)
                        for c in range(dv):
                            y[b, h, i0 + r, c] = np.nan if empty_nan else f32(0)
                            for j in range(t):
                                if not np.isfinite(v[b, hk, j, c]):
                                    y[b, h, i0 + r, c] = np.nan


@override("jit", "ScaledDotProductAttention", domain="memplan")
def scaled_dot_product_attention(generic):
    """The ScaledDotProductAttention kernel for float32 arrays of C layout without dropout or relative-position
    terms; `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        q, k, v, bias, mask = (list(ins) + [None, None])[:5]
        y, lse = (list(outs) + [None])[:2]
        form = Form.of(step.attrs, q.shape[-1])
        relative = any(x is not None for x in ins[5:])  # dropout's step, relative-position terms
        if not takes(q, k, v, y, lse) or not y.size or form.dropout or relative or \
                bias is not None and bias.dtype != np.float32:
            return generic(xp, step, ins, outs, ws)
        scores = (*q.shape[:3], k.shape[2])
        bias = NO_BIAS if bias is None else np.broadcast_to(bias, scores)
        mask = NO_MASK if mask is None else np.broadcast_to(mask, scores)
        numbers = np.array([form.scale, form.softcap, form.fill], np.float32)
        finite_bias = bias is NO_BIAS or form.fill_mode == "set_after_bias" or finite(np, ins[3])
        attention(sgemm(), q, k, v, bias, mask, y, NO_LSE if lse is None else lse, numbers, form.causal, form.window,
                  FILL_MODES.index(form.fill_mode), form.empty_rows == "nan", finite_bias, ws["rows"].shape[0],
                  ws["cols"].shape[0], ws["s"], ws["acc"], ws["pv"], ws["m"], ws["l"])
    return run
