"""memplan.ScaledDotProductAttention: attention as one tiled op (FlashAttention's online softmax), whose
scratch is one tile pair sized from the workspace limit, so that memory grows with the sequence, not
with its square. Its gradient, recomputing the scores blockwise from the saved log-sum-exp, is
memplan.ScaledDotProductAttentionGrad (planner/ops/fused_attention_grad.py)."""
import math

import numpy as np

from . import schema
from .base import FLOATS, Layout, Schema, broadcast
from .into import iota, matmul
from ..errors import ShapeError

TILE_Q, TILE_K = 128, 512
"""The largest query and key tiles: a (128, 512) float32 score tile (256 KiB) stays in a core's cache."""


def sizes(q, k, v, bias=None):
    """(B, H, Hkv, S, T, D, Dv) from the shapes of Q, K, V and the optional bias; ShapeError where they
    disagree."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise ShapeError(f"Q, K and V must be 4-D (batch, heads, sequence, head size), got shapes "
                         f"{tuple(q)}, {tuple(k)} and {tuple(v)}")
    (batch, heads, s, d), (kb, hkv, t, kd), (vb, vh, vt, dv) = q, k, v
    if not batch == kb == vb:
        raise ShapeError(f"Q, K and V must have one batch size, got {batch}, {kb} and {vb}")
    if hkv != vh or t != vt:
        raise ShapeError(f"K {tuple(k)} and V {tuple(v)} must have the same heads and sequence length")
    if kd != d:
        raise ShapeError(f"Q and K must have one head size, got {d} and {kd}")
    if hkv < 1 or heads % hkv:
        raise ShapeError(f"the {heads} query heads must be a multiple of the {hkv} key and value heads")
    if bias is not None:
        try:
            fits = len(bias) <= 4 and broadcast(tuple(bias), (batch, heads, s, t)) == (batch, heads, s, t)
        except ShapeError:
            fits = False
        if not fits:
            raise ShapeError(f"bias of shape {tuple(bias)} does not broadcast to the scores' {(batch, heads, s, t)}")
    return batch, heads, hkv, s, t, d, dv


def check_attributes(node, attr):
    scale, causal = attr(node, "scale"), attr(node, "causal")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ShapeError(f"scale must be a finite float (0: 1/sqrt(head size)), got {scale!r}")
    if causal not in (0, 1):
        raise ShapeError(f"causal must be 0 or 1, got {causal!r}")


def tiles(s, t, layout, limit):
    """(query rows, keys) of a tile: at most TILE_Q by TILE_K, halved (the larger first) until
    `layout(tq, tk)`, the scratch, fits `limit`; at least (1, 1). Returns the layout too."""
    tq, tk = max(1, min(s, TILE_Q)), max(1, min(t, TILE_K))
    while layout(tq, tk).nbytes > limit and tq * tk > 1:
        if tk >= tq:
            tk = (tk + 1) // 2
        else:
            tq = (tq + 1) // 2
    return layout(tq, tk)


def visible(s, t, causal):
    """The (query, key) pairs that attend: all of them, or under `causal` those with j <= i + t - s."""
    if not causal:
        return s * t
    return int(np.clip(np.arange(s) + t - s + 1, 0, t).sum())


def flat(ws, name, shape):
    """The front of the flat scratch slice `name` as a contiguous array of `shape` (edge tiles are smaller)."""
    return ws[name][:math.prod(shape)].reshape(shape)


class Tiles:
    """One run's walk over tiles: the inputs, the attributes, the tile sizes, and the scores of a tile pair
    (scaled, biased and causally masked) into the scratch."""

    def __init__(self, xp, step, q, k, v, bias, ws):
        self.xp, self.ws = xp, ws
        self.batch, heads, self.hkv, self.s, self.t, d, self.dv = sizes(q.shape, k.shape, v.shape)
        self.groups = heads // self.hkv
        self.scale = float(step.attrs.get("scale") or 0.0) or 1 / math.sqrt(max(d, 1))
        self.causal, self.offset = bool(step.attrs.get("causal")), self.t - self.s
        self.bias = None if bias is None else xp.broadcast_to(bias, (self.batch, heads, self.s, self.t))
        self.tq, self.tk = ws["rows"].shape[0], ws["cols"].shape[0]
        self.wide = ws["s"].dtype
        self.low = float(np.finfo(self.wide).min)
        if self.causal:  # diff[r, c] = c - r: a key c of a tile is hidden from row r when c - r > i0 + offset - j0
            diff, rows, cols = ws["diff"], ws["rows"], ws["cols"]
            iota(xp, cols)
            iota(xp, rows)
            xp.subtract(cols[None, :], rows[:, None], out=diff)

    def heads(self, hk):
        """The query heads that read kv head `hk`."""
        return slice(hk * self.groups, (hk + 1) * self.groups)

    def queries(self):
        return [(i, min(i + self.tq, self.s)) for i in range(0, self.s, self.tq)]

    def keys(self, i0, i1):
        """The key tiles some row of query tile [i0, i1) sees (under `causal`, those left of its last row's bound)."""
        last = self.t if not self.causal else max(0, min(self.t, i1 + self.offset))
        return [(j, min(j + self.tk, self.t)) for j in range(0, last, self.tk)]

    def load(self, name, src):
        """`src` copied into the scratch slice `name` in the accumulation dtype (contiguous, for matmul)."""
        view = flat(self.ws, name, src.shape)
        self.xp.copyto(view, src)
        return view

    def scores(self, q, k, b, hk, i0, i1, j0, j1):
        """scale Q K^T + bias for query rows [i0, i1) of the group's heads (loaded `q`, (G, n, D)) and keys
        [j0, j1) (loaded `k`, (m, D)), -inf where `causal` hides a key: (G, n, m) in the scratch."""
        xp = self.xp
        s = flat(self.ws, "s", (self.groups, i1 - i0, j1 - j0))
        matmul(xp, q, k.T, s)
        xp.multiply(s, self.scale, out=s)
        if self.bias is not None:
            xp.add(s, self.bias[b, self.heads(hk), i0:i1, j0:j1], out=s)
        if self.causal and j1 - 1 > i0 + self.offset:
            hidden = flat(self.ws, "hidden", (i1 - i0, j1 - j0))
            xp.greater(self.ws["diff"][:i1 - i0, :j1 - j0], i0 + self.offset - j0, out=hidden)
            xp.copyto(s, -np.inf, where=hidden)
        return s

    def online(self, s, m, m_new):
        """The online softmax's step on scores `s`: m_new = max(m, row max of s) (never below the dtype's
        lowest, so that a row masked so far stays finite), s = exp(s - m_new); returns alpha = exp(m - m_new)
        by which the running sums shrink (in the scratch)."""
        xp = self.xp
        xp.max(s, axis=-1, keepdims=True, out=m_new)
        xp.maximum(m_new, m, out=m_new)
        alpha = flat(self.ws, "alpha", m.shape)
        xp.subtract(m, m_new, out=alpha)
        xp.exp(alpha, out=alpha)
        xp.subtract(s, m_new, out=s)
        xp.exp(s, out=s)
        return alpha

    def statistics(self, n):
        """The running max m (at the lowest value) and sum l (0) of n rows of the group, and m's spare."""
        shape = (self.groups, n, 1)
        m, spare, total = (flat(self.ws, name, shape) for name in ("m", "m_new", "l"))
        m.fill(self.low)
        total.fill(0)
        return m, spare, total

    def add_row_sums(self, total, s, alpha):
        """l = alpha l + the row sums of s."""
        xp = self.xp
        sums = flat(self.ws, "sums", total.shape)
        xp.sum(s, axis=-1, keepdims=True, out=sums)
        xp.multiply(total, alpha, out=total)
        xp.add(total, sums, out=total)

    def log_sum_exp(self, m, total, out):
        """out = m + log(l): -inf for a row with nothing to attend (l = 0)."""
        xp = self.xp
        xp.log(total, out=out)
        xp.add(out, m, out=out)


def tile_layout(groups, tq, tk, d, wide, causal, *parts):
    """The scratch every tiled kernel shares (score tile, loaded Q and K tiles, row statistics, causal
    masks), then `parts`: (name, elements) of more flat slices of `wide`."""
    rows = groups * tq
    return Layout.pack(("s", (rows * tk,), wide), ("q", (rows * d,), wide), ("k", (tk * d,), wide),
                       *[(name, (rows,), wide) for name in ("m", "m_new", "l", "alpha", "sums")],
                       *[(name, (count,), wide) for name, count in filter(None, parts)],
                       ("rows", (tq,), np.int32), ("cols", (tk,), np.int32),
                       ("diff", (tq, tk), np.int32) if causal else None,
                       ("hidden", (tq * tk,), np.bool_) if causal else None, align=64)


@schema("ScaledDotProductAttention", domain="memplan")
class ScaledDotProductAttention(Schema):
    """Y = softmax(scale Q K^T + bias) V, per head, computed in tiles.

    Inputs Q (B, H, S, D), K (B, Hkv, T, D), V (B, Hkv, T, Dv) and an optional additive `bias` that
    broadcasts to (B, H, S, T) (-inf hides a key; a row with every key hidden gives zeros); query head h
    reads kv head h // (H / Hkv) (grouped-query attention, K and V never copied). `scale`: 0 (default)
    is 1/sqrt(D); `causal`: query i sees keys j <= i + T - S. Outputs Y (B, H, S, Dv) of Q's dtype and
    the optional LSE (B, H, S), each row's log-sum-exp of its scaled, masked scores (-inf for a row
    that sees nothing), in the accumulation dtype (float32, float64 for float64 inputs): what the
    gradient reads instead of the scores."""

    defaults = {"scale": 0.0, "causal": 0}
    types = (("T", "T", "T", "T"), {"T": FLOATS})
    mirror = False

    def infer(self, node, ins):
        check_attributes(node, self.attr)
        q, k, v, bias = (list(ins) + [None])[:4]
        batch, heads, _, s, _, _, dv = sizes(q.shape, k.shape, v.shape, None if bias is None else bias.shape)
        return [((batch, heads, s, dv), q.dtype), ((batch, heads, s), self.accumulation(q.dtype))]

    def workspace(self, node, ins, outs, limit):
        """One tile pair: the (G, tq, tk) scores, the G heads' Q tile (G, tq, D), a K and a V tile, the
        output's accumulator and the P V product (G, tq, Dv), the row statistics, and under `causal` the
        tile's mask; the tiles as large as `limit` allows (TILE_Q by TILE_K at most, one pair at least)."""
        q, k, v = ins[:3]
        _, heads, hkv, s, t, d, dv = sizes(q.shape, k.shape, v.shape)
        wide, causal, g = self.accumulation(q.dtype), self.attr(node, "causal"), heads // hkv
        return tiles(s, t, lambda tq, tk: tile_layout(g, tq, tk, d, wide, causal, ("v", tk * dv),
                                                      ("acc", g * tq * dv), ("pv", g * tq * dv)), limit)

    def flops(self, node, ins, outs):
        """2 (D + Dv) per (query, key) pair that attends (Q K^T and P V; under `causal` the visible ones):
        about 4 B H S T D; the softmax's few operations per score are not counted."""
        batch, heads, _, s, t, d, dv = sizes(ins[0].shape, ins[1].shape, ins[2].shape)
        return 2 * (d + dv) * batch * heads * visible(s, t, self.attr(node, "causal"))

    def kernel(self, xp, step, ins, outs, ws):
        q, k, v, bias = (list(ins) + [None])[:4]
        y, lse = (list(outs) + [None])[:2]
        at = Tiles(xp, step, q, k, v, bias, ws)
        g = at.groups
        for b in range(at.batch):
            for hk in range(at.hkv):
                for i0, i1 in at.queries():
                    n = i1 - i0
                    qt = at.load("q", q[b, at.heads(hk), i0:i1])
                    m, m_new, total = at.statistics(n)
                    acc, pv = flat(ws, "acc", (g, n, at.dv)), flat(ws, "pv", (g, n, at.dv))
                    acc.fill(0)
                    for j0, j1 in at.keys(i0, i1):
                        s = at.scores(qt, at.load("k", k[b, hk, j0:j1]), b, hk, i0, i1, j0, j1)
                        alpha = at.online(s, m, m_new)
                        at.add_row_sums(total, s, alpha)
                        xp.multiply(acc, alpha, out=acc)
                        matmul(xp, s, at.load("v", v[b, hk, j0:j1]), pv)
                        xp.add(acc, pv, out=acc)
                        m, m_new = m_new, m
                    if lse is not None:
                        sums = flat(ws, "sums", (g, n, 1))
                        at.log_sum_exp(m, total, sums)
                        xp.copyto(lse[b, at.heads(hk), i0:i1], sums[..., 0])
                    xp.maximum(total, np.finfo(at.wide).tiny, out=total)  # a row that saw nothing: 0 / tiny
                    xp.divide(acc, total, out=acc)
                    xp.copyto(y[b, at.heads(hk), i0:i1], acc)

    def gradient(self, b, node, dys):
        """dQ, dK, dV and, where a requested gradient depends on the bias, dBias from
        memplan.ScaledDotProductAttentionGrad, which recomputes the scores tile by tile from Q, K and the
        saved LSE (recomputed by that op when the node does not output it); LSE's gradient is its dLSE."""
        dy, dlse = (list(dys) + [None])[:2]
        q, k, v, bias = (list(node.inputs) + [""])[:4]
        lse = node.outputs[1] if len(node.outputs) > 1 else ""
        y = node.outputs[0] if dy else ""
        wanted = 4 if bias and b.needed(bias) else 3
        grads = b.op("ScaledDotProductAttentionGrad", q, k, v, bias, y, lse, dy or "", *([dlse] if dlse else []),
                     outputs=wanted, domain="memplan", **node.attrs)
        return [*grads, None][:len(node.inputs)]

    def torch(self, torch, q, k, v, bias=None, scale=0.0, causal=0):
        """F.scaled_dot_product_attention with K and V repeated per query head; `causal` with S != T as
        an explicit mask (PyTorch's is_causal aligns the top left corner); Y and the LSE."""
        heads, s, t = q.shape[1], q.shape[2], k.shape[2]
        scale = scale or 1 / math.sqrt(q.shape[-1])
        k, v = (x.repeat_interleave(heads // k.shape[1], 1) for x in (k, v))
        mask = bias
        if causal:
            seen = torch.ones(s, t, dtype=torch.bool, device=q.device).tril(t - s)
            hidden = torch.zeros(s, t, dtype=q.dtype, device=q.device).masked_fill(~seen, -math.inf)
            mask = hidden if mask is None else mask + hidden
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        scores = torch.matmul(q.to(wide), k.to(wide).transpose(-1, -2)) * scale
        lse = torch.logsumexp(scores if mask is None else scores + mask.to(wide), -1)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return [y.masked_fill(torch.isneginf(lse)[..., None], 0), lse]


from . import fused_attention_grad  # noqa: E402,F401  (registers the gradient op)
