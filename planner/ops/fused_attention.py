"""memplan.ScaledDotProductAttention: attention as one tiled op (FlashAttention's online softmax), whose
scratch is one tile pair sized from the workspace limit, so that memory grows with the sequence, not
with its square. Its gradient, recomputing the scores blockwise from the saved log-sum-exp, is
memplan.ScaledDotProductAttentionGrad (planner/ops/fused_attention_grad.py)."""
from dataclasses import replace

import numpy as np

from .registry import schema
from .attention_tiles import (DEFAULTS, Form, Tiles, check_attributes, check_mask, check_relative, check_step, flat,
                              sizes, tile_layout, tiles, widths)
from .base import FLOATS, Schema
from .into import matmul
from ..ir import Tensor


@schema("ScaledDotProductAttention", domain="memplan")
class ScaledDotProductAttention(Schema):
    """Y = softmax(mask(cap(scale Q K^T)) + bias) V, per head, computed in tiles (attention_tiles.Form).

    Inputs Q (B, H, S, D), K (B, Hkv, T, D), V (B, Hkv, T, Dv), an optional additive `bias` and bool `mask`
    (False hides a key, as the band does) that broadcast to (B, H, S, T), `step` (a float64 scalar), which
    dropout needs, and relative-position terms added to the scores (DeBERTa's), each a table and an int64 index of S + T - 1: `rows` (B, H, S, R) adds
    rows[i, rows_index[i - j + T - 1]], `cols` (B, H, T, R') adds cols[j, cols_index[j - i + S - 1]], so that
    the (S, T) terms are never held; query head h reads kv head h // (H / Hkv) (grouped-query attention, K
    and V never copied). `scale`: 0 (default) is 1/sqrt(D);
    `softcap` > 0: scores become softcap tanh(scores / softcap); `causal`: query i sees keys
    j <= i + T - S, and with `window` > 0 only the last `window` of those; hidden keys' scores take
    `fill` (-inf by default) by `fill_mode`; a row whose softmax is NaN (every score -inf, or a NaN or +inf
    score) gives NaN or, as SDPA's exports guard it, zero probabilities (0 V: zeros, NaN where V is not
    finite) (`empty_rows`); `dropout` drops probabilities with a counter-based hash of (`seed`, step, element).
    Outputs Y (B, H, S, Dv) of Q's dtype and the optional LSE (B, H, S), each row's log-sum-exp of its
    scores (-inf for a row that sees nothing), in the accumulation dtype (float32, float64 for float64
    inputs): what the gradient reads instead of the scores."""

    stat = "fused_attention"
    split = "attention"
    autocast = "low"
    defaults = dict(DEFAULTS)
    types = (("T", "T", "T", "T", "B", "S", "T", "I", "T", "I"),
             {"T": FLOATS, "B": ("tensor(bool)",), "S": FLOATS, "I": ("tensor(int64)",)})
    mirror = False

    def infer(self, node, ins):
        check_attributes(node, self.attr)
        q, k, v, bias, mask, step = (list(ins) + [None] * 3)[:6]
        batch, heads, _, s, t, _, dv = sizes(q.shape, k.shape, v.shape, None if bias is None else bias.shape)
        check_mask(mask, (batch, heads, s, t))
        check_step(self.attr(node, "dropout"), step)
        check_relative(ins[6:10], batch, heads, s, t)
        return [((batch, heads, s, dv), q.dtype), ((batch, heads, s), self.accumulation(q.dtype))]

    def training_form(self, node, step):
        """Keeping its rows' log-sum-exp (O(seq), so that backward recomputes no scores pass) and drawing its
        dropout by the step."""
        if len(node.outputs) < 2:
            lse = f"{node.outputs[0]}/lse"
            step.tensors[lse] = Tensor(lse, None, None, "activation")
            node = replace(node, outputs=(node.outputs[0], lse))
        if node.attrs.get("dropout") and (len(node.inputs) < 6 or not node.inputs[5]):
            node = replace(node, inputs=(*(*node.inputs, "", "")[:5], step.counter, *node.inputs[6:]),
                           attrs={"seed": step.index, **node.attrs})
        return node

    def workspace(self, node, ins, outs, limit):
        """One tile pair: the (G, tq, tk) scores, the G heads' Q tile (G, tq, D), a K and a V tile, the
        output's accumulator and the P V product (G, tq, Dv), the row statistics, and the form's masks; the
        tiles as large as `limit` allows (TILE_Q by TILE_K at most, one pair at least)."""
        q, k, v = ins[:3]
        _, heads, hkv, s, t, d, dv = sizes(q.shape, k.shape, v.shape)
        wide, form, g = self.accumulation(q.dtype), Form.of(self.normalize(node)), heads // hkv
        relative, masked = widths(*(list(ins) + [None] * 10)[6:10:2]), len(ins) > 4 and ins[4] is not None
        return tiles(s, t, lambda tq, tk: tile_layout(g, tq, tk, d, wide, form, ("v", tk * dv), ("acc", g * tq * dv),
                                                      ("pv", g * tq * dv), ("v_max", dv), ("v_min", dv),
                                                      relative=relative, masked=masked), limit)

    def flops(self, node, ins, outs):
        """2 (D + Dv) per (query, key) pair computed (Q K^T and P V; with hidden keys skipped, the visible
        ones): about 4 B H S T D; the softmax's few operations per score are not counted."""
        batch, heads, _, s, t, d, dv = sizes(ins[0].shape, ins[1].shape, ins[2].shape)
        return 2 * (d + dv) * batch * heads * Form.of(self.normalize(node)).visible(s, t)

    def kernel(self, xp, step, ins, outs, ws):
        q, k, v, bias, mask, count = (list(ins) + [None] * 3)[:6]
        y, lse = (list(outs) + [None])[:2]
        at = Tiles(xp, step, q, k, v, bias, ws, count, (list(ins[6:10]) + [None] * 4)[:4], mask)
        g = at.groups
        for b in range(at.batch):
            for hk in range(at.hkv):
                at.group(b, hk)
                for i0, i1 in at.queries():
                    n = i1 - i0
                    qt = at.load("q", q[b, at.heads(hk), i0:i1])
                    m, m_new, total = at.statistics(n)
                    acc, pv = flat(ws, "acc", (g, n, at.dv)), flat(ws, "pv", (g, n, at.dv))
                    acc.fill(0)
                    for j0, j1 in at.keys(i0, i1):
                        s, _ = at.scores(qt, at.load("k", k[b, hk, j0:j1]), b, hk, i0, i1, j0, j1)
                        alpha = at.online(s, m, m_new)
                        at.add_row_sums(total, s, alpha)
                        at.drop(s, at.dropped(b, hk, i0, i1, j0, j1))
                        xp.multiply(acc, alpha, out=acc)
                        matmul(xp, s, at.load("v", v[b, hk, j0:j1]), pv)
                        xp.add(acc, pv, out=acc)
                        m, m_new = m_new, m
                    if lse is not None:
                        sums = flat(ws, "sums", (g, n, 1))
                        at.log_sum_exp(m, total, sums)
                        xp.copyto(lse[b, at.heads(hk), i0:i1], sums[..., 0])
                    with np.errstate(invalid="ignore", divide="ignore"):
                        xp.divide(acc, total, out=acc)
                    if at.form.empty_rows == "zero":
                        at.zero_empty_rows(acc, total, v[b, hk])
                    xp.copyto(y[b, at.heads(hk), i0:i1], acc)

    def gradient(self, b, node, dys):
        """dQ, dK, dV and, where a requested gradient depends on the bias, dBias from
        memplan.ScaledDotProductAttentionGrad, which recomputes the scores tile by tile from Q, K and the
        saved LSE (recomputed by that op when the node does not output it); LSE's gradient is its dLSE."""
        dy, dlse = (list(dys) + [None])[:2]
        q, k, v, bias, mask, step, rows, rows_index, cols, cols_index = (list(node.inputs) + [""] * 7)[:10]
        lse = node.outputs[1] if len(node.outputs) > 1 else ""
        y = node.outputs[0] if dy else ""
        wanted = (True, True, True, bool(bias) and b.needed(bias), bool(rows) and b.needed(rows),
                  bool(cols) and b.needed(cols))
        relative = (rows, rows_index, cols, cols_index) if rows or cols else ()
        dq, dk, dv, dbias, drows, dcols = (*b.op("ScaledDotProductAttentionGrad", q, k, v, bias, y, lse, dy or "",
                                                 dlse or "", mask, step, *relative, outputs=wanted[:max(
                                                     k + 1 for k, w in enumerate(wanted) if w)], domain="memplan",
                                                 **node.attrs), None, None, None)[:6]
        return [dq, dk, dv, dbias, None, None, drows, None, dcols, None][:len(node.inputs)]

    def torch(self, torch, q, k, v, bias=None, mask=None, step=None, rows=None, rows_index=None, cols=None,
              cols_index=None, **attrs):
        """Y and the LSE by the formula in the accumulation dtype, K and V repeated per query head, the relative
        terms gathered whole; dropout draws memplan's own mask."""
        form = Form.of(attrs, q.shape[-1])
        heads, s, t = q.shape[1], q.shape[2], k.shape[2]
        k, v = (x.repeat_interleave(heads // k.shape[1], 1) for x in (k, v))
        wide = torch.float64 if q.dtype == torch.float64 else torch.float32
        scores = torch.matmul(q.to(wide), k.to(wide).transpose(-1, -2)) * form.scale
        if form.softcap:
            scores = torch.tanh(scores / form.softcap) * form.softcap
        i, j = torch.arange(s, device=q.device)[:, None], torch.arange(t, device=q.device)[None, :]
        hidden = ((j > i + t - s) | ((j <= i + t - s - form.window) if form.window else False)) if form.causal \
            else torch.zeros((s, t), dtype=torch.bool, device=q.device)
        if mask is not None:
            hidden = hidden | ~mask
        fill = torch.tensor(form.fill, dtype=wide, device=q.device)
        if form.fill_mode == "set":
            scores = torch.where(hidden, fill, scores)
        elif form.fill_mode == "add":
            scores = torch.where(hidden, scores + fill, scores)
        if bias is not None:
            scores = scores + bias.to(wide)
        if rows is not None:
            at = rows_index[i - j + t - 1].expand(*rows.shape[:2], s, t)
            scores = scores + torch.gather(rows.to(wide), -1, at)
        if cols is not None:
            at = cols_index[(j - i + s - 1).T].expand(*cols.shape[:2], t, s)
            scores = scores + torch.gather(cols.to(wide), -1, at).transpose(-1, -2)
        if form.fill_mode == "set_after_bias":
            scores = torch.where(hidden, fill, scores)
        lse = torch.logsumexp(scores, -1)
        p = torch.softmax(scores, -1)
        if form.empty_rows == "zero":
            p = torch.where(torch.isnan(p), 0, p)
        if form.dropout:
            from .misc import dropout_keep
            keep = dropout_keep(np, p.numel(), form.seed, float(step), form.dropout).reshape(tuple(p.shape))
            p = p * torch.from_numpy(keep).to(p.device) / (1 - form.dropout)
        return [torch.matmul(p, v.to(wide)).to(q.dtype), lse]


from . import fused_attention_grad  # noqa: E402,F401  (registers the gradient op)
