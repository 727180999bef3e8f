"""The walk over query and key tiles that memplan.ScaledDotProductAttention and its gradient share: the
attention's form (its attributes), the tile sizes the workspace limit allows, the scratch layout, and one
tile's scores (scaled, soft-capped, masked, biased, relative-position terms added) and dropout mask, all in
the planned scratch."""
import math
from dataclasses import dataclass

import numpy as np

from .base import Layout, broadcast
from .into import add_where, iota, matmul
from .misc import dropout_key, mix
from ..errors import ShapeError

TILE_Q, TILE_K = 128, 512
"""The largest query and key tiles: a (128, 512) float32 score tile (256 KiB) stays in a core's cache."""
FILL_MODES = ("set", "add", "set_after_bias")
"""How a hidden score takes `fill`: set to it before the bias is added (Where on the scores, then the bias),
added to it (an additive mask), or set to it after the bias (Where on the biased scores)."""
EMPTY_ROWS = ("zero", "nan")
"""What a row whose softmax is NaN (every score -inf, or one NaN or +inf) gives: NaN, as Softmax does, or the
product of zero probabilities with V, as SDPA's exports guard it (Where(IsNaN(P), 0, P))."""
DEFAULTS = {"scale": 0.0, "causal": 0, "window": 0, "softcap": 0.0, "fill": -math.inf, "fill_mode": "set",
            "empty_rows": "zero", "dropout": 0.0, "seed": 0}


@dataclass(frozen=True)
class Form:
    """The attention's form, from a node's or a step's attributes: scores = scale Q K^T, soft-capped to
    softcap tanh(scores / softcap) where softcap > 0; the keys a query hides under `causal` (those after
    it, the last query seeing the last key) and `window` (besides, those `window` or more before it) take
    `fill` by `fill_mode`; the bias is added; probabilities are dropped with probability `dropout` by a
    counter-based hash of (seed, step, element), as memplan.Dropout draws them."""

    scale: float
    causal: bool
    window: int
    softcap: float
    fill: float
    fill_mode: str
    empty_rows: str
    dropout: float
    seed: int

    @classmethod
    def of(cls, attrs, head_size=None):
        """The Form of `attrs` (defaults filled in); scale 0 becomes 1/sqrt(head_size) when it is given."""
        a = {**DEFAULTS, **{k: v for k, v in attrs.items() if k in DEFAULTS and v is not None}}
        scale = float(a["scale"]) or (1 / math.sqrt(max(head_size, 1)) if head_size is not None else 0.0)
        return cls(scale, bool(a["causal"]), int(a["window"]), float(a["softcap"]), float(a["fill"]),
                   a["fill_mode"], a["empty_rows"], float(a["dropout"]), int(a["seed"]))

    @property
    def skips(self):
        """Whether hidden keys add nothing (fill -inf), so that tiles they fill are skipped."""
        return self.fill == -math.inf

    @property
    def plain(self):
        """Whether the form is softmax(scale Q K^T + bias, causal) V and nothing more (what fast kernels take)."""
        return (self.window, self.softcap, self.fill, self.fill_mode, self.empty_rows, self.dropout) == \
            (0, 0.0, -math.inf, "set", "zero", 0.0)

    def seen(self, i, offset, t):
        """[lo, hi): the keys query i sees (all of them without `causal`)."""
        if not self.causal:
            return 0, t
        hi = max(0, min(t, i + offset + 1))
        return (min(hi, max(0, i + offset - self.window + 1)) if self.window else 0), hi

    def visible(self, s, t):
        """The (query, key) pairs a kernel computes: those some query sees where hidden keys are skipped."""
        if not self.causal or not self.skips:
            return s * t
        i = np.arange(s)
        hi = np.clip(i + t - s + 1, 0, t)
        lo = np.minimum(hi, np.clip(i + t - s - self.window + 1, 0, t)) if self.window else 0
        return int((hi - lo).sum())


def check_attributes(node, attr):
    """ShapeError for attributes outside what the op defines (see Form)."""
    scale, causal, window, softcap = (attr(node, k) for k in ("scale", "causal", "window", "softcap"))
    fill, mode, empty, ratio = (attr(node, k) for k in ("fill", "fill_mode", "empty_rows", "dropout"))
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ShapeError(f"scale must be a finite float (0: 1/sqrt(head size)), got {scale!r}")
    if causal not in (0, 1):
        raise ShapeError(f"causal must be 0 or 1, got {causal!r}")
    if not isinstance(window, int) or window < 0 or (window and not causal):
        raise ShapeError(f"window must be an int >= 0 (0: none), and a window needs causal=1; got {window!r}")
    if not isinstance(softcap, (int, float)) or not 0 <= softcap < math.inf:
        raise ShapeError(f"softcap must be a finite float >= 0 (0: none), got {softcap!r}")
    if not isinstance(fill, (int, float)) or math.isnan(fill):
        raise ShapeError(f"fill must be a float (-inf: hidden keys vanish), got {fill!r}")
    if mode not in FILL_MODES or empty not in EMPTY_ROWS:
        raise ShapeError(f"fill_mode must be one of {', '.join(FILL_MODES)} and empty_rows one of "
                         f"{', '.join(EMPTY_ROWS)}; got {mode!r} and {empty!r}")
    if not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
        raise ShapeError(f"dropout must be in [0, 1), got {ratio!r}")


def check_mask(mask, scores):
    """A mask input is bool and broadcasts to the scores' (B, H, S, T)."""
    if mask is None:
        return
    try:
        fits = mask.dtype == np.bool_ and len(mask.shape) <= 4 and broadcast(tuple(mask.shape), scores) == scores
    except ShapeError:
        fits = False
    if not fits:
        raise ShapeError(f"mask must be bool and broadcast to the scores' {scores}, got {mask.dtype} {tuple(mask.shape)}")


def widths(rows, cols):
    """(R, R') of the relative-position tables given (0 for one not given)."""
    return tuple(0 if table is None else table.shape[-1] for table in (rows, cols))


def check_relative(ins, batch, heads, s, t):
    """Each relative-position table of (B, H, lines, R) (S lines for rows, T for cols) comes with its int64 index
    of S + T - 1 values in [0, R)."""
    ins = (list(ins) + [None] * 4)[:4]
    for name, table, index, lines in (("rows", ins[0], ins[1], s), ("cols", ins[2], ins[3], t)):
        if (table is None) != (index is None):
            raise ShapeError(f"{name} and {name}_index come together")
        if table is None:
            continue
        if len(table.shape) != 4 or tuple(table.shape[:3]) != (batch, heads, lines) or not table.shape[3]:
            raise ShapeError(f"{name} must have shape ({batch}, {heads}, {lines}, R), got {tuple(table.shape)}")
        if tuple(index.shape) != (s + t - 1,) or index.dtype != np.int64:
            raise ShapeError(f"{name}_index must be int64 of shape ({s + t - 1},), got {index.dtype} {tuple(index.shape)}")
        if index.value is not None and index.value.size and not (0 <= index.value.min() <= index.value.max() < table.shape[3]):
            raise ShapeError(f"{name}_index must be within [0, {table.shape[3]}), its table's columns")


def check_step(ratio, step):
    """Dropout needs the step, a scalar (its count, which keys the mask)."""
    if ratio and step is None:
        raise ShapeError("dropout needs input 5, the step (a scalar that keys each step's mask)")
    if step is not None and step.shape != ():
        raise ShapeError(f"step must be a scalar, got shape {step.shape}")


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


def tile_layout(groups, tq, tk, d, wide, form, *parts, relative=(0, 0), masked=False):
    """The scratch every tiled kernel shares (score tile, loaded Q and K tiles, row statistics, the masks of
    `form` and of a mask input where `masked`, the gathers of relative-position tables of `relative` (R_rows,
    R_cols) columns), then `parts`: (name, elements) of more flat slices of `wide`."""
    rows, pairs = groups * tq, groups * tq * tk
    dropping, gathers = form.dropout > 0, any(relative)
    return Layout.pack(("s", (rows * tk,), wide), ("q", (rows * d,), wide), ("k", (tk * d,), wide),
                       *[(name, (rows,), wide) for name in ("m", "m_new", "l", "alpha", "sums")],
                       ("empty", (rows,), np.bool_),
                       *[(name, (count,), wide) for name, count in filter(None, parts)],
                       ("rel_vals", (pairs,), wide) if gathers else None,
                       ("rel_table", (groups * max(tq, tk) * max(relative),), wide) if gathers else None,
                       *[(name, (tq * tk,), np.int64) for name in ("rel_pos", "rel_sel", "rel_line") if gathers],
                       ("rel_flat", (pairs,), np.int64) if gathers else None,
                       ("rows", (tq,), np.int32), ("cols", (tk,), np.int32),
                       ("diff", (tq, tk), np.int32) if form.causal or gathers else None,
                       ("band", (tq * tk,), np.bool_) if form.causal else None,
                       ("outside", (tq * tk,), np.bool_) if form.window else None,
                       ("hidden", (pairs,), np.bool_) if masked else None,
                       ("hash", (pairs,), np.uint32) if dropping else None,
                       ("spare", (pairs,), np.uint32) if dropping else None,
                       ("dropped", (pairs,), np.bool_) if dropping else None, align=64)


def flat(ws, name, shape):
    """The front of the flat scratch slice `name` as a contiguous array of `shape` (edge tiles are smaller)."""
    return ws[name][:math.prod(shape)].reshape(shape)


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


def finite(xp, x):
    """Whether every value of x is finite, by its sum in float64 (no temporary; an overflow says no)."""
    with np.errstate(all="ignore"):
        return math.isfinite(float(xp.sum(x, dtype=np.float64)))


class Tiles:
    """One run's walk over tiles: the inputs, the form, the tile sizes, and the scores of a tile pair (scaled,
    soft-capped, masked and biased) into the scratch."""

    def __init__(self, xp, step, q, k, v, bias, ws, step_count=None, relative=(None,) * 4, mask=None):
        self.xp, self.ws = xp, ws
        self.relative = relative
        self.batch, self.heads_total, self.hkv, self.s, self.t, d, self.dv = sizes(q.shape, k.shape, v.shape)
        self.groups = self.heads_total // self.hkv
        self.form = Form.of(step.attrs, d)
        self.scale, self.causal, self.offset = self.form.scale, self.form.causal, self.t - self.s
        self.bias, self.mask = (None if x is None else xp.broadcast_to(x, (self.batch, self.heads_total, self.s, self.t))
                                for x in (bias, mask))
        self.k, self.v, self.skip = k, v, self.form.skips
        self.finite_bias = bias is None or self.form.fill_mode == "set_after_bias" or xp is np and finite(xp, bias)
        self.tq, self.tk = ws["rows"].shape[0], ws["cols"].shape[0]
        self.wide = ws["s"].dtype
        self.low = float(np.finfo(self.wide).min)
        self.key = None if step_count is None else dropout_key(self.form.seed, float(step_count))
        rows, cols = ws["rows"], ws["cols"]
        iota(xp, cols)
        iota(xp, rows)
        if "diff" in ws:  # diff[r, c] = c - r: a key c of a tile is hidden from row r when c - r > i0 + offset - j0
            xp.subtract(cols[None, :], rows[:, None], out=ws["diff"])

    def heads(self, hk):
        """The query heads that read kv head `hk`."""
        return slice(hk * self.groups, (hk + 1) * self.groups)

    def queries(self):
        return [(i, min(i + self.tq, self.s)) for i in range(0, self.s, self.tq)]

    def group(self, b, hk):
        """Starts kv head hk of batch b: hidden keys are skipped (fill -inf) only where every value they meet is
        finite, as the export's 0 * V and -inf + score are then 0 and -inf: V, K where the fill is added, the
        bias where it is added after the fill (a sum is finite only if each term is; an overflow merely skips
        nothing). A device's values are not read back to decide it: on CuPy no tile is skipped, so that a run
        neither allocates nor waits for the device, and its walk is the same for any values (a CUDA graph
        replays it)."""
        meets = [self.v[b, hk], *([self.k[b, hk]] if self.form.fill_mode == "add" else [])]
        self.skip = self.form.skips and self.xp is np and self.finite_bias and all(finite(self.xp, x) for x in meets)

    def keys(self, i0, i1):
        """The key tiles of query tile [i0, i1): those some row sees where hidden keys are skipped, else all."""
        lo, hi = (self.form.seen(i0, self.offset, self.t)[0], self.form.seen(i1 - 1, self.offset, self.t)[1]) \
            if self.skip else (0, self.t)
        return [(j, min(j + self.tk, hi)) for j in range(lo, hi, self.tk)]

    def sees(self, i0, i1, j0, j1):
        """Whether the walk computes the tile of queries [i0, i1) and keys [j0, j1) (some pair is seen, or
        hidden keys count)."""
        lo, hi = self.form.seen(i0, self.offset, self.t)[0], self.form.seen(i1 - 1, self.offset, self.t)[1]
        return not self.skip or (j0 < hi and j1 > lo)

    def load(self, name, src):
        """`src` copied into the scratch slice `name` in the accumulation dtype (contiguous, for matmul)."""
        view = flat(self.ws, name, src.shape)
        self.xp.copyto(view, src)
        return view

    def hidden(self, b, hk, i0, i1, j0, j1):
        """The mask of the keys the tile's rows hide, in the scratch: (n, m) of the band, (G, n, m) with a mask
        input; None where they hide none."""
        band = self.band(i0, i1, j0, j1)
        if self.mask is None:
            return band
        hidden = flat(self.ws, "hidden", (self.groups, i1 - i0, j1 - j0))
        self.xp.logical_not(self.mask[b, self.heads(hk), i0:i1, j0:j1], out=hidden)
        if band is not None:
            self.xp.logical_or(hidden, band, out=hidden)
        return hidden

    def band(self, i0, i1, j0, j1):
        """The (n, m) mask of the keys that `causal` and `window` hide from the tile's rows; None for none."""
        if not self.causal:
            return None
        xp, ws, edge = self.xp, self.ws, i0 + self.offset - j0
        window = self.form.window
        if j1 - 1 <= i0 + self.offset and not (window and j0 <= i1 - 1 + self.offset - window):
            return None
        diff = ws["diff"][:i1 - i0, :j1 - j0]
        band = flat(ws, "band", diff.shape)
        xp.greater(diff, edge, out=band)
        if window:
            outside = flat(ws, "outside", diff.shape)
            xp.less_equal(diff, edge - window, out=outside)
            xp.logical_or(band, outside, out=band)
        return band

    def scores(self, q, k, b, hk, i0, i1, j0, j1, capped=None):
        """(scores, hidden) for query rows [i0, i1) of the group's heads (loaded `q`, (G, n, D)) and keys
        [j0, j1) (loaded `k`, (m, D)): scale Q K^T, soft-capped (its tanh kept in `capped` where given),
        hidden keys (the band's and the mask input's) filled by the form's mode and the bias added, (G, n, m)
        in the scratch; and the tile's hidden mask (None: none hidden)."""
        xp, form = self.xp, self.form
        s = flat(self.ws, "s", (self.groups, i1 - i0, j1 - j0))
        matmul(xp, q, k.T, s)
        xp.multiply(s, self.scale, out=s)
        if form.softcap:
            xp.divide(s, form.softcap, out=s)
            xp.tanh(s, out=s)
            if capped is not None:
                xp.copyto(capped, s)
            xp.multiply(s, form.softcap, out=s)
        hidden = self.hidden(b, hk, i0, i1, j0, j1)
        if hidden is not None and form.fill_mode != "set_after_bias":
            self.fill(s, hidden)
        if self.bias is not None:
            xp.add(s, self.bias[b, self.heads(hk), i0:i1, j0:j1], out=s)
        for term in self.terms():
            vals = flat(self.ws, "rel_vals", s.shape)
            table = self.relative[2 * term][b, self.heads(hk)]
            lines = (i0, i1) if term == 0 else (j0, j1)
            xp.take(self.load("rel_table", table[:, lines[0]:lines[1]]).reshape(-1),
                    self.gathered(term, (i0, i1, j0, j1), (lines[1] - lines[0], table.shape[-1]), lines[0]), out=vals)
            xp.add(s, vals, out=s)
        if hidden is not None and form.fill_mode == "set_after_bias":
            self.fill(s, hidden)
        return s, hidden

    def terms(self):
        """The relative-position terms given: 0, rows[i, rows_index[i - j + T - 1]]; 1, cols[j, cols_index[j - i +
        S - 1]]."""
        return [term for term in (0, 1) if self.relative[2 * term] is not None]

    def gathered(self, term, box, shape, first):
        """For the tile `box` (i0, i1, j0, j1), the (G, n, m) flat indices into the group's relative table of
        `term` held from its line `first` on, of `shape` (lines, R): where each score's term is."""
        xp, ws, (i0, i1, j0, j1) = self.xp, self.ws, box
        n, m = i1 - i0, j1 - j0
        diff, (lines, width) = ws["diff"][:n, :m], shape
        pos, sel, line = (flat(ws, name, (n, m)) for name in ("rel_pos", "rel_sel", "rel_line"))
        if term == 0:  # i - j + T - 1 = (i0 - j0 + T - 1) - (c - r)
            xp.subtract(i0 - j0 + self.t - 1, diff, out=pos)
            xp.add(ws["rows"][:n, None], i0 - first, out=line)
        else:  # j - i + S - 1 = (j0 - i0 + S - 1) + (c - r)
            xp.add(diff, j0 - i0 + self.s - 1, out=pos)
            xp.add(ws["cols"][None, :m], j0 - first, out=line)
        xp.take(self.relative[2 * term + 1], pos, out=sel)
        xp.multiply(line, width, out=line)
        xp.add(line, sel, out=line)
        out = flat(ws, "rel_flat", (self.groups, n, m))
        for g in range(self.groups):
            xp.add(line, g * lines * width, out=out[g])
        return out

    def fill(self, s, hidden):
        if self.form.fill_mode == "add":
            add_where(self.xp, s, self.form.fill, hidden)
        else:
            self.xp.copyto(s, self.form.fill, where=hidden)

    def dropped(self, b, hk, i0, i1, j0, j1):
        """The (G, n, m) mask of the probabilities dropout zeroes in the tile, None without dropout: element
        ((b H + h) S + i) T + j of the (B, H, S, T) probabilities hashed as memplan.Dropout hashes it."""
        if not self.form.dropout:
            return None
        xp, ws, t = self.xp, self.ws, self.t
        shape = (self.groups, i1 - i0, j1 - j0)
        h, spare, out = flat(ws, "hash", shape), flat(ws, "spare", shape), flat(ws, "dropped", shape)
        rows, cols = ws["rows"][:shape[1]].view(np.uint32), ws["cols"][:shape[2]].view(np.uint32)
        for g in range(self.groups):
            head = hk * self.groups + g
            start = (((b * self.heads_total + head) * self.s + i0) * t + j0) % 2**32
            xp.multiply(rows[:, None], np.uint32(t % 2**32), out=h[g])
            xp.add(h[g], cols[None, :], out=h[g])
            xp.add(h[g], np.uint32(start), out=h[g])
        xp.bitwise_xor(h, np.uint32(self.key), out=h)
        mix(xp, h, spare)
        xp.less(h, np.uint32(min(int(self.form.dropout * 2**32), 2**32 - 1)), out=out)
        return out

    def drop(self, p, dropped):
        """p with the dropped probabilities zeroed and the kept ones scaled by 1 / (1 - dropout)."""
        if dropped is not None:
            self.xp.copyto(p, 0, where=dropped)
            self.xp.multiply(p, 1 / (1 - self.form.dropout), out=p)
        return p

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

    def zero_empty_rows(self, acc, total, v):
        """Rows of `acc` whose running sum `total` is not positive (0: every score -inf; NaN) become 0 V (zeros,
        NaN in a column of V that is not finite), what zero probabilities give."""
        xp = self.xp
        empty = flat(self.ws, "empty", total.shape)
        xp.greater(total, 0, out=empty)
        xp.logical_not(empty, out=empty)
        if empty.any():  # 0 V = 0 (max V) + 0 (min V): NaN in a column holding NaN or an infinity
            zero, low = self.ws["v_max"], self.ws["v_min"]
            xp.max(v, axis=0, out=zero)
            xp.min(v, axis=0, out=low)
            xp.multiply(zero, 0, out=zero)
            xp.multiply(low, 0, out=low)
            xp.add(zero, low, out=zero)
            xp.copyto(acc, zero, where=empty)

    def log_sum_exp(self, m, total, out):
        """out = m + log(l): -inf for a row with nothing to attend (l = 0)."""
        xp = self.xp
        with np.errstate(divide="ignore"):
            xp.log(total, out=out)
        xp.add(out, m, out=out)
