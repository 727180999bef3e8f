"""memplan.ScaledDotProductAttentionGrad: the gradient of memplan.ScaledDotProductAttention as
FlashAttention-2's backward, the scores recomputed tile by tile from Q, K and the saved log-sum-exp,
so that training keeps O(S) memory beside the inputs, never the (S, T) probabilities."""
from . import schema
from .base import FLOATS, Schema
from .fused_attention import Tiles, check_attributes, flat, sizes, tile_layout, tiles, visible
from ..errors import ShapeError


@schema("ScaledDotProductAttentionGrad", domain="memplan")
class ScaledDotProductAttentionGrad(Schema):
    """Inputs Q, K, V, bias (or ""), Y, LSE (or "": recomputed here, one more pass of Q K^T), dY as
    memplan.ScaledDotProductAttention's; outputs dQ, dK, dV. Per kv head, for each key tile (its dK and
    dV summed in the scratch over the query tiles of every head of its group) and each query tile:
    P = exp(S - LSE), dV += P^T dY, dP = dY V^T, dS = P (dP - D) with D = rowsum(dY Y), dQ += scale dS K,
    dK += scale dS^T Q. dQ sums in its output, or for 16-bit floats in float32 scratch of the group's
    (G, S, D) rows."""

    defaults = {"scale": 0.0, "causal": 0}
    types = (("T", "T", "T", "T", "T", "L", "T"), {"T": FLOATS, "L": FLOATS})
    mirror = False

    def infer(self, node, ins):
        check_attributes(node, self.attr)
        if len(ins) != 7:
            raise ShapeError(f"takes 7 inputs (Q, K, V, bias, Y, LSE, dY; bias and LSE may be empty), got {len(ins)}")
        q, k, v, bias, y, lse, dy = ins
        batch, heads, _, s, _, _, dv = sizes(q.shape, k.shape, v.shape, None if bias is None else bias.shape)
        for name, info, shape in (("Y", y, (batch, heads, s, dv)), ("dY", dy, (batch, heads, s, dv)),
                                  ("LSE", lse, (batch, heads, s))):
            if info is not None and tuple(info.shape) != shape:
                raise ShapeError(f"{name} must have shape {shape}, got {tuple(info.shape)}")
        if lse is not None and lse.dtype != self.accumulation(q.dtype):
            raise ShapeError(f"LSE must be {self.accumulation(q.dtype)} for {q.dtype} inputs, got {lse.dtype}")
        return [(q.shape, q.dtype), (k.shape, k.dtype), (v.shape, v.dtype)]

    def workspace(self, node, ins, outs, limit):
        """One tile pair as the forward's (scores, Q, K and V tiles, row statistics), dP, the dY tile and
        the three products, the key tile's dK and dV sums; the group's rows' LSE and D (G, S); for 16-bit
        floats dQ's float32 sums (G, S, D), beyond `limit` where it must be."""
        q, k, v = ins[:3]
        _, heads, hkv, s, t, d, dv = sizes(q.shape, k.shape, v.shape)
        wide, causal, g = self.accumulation(q.dtype), self.attr(node, "causal"), heads // hkv
        narrow = wide != q.dtype

        def layout(tq, tk):
            return tile_layout(g, tq, tk, d, wide, causal, ("v", tk * dv), ("dp", g * tq * tk), ("dy", g * tq * dv),
                               ("dq", g * tq * d), ("dk", tk * d), ("dv", tk * dv), ("dk_sum", tk * d),
                               ("dv_sum", tk * dv), ("lse", g * s), ("delta", g * s), ("prod", g * tq * dv),
                               ("dq_sum", g * s * d) if narrow else None)
        return tiles(s, t, layout, limit)

    def flops(self, node, ins, outs):
        """2 (3 D + 2 Dv) per attending (query, key) pair: Q K^T again, dY V^T, P^T dY, dS K and dS^T Q;
        2 D more when LSE is recomputed."""
        batch, heads, _, s, t, d, dv = sizes(ins[0].shape, ins[1].shape, ins[2].shape)
        per_pair = 2 * (3 * d + 2 * dv) + (2 * d if ins[5] is None else 0)
        return per_pair * batch * heads * visible(s, t, self.attr(node, "causal"))

    def kernel(self, xp, step, ins, outs, ws):
        q, k, v, bias, y, lse_in, dy = ins
        dq, dk, dv = outs
        at = Tiles(xp, step, q, k, v, bias, ws)
        g, d = at.groups, q.shape[-1]
        narrow = at.wide != dq.dtype
        if not narrow:
            dq.fill(0)
        for b in range(at.batch):
            for hk in range(at.hkv):
                heads = at.heads(hk)
                lse = flat(ws, "lse", (g, at.s, 1))
                if lse_in is not None:
                    xp.copyto(lse[..., 0], lse_in[b, heads])
                else:
                    self.log_sum_exp(at, q, k, b, hk, lse)
                xp.maximum(lse, at.low, out=lse)  # a row that sees nothing (-inf): its scores' P = exp(-inf) = 0
                delta = flat(ws, "delta", (g, at.s, 1))
                for i0, i1 in at.queries():
                    prod = flat(ws, "prod", (g, i1 - i0, at.dv))
                    xp.multiply(at.load("dy", dy[b, heads, i0:i1]), y[b, heads, i0:i1], out=prod)
                    xp.sum(prod, axis=-1, keepdims=True, out=delta[:, i0:i1])
                dq_sum = flat(ws, "dq_sum", (g, at.s, d)) if narrow else dq[b, heads]
                if narrow:
                    dq_sum.fill(0)
                for j0, j1 in [(j, min(j + at.tk, at.t)) for j in range(0, at.t, at.tk)]:
                    self.key_tile(at, q, k, v, dy, b, hk, j0, j1, lse, delta, dq_sum)
                    xp.copyto(dk[b, hk, j0:j1], flat(ws, "dk_sum", (j1 - j0, d)))
                    xp.copyto(dv[b, hk, j0:j1], flat(ws, "dv_sum", (j1 - j0, at.dv)))
                if narrow:
                    xp.copyto(dq[b, heads], dq_sum)

    @staticmethod
    def key_tile(at, q, k, v, dy, b, hk, j0, j1, lse, delta, dq_sum):
        """dK and dV of keys [j0, j1) summed over the query tiles that see them; their dQ added to `dq_sum`."""
        xp, ws, g, d, m = at.xp, at.ws, at.groups, q.shape[-1], j1 - j0
        kt, vt = at.load("k", k[b, hk, j0:j1]), at.load("v", v[b, hk, j0:j1])
        dk_sum, dv_sum = flat(ws, "dk_sum", (m, d)), flat(ws, "dv_sum", (m, at.dv))
        dk_sum.fill(0)
        dv_sum.fill(0)
        dk_part, dv_part = flat(ws, "dk", (m, d)), flat(ws, "dv", (m, at.dv))
        for i0, i1 in at.queries():
            if at.causal and j0 > i1 - 1 + at.offset:
                continue
            n = i1 - i0
            qt, dyt = at.load("q", q[b, at.heads(hk), i0:i1]), at.load("dy", dy[b, at.heads(hk), i0:i1])
            p = at.scores(qt, kt, b, hk, i0, i1, j0, j1)
            xp.subtract(p, lse[:, i0:i1], out=p)
            xp.exp(p, out=p)
            xp.matmul(p.reshape(g * n, m).T, dyt.reshape(g * n, at.dv), out=dv_part)
            xp.add(dv_sum, dv_part, out=dv_sum)
            ds = flat(ws, "dp", (g, n, m))
            xp.matmul(dyt, vt.T, out=ds)
            xp.subtract(ds, delta[:, i0:i1], out=ds)
            xp.multiply(ds, p, out=ds)
            xp.multiply(ds, at.scale, out=ds)
            dq_part = flat(ws, "dq", (g, n, d))
            xp.matmul(ds, kt, out=dq_part)
            xp.add(dq_sum[:, i0:i1], dq_part, out=dq_sum[:, i0:i1])
            xp.matmul(ds.reshape(g * n, m).T, qt.reshape(g * n, d), out=dk_part)
            xp.add(dk_sum, dk_part, out=dk_sum)

    @staticmethod
    def log_sum_exp(at, q, k, b, hk, out):
        """Each row's log-sum-exp of the group's scores into `out` (G, S, 1), by the online softmax."""
        for i0, i1 in at.queries():
            qt = at.load("q", q[b, at.heads(hk), i0:i1])
            m, m_new, total = at.statistics(i1 - i0)
            for j0, j1 in at.keys(i0, i1):
                s = at.scores(qt, at.load("k", k[b, hk, j0:j1]), b, hk, i0, i1, j0, j1)
                at.add_row_sums(total, s, at.online(s, m, m_new))
                m, m_new = m_new, m
            at.log_sum_exp(m, total, out[:, i0:i1])

    def torch(self, torch, q, k, v, bias, y, lse, dy, scale=0.0, causal=0):
        """PyTorch's own gradient of the forward's form."""
        from . import get
        with torch.enable_grad():
            inputs = [x.detach().requires_grad_() for x in (q, k, v)]
            out = get("ScaledDotProductAttention", "memplan").torch(torch, *inputs, bias, scale=scale, causal=causal)[0]
            return list(torch.autograd.grad(out, inputs, dy))
