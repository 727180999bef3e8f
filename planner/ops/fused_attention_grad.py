"""memplan.ScaledDotProductAttentionGrad: the gradient of memplan.ScaledDotProductAttention as
FlashAttention-2's backward, the scores recomputed tile by tile from Q, K and the saved log-sum-exp,
so that training keeps O(S) memory beside the inputs, never the (S, T) probabilities."""
import math

from .registry import get, schema
from .base import FLOATS, Schema
from .attention_tiles import (DEFAULTS, Form, Tiles, check_attributes, check_mask, check_relative, check_step, flat,
                              sizes, tile_layout, tiles, widths)
from .into import matmul
from ..errors import ShapeError


@schema("ScaledDotProductAttentionGrad", domain="memplan")
class ScaledDotProductAttentionGrad(Schema):
    """Inputs Q, K, V, bias (or ""), Y, LSE (or "": recomputed here, one more pass of Q K^T), dY as
    memplan.ScaledDotProductAttention's, the optional dLSE (Y and dY may be "" where dLSE is given), the
    mask, the step (which dropout needs) and the relative-position tables with their indices; outputs dQ, dK, dV and,
    where asked for (an input that needs a gradient), dBias, dRows and dCols of their inputs' shapes. Per kv head, for each key tile (its dK and dV summed in the scratch over the
    query tiles of every head of its group) and each query tile: P = exp(S - LSE) and its dropped form Pd,
    dV += Pd^T dY, dP = dY V^T (dropped as P was), dS = P (dP - D) with D = rowsum(dY Y) - dLSE
    (d lse_i / d s_ij = p_ij), dBias += dS summed over the axes the bias broadcasts along (hidden keys
    excluded where the fill was set after the bias), dS zeroed where a set fill hid the key and times
    1 - tanh^2 under a softcap, dQ += scale dS K, dK += scale dS^T Q; dS scattered into the relative tables'
    sums, (G, S, R) and (G, T, R') a group. dQ and dBias sum in their outputs, or for 16-bit floats in float32
    scratch (dQ's of the group's (G, S, D) rows, dBias's of its whole shape where it broadcasts)."""

    defaults = dict(DEFAULTS)
    types = (("T", "T", "T", "T", "T", "L", "T", "L", "B", "S", "T", "I", "T", "I"),
             {"T": FLOATS, "L": FLOATS, "B": ("tensor(bool)",), "S": FLOATS, "I": ("tensor(int64)",)})
    mirror = False

    def infer(self, node, ins):
        check_attributes(node, self.attr)
        if not 7 <= len(ins) <= 14:
            raise ShapeError(f"takes 7 to 14 inputs (Q, K, V, bias, Y, LSE, dY, dLSE, mask, step, rows, rows_index, "
                             f"cols and cols_index; all but Q, K, V and dY or dLSE may be empty), got {len(ins)}")
        q, k, v, bias, y, lse, dy, dlse, mask, step = (list(ins) + [None] * 3)[:10]
        check_step(self.attr(node, "dropout"), step)
        if dy is None and dlse is None or (dy is None) != (y is None):
            raise ShapeError("takes dY with Y, or dLSE, or both")
        batch, heads, _, s, t, _, dv = sizes(q.shape, k.shape, v.shape, None if bias is None else bias.shape)
        tables = (list(ins[10:14]) + [None] * 4)[:4]
        check_mask(mask, (batch, heads, s, t))
        check_relative(tables, batch, heads, s, t)
        for name, info, shape in (("Y", y, (batch, heads, s, dv)), ("dY", dy, (batch, heads, s, dv)),
                                  ("LSE", lse, (batch, heads, s)), ("dLSE", dlse, (batch, heads, s))):
            if info is not None and tuple(info.shape) != shape:
                raise ShapeError(f"{name} must have shape {shape}, got {tuple(info.shape)}")
            if info is not None and "LSE" in name and info.dtype != self.accumulation(q.dtype):
                raise ShapeError(f"{name} must be {self.accumulation(q.dtype)} for {q.dtype} inputs, got {info.dtype}")
        grads = [(x.shape, x.dtype) for x in (q, k, v, bias, tables[0], tables[2]) if x is not None]
        if len(node.outputs) > len(grads):  # what an omitted output of an input not given would be
            grads = [(x.shape, x.dtype) if x is not None else ((), q.dtype) for x in (q, k, v, bias, tables[0], tables[2])]
        return grads

    def workspace(self, node, ins, outs, limit):
        """One tile pair as the forward's (scores, Q, K and V tiles, row statistics), dP, the dY tile and
        the three products, the key tile's dK and dV sums; the group's rows' LSE and D (G, S); for 16-bit
        floats the accumulators, dQ's float32 sums (G, S, D) and dBias's (the bias's shape, when asked for),
        beyond `limit` where they must be: the tiles are sized without them. dBias's sums over broadcast
        axes reuse the score tile."""
        q, k, v, bias = ins[:4]
        batch, heads, hkv, s, t, d, dv = sizes(q.shape, k.shape, v.shape)
        wide, form, g = self.accumulation(q.dtype), Form.of(self.normalize(node)), heads // hkv
        narrow = wide != q.dtype
        asked = [outs is not None and len(outs) > k and outs[k] is not None for k in (3, 4, 5)]
        dbias = asked[0] and sums_apart(narrow, bias.shape, (batch, heads, s, t))
        relative, masked = widths(*(list(ins) + [None] * 14)[10:14:2]), len(ins) > 8 and ins[8] is not None

        def layout(tq, tk, *accumulators):
            return tile_layout(g, tq, tk, d, wide, form, ("v", tk * dv), ("dp", g * tq * tk), ("dy", g * tq * dv),
                               ("capped", g * tq * tk) if form.softcap else None,
                               ("dq", g * tq * d), ("dk", tk * d), ("dv", tk * dv), ("dk_sum", tk * d),
                               ("dv_sum", tk * dv), ("lse", g * s), ("delta", g * s), ("prod", g * tq * dv),
                               *accumulators, relative=relative, masked=masked)
        tile = tiles(s, t, layout, limit)
        if not narrow and not any(asked[1:]):
            return tile
        shapes = {c.name: c.shape for c in tile.slices}
        return layout(shapes["rows"][0], shapes["cols"][0], ("dq_sum", g * s * d) if narrow else None,
                      ("dbias_sum", math.prod(bias.shape)) if dbias else None,
                      ("drows_sum", g * s * relative[0]) if asked[1] else None,
                      ("dcols_sum", g * t * relative[1]) if asked[2] else None)

    def flops(self, node, ins, outs):
        """2 (3 D + 2 Dv) per attending (query, key) pair: Q K^T again, dY V^T, P^T dY, dS K and dS^T Q
        (the two products with dY only when it is given); 2 D more when LSE is recomputed."""
        batch, heads, _, s, t, d, dv = sizes(ins[0].shape, ins[1].shape, ins[2].shape)
        per_pair = 6 * d + (4 * dv if ins[6] is not None else 0) + (2 * d if ins[5] is None else 0)
        return per_pair * batch * heads * Form.of(self.normalize(node)).visible(s, t)

    def kernel(self, xp, step, ins, outs, ws):
        q, k, v, bias, y, lse_in, dy, dlse, mask, count = (list(ins) + [None] * 3)[:10]
        dq, dk, dv, dbias, drows, dcols = (list(outs) + [None] * 3)[:6]
        at = Tiles(xp, step, q, k, v, bias, ws, count, (list(ins[10:14]) + [None] * 4)[:4], mask)
        sums = [None if out is None else flat(ws, name, (at.groups, *out.shape[2:]))
                for out, name in ((drows, "drows_sum"), (dcols, "dcols_sum"))]
        g, d = at.groups, q.shape[-1]
        narrow = at.wide != dq.dtype
        if not narrow:
            dq.fill(0)
        bias_sum, apart = None, False
        if dbias is not None:
            apart = sums_apart(narrow, dbias.shape, (at.batch, q.shape[1], at.s, at.t))
            shape = (1,) * (4 - dbias.ndim) + dbias.shape
            bias_sum = flat(ws, "dbias_sum", shape) if apart else dbias.reshape(shape)
            bias_sum.fill(0)
        for b in range(at.batch):
            for hk in range(at.hkv):
                at.group(b, hk)
                heads = at.heads(hk)
                lse = flat(ws, "lse", (g, at.s, 1))
                if lse_in is not None:
                    xp.copyto(lse[..., 0], lse_in[b, heads])
                else:
                    self.log_sum_exp(at, q, k, b, hk, lse)
                xp.maximum(lse, at.low, out=lse)  # a row that sees nothing (-inf): its scores' P = exp(-inf) = 0
                delta = flat(ws, "delta", (g, at.s, 1))
                for i0, i1 in at.queries():
                    rows = delta[:, i0:i1]
                    if dy is None:
                        rows.fill(0)
                    else:
                        prod = flat(ws, "prod", (g, i1 - i0, at.dv))
                        xp.multiply(at.load("dy", dy[b, heads, i0:i1]), y[b, heads, i0:i1], out=prod)
                        xp.sum(prod, axis=-1, keepdims=True, out=rows)
                    if dlse is not None:
                        xp.subtract(rows, dlse[b, heads, i0:i1, None], out=rows)
                dq_sum = flat(ws, "dq_sum", (g, at.s, d)) if narrow else dq[b, heads]
                for total in (dq_sum if narrow else None, *sums):
                    if total is not None:
                        total.fill(0)
                for j0, j1 in [(j, min(j + at.tk, at.t)) for j in range(0, at.t, at.tk)]:
                    self.key_tile(at, (q, k, v, dy), (b, hk, j0, j1), lse, delta, dq_sum, (bias_sum, *sums))
                    xp.copyto(dk[b, hk, j0:j1], flat(ws, "dk_sum", (j1 - j0, d)))
                    xp.copyto(dv[b, hk, j0:j1], flat(ws, "dv_sum", (j1 - j0, at.dv)))
                if narrow:
                    xp.copyto(dq[b, heads], dq_sum)
                for out, total in zip((drows, dcols), sums):
                    if out is not None:
                        xp.copyto(out[b, heads], total)
        if apart:
            xp.copyto(dbias.reshape(bias_sum.shape), bias_sum)

    @staticmethod
    def key_tile(at, arrays, where, lse, delta, dq_sum, totals):
        """dK and dV of keys [j0, j1) of batch b and kv head hk (`where`) summed over the query tiles that
        see them; their dQ added to `dq_sum`, their dS to the `totals` of dBias and of the relative tables
        (each None where not asked for)."""
        bias_sum = totals[0]
        (q, k, v, dy), (b, hk, j0, j1) = arrays, where
        xp, ws, g, d, m = at.xp, at.ws, at.groups, q.shape[-1], j1 - j0
        kt, vt = at.load("k", k[b, hk, j0:j1]), at.load("v", v[b, hk, j0:j1])
        dk_sum, dv_sum = flat(ws, "dk_sum", (m, d)), flat(ws, "dv_sum", (m, at.dv))
        dk_sum.fill(0)
        dv_sum.fill(0)
        dk_part, dv_part = flat(ws, "dk", (m, d)), flat(ws, "dv", (m, at.dv))
        form = at.form
        for i0, i1 in at.queries():
            if not at.sees(i0, i1, j0, j1):
                continue
            n = i1 - i0
            qt = at.load("q", q[b, at.heads(hk), i0:i1])
            capped = flat(ws, "capped", (g, n, m)) if form.softcap else None
            p, hidden = at.scores(qt, kt, b, hk, i0, i1, j0, j1, capped)
            xp.subtract(p, lse[:, i0:i1], out=p)
            xp.exp(p, out=p)
            ds = flat(ws, "dp", (g, n, m))
            if dy is None:
                ds.fill(0)
            else:
                dropped = at.dropped(b, hk, i0, i1, j0, j1)
                dyt = at.load("dy", dy[b, at.heads(hk), i0:i1])
                xp.copyto(ds, p)
                matmul(xp, at.drop(ds, dropped).reshape(g * n, m).T, dyt.reshape(g * n, at.dv), dv_part)
                xp.add(dv_sum, dv_part, out=dv_sum)
                matmul(xp, dyt, vt.T, ds)
                at.drop(ds, dropped)
            xp.subtract(ds, delta[:, i0:i1], out=ds)
            xp.multiply(ds, p, out=ds)
            if hidden is not None and form.fill_mode == "set_after_bias":
                xp.copyto(ds, 0, where=hidden)
            if bias_sum is not None:
                add_bias_grad(at, ds, bias_sum, b, hk, (i0, i1, j0, j1))
            for term, total in enumerate(totals[1:]):
                if total is not None:
                    xp.add.at(total.reshape(-1), at.gathered(term, (i0, i1, j0, j1), total.shape[1:], 0), ds)
            if hidden is not None and form.fill_mode == "set":
                xp.copyto(ds, 0, where=hidden)
            if capped is not None:
                xp.multiply(capped, capped, out=capped)
                xp.subtract(1, capped, out=capped)
                xp.multiply(ds, capped, out=ds)
            xp.multiply(ds, at.scale, out=ds)
            dq_part = flat(ws, "dq", (g, n, d))
            matmul(xp, ds, kt, dq_part)
            xp.add(dq_sum[:, i0:i1], dq_part, out=dq_sum[:, i0:i1])
            matmul(xp, ds.reshape(g * n, m).T, qt.reshape(g * n, d), dk_part)
            xp.add(dk_sum, dk_part, out=dk_sum)

    @staticmethod
    def log_sum_exp(at, q, k, b, hk, out):
        """Each row's log-sum-exp of the group's scores into `out` (G, S, 1), by the online softmax."""
        for i0, i1 in at.queries():
            qt = at.load("q", q[b, at.heads(hk), i0:i1])
            m, m_new, total = at.statistics(i1 - i0)
            for j0, j1 in at.keys(i0, i1):
                s, _ = at.scores(qt, at.load("k", k[b, hk, j0:j1]), b, hk, i0, i1, j0, j1)
                at.add_row_sums(total, s, at.online(s, m, m_new))
                m, m_new = m_new, m
            at.log_sum_exp(m, total, out[:, i0:i1])

    def torch(self, torch, q, k, v, bias, y, lse, dy, dlse=None, mask=None, step=None, rows=None, rows_index=None,
              cols=None, cols_index=None, **attrs):
        """PyTorch's own gradient of the forward's form: dQ, dK, dV, dBias, dRows and dCols (None for an input
        not given), in the outputs' places."""
        with torch.enable_grad():
            given = [None if x is None else x.detach().requires_grad_() for x in (q, k, v, bias, rows, cols)]
            outs = get("ScaledDotProductAttention", "memplan").torch(torch, *given[:4], mask, step, given[4], rows_index,
                                                                     given[5], cols_index, **attrs)
            pairs = [(out, grad) for out, grad in zip(outs, (dy, dlse)) if grad is not None]
            wanted = [x for x in given if x is not None]
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs]))
            return [None if x is None else next(grads) for x in given]


def sums_apart(narrow, bias, full):
    """Whether dBias sums in float32 scratch: for 16-bit floats where the bias broadcasts to the scores' `full`
    shape, so that an element sums several tiles' dS (a bias of that shape takes each once, into its output)."""
    return narrow and (1,) * (4 - len(bias)) + tuple(bias) != tuple(full)


def add_bias_grad(at, ds, total, b, hk, box):
    """dS of the tile `box` (i0, i1, j0, j1) of batch b and kv head hk's group, (G, n, m), added to `total`,
    dBias as (B', H', S', T') (1 where the bias broadcasts): summed over the axes the bias broadcasts along
    into the score slice, free once dS holds P's part."""
    xp, (i0, i1, j0, j1) = at.xp, box
    _, h, s, t = total.shape
    target = total[b if total.shape[0] > 1 else 0, at.heads(hk) if h > 1 else slice(0, 1),
                   slice(i0, i1) if s > 1 else slice(0, 1), slice(j0, j1) if t > 1 else slice(0, 1)]
    axes = tuple(a for a, size in enumerate((h, s, t)) if size == 1)
    if axes:
        part = flat(at.ws, "s", target.shape)
        xp.sum(ds, axis=axes, keepdims=True, out=part)
        ds = part
    xp.add(target, ds, out=target)
