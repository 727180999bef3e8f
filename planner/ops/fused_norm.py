"""memplan.AddLayerNormalization: a residual add and a layer norm (or RMS norm) as one op, computed row
chunk by row chunk, and memplan.LayerNormalizationGrad, the gradient of either norm as one chunked op that
recomputes the row statistics from X, so that backward keeps X alone and makes no full-size temporary
besides dX. Statistics are taken in float32 for 16-bit floats (in float64 for float64)."""
import math

from .registry import get, schema
from .base import FLOATS, Layout, Schema, axis as to_axis, normalised_dims
from ..errors import ShapeError

CHUNK = 1 << 16
"""The most elements of one row chunk's scratch buffer (at least one row)."""


def rows_and_columns(shape, first):
    """(rows, columns, normalised dims) of X normalised over its dims from `first` on."""
    return math.prod(shape[:first]), math.prod(shape[first:]), tuple(shape[first:])


def chunk_rows(rows, cols, buffers, itemsize, limit):
    """How many rows a chunk takes: `buffers` row buffers of `cols` elements of `itemsize` bytes within
    `limit`, at most CHUNK elements each, at least one row and at most all of them."""
    per_row = max(1, buffers * cols * itemsize)
    return max(1, min(rows, CHUNK // max(cols, 1), limit // per_row))


def check(node, attr, x, scale, bias, skip=None):
    """The first normalised axis; ShapeError for bad attributes, shapes or dtypes."""
    if attr(node, "rms") not in (0, 1):
        raise ShapeError(f"rms must be 0 (layer norm) or 1 (RMS norm), got {attr(node, 'rms')!r}")
    epsilon = attr(node, "epsilon")
    if not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < 0:
        raise ShapeError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    first = to_axis(attr(node, "axis"), x.rank)
    normalised = normalised_dims(x.shape, first)
    for name, p in (("scale", scale), ("bias", bias)):
        if p is None:
            continue
        if p.rank > len(normalised) or any(d not in (1, n) for d, n in zip(p.shape[::-1], normalised[::-1])):
            raise ShapeError(f"{name} of shape {tuple(p.shape)} does not broadcast to the normalised dims {normalised}")
        if p.dtype != x.dtype:
            raise ShapeError(f"{name} must have X's dtype {x.dtype}, got {p.dtype}")
    if skip is not None and (tuple(skip.shape) != tuple(x.shape) or skip.dtype != x.dtype):
        raise ShapeError(f"skip of shape {tuple(skip.shape)} ({skip.dtype}) must have X's shape {tuple(x.shape)} "
                         f"and dtype {x.dtype}")
    return first


def chunks(rows, step):
    """[(first row, end row)] of the chunks of `step` rows (the last may be short)."""
    return [(r, min(r + step, rows)) for r in range(0, rows, step)]


def normalise(xp, w, mean, inv, epsilon, rms):
    """Rows `w` (n, N) made x^ in place, (x - mean) / sqrt(var + epsilon) or with `rms` x / sqrt(mean(x^2)
    + epsilon); `inv` keeps 1 / sqrt(...) per row, `mean` is scratch. Squares are summed by a batched dot
    product, which needs no temporary."""
    if not rms:
        xp.mean(w, axis=1, out=mean)
        xp.subtract(w, mean[:, None], out=w)
    xp.matmul(w[:, None, :], w[:, :, None], out=inv[:, None, None])
    xp.divide(inv, w.shape[1], out=inv)
    xp.add(inv, epsilon, out=inv)
    xp.sqrt(inv, out=inv)
    xp.divide(1, inv, out=inv)
    xp.multiply(w, inv[:, None], out=w)


def scratch(ws, name, shape):
    """The front of the workspace slice `name` as an array of `shape` (the last chunk may be short)."""
    return ws[name][:math.prod(shape)].reshape(shape)


@schema("AddLayerNormalization", domain="memplan")
class AddLayerNormalization(Schema):
    """Inputs X, skip (optional, X's shape), scale, bias (optional), both broadcasting to the dims from
    `axis` on; outputs Y = norm(X + skip) * scale + bias and the optional Sum = X + skip (the residual
    stream later blocks read), both of X's shape and dtype. `rms` = 1 normalises by the root mean square
    (no centring, as RMSNorm). Rows are normalised in chunks, in a float32 scratch for 16-bit floats."""

    stat = "fused_norm"
    autocast = "float32"  # as layer_norm
    split = "norm"
    defaults = {"axis": -1, "epsilon": 1e-5, "rms": 0}
    types = (("T", "T", "T", "T"), {"T": FLOATS})
    inplace = ((0, 0), (1, 0), (1, 1), (0, 1))

    def infer(self, node, ins):
        x, skip, scale, bias = (list(ins) + [None] * 4)[:4]
        if x is None or scale is None:
            raise ShapeError("X and scale are required")
        check(node, self.attr, x, scale, bias, skip)
        if skip is None and len(node.outputs) > 1 and node.outputs[1]:
            raise ShapeError("the Sum output needs a skip input")
        return [(x.shape, x.dtype), (x.shape, x.dtype)][:max(1, len(node.outputs))]

    def workspace(self, node, ins, outs, limit):
        """Per chunk of rows: the row statistics `mean` and `inv` and, for 16-bit floats, the rows `x`
        in float32 (other dtypes work in Y itself)."""
        x = ins[0]
        wide = self.accumulation(x.dtype)
        rows, cols, _ = rows_and_columns(x.shape, to_axis(self.attr(node, "axis"), x.rank))
        narrow = wide != x.dtype
        n = chunk_rows(rows, cols, 1 if narrow else 0, wide.itemsize, limit)
        return Layout.pack(("x", (n * cols,), wide) if narrow else None, ("mean", (n,), wide), ("inv", (n,), wide))

    def flops(self, node, ins, outs):
        """About 7 per element: the add, the mean, centring, squares, scaling, scale and bias."""
        return 7 * math.prod(ins[0].shape)

    def kernel(self, xp, step, ins, outs, ws):
        x, skip, scale, bias = (list(ins) + [None] * 4)[:4]
        y, total = (list(outs) + [None])[:2]
        rows, cols, dims = rows_and_columns(x.shape, step.attrs["axis"] % x.ndim)
        n = ws["mean"].shape[0]
        narrow = ws["mean"].dtype != x.dtype
        x2, y2 = x.reshape(rows, cols), y.reshape(rows, cols)
        for r0, r1 in chunks(rows, n):
            yc = y2[r0:r1]
            src = x2[r0:r1]
            if skip is not None:
                held = yc if total is None else total.reshape(rows, cols)[r0:r1]
                other = skip.reshape(rows, cols)[r0:r1]
                # in place over x or skip: one view object for input and output (CuPy copies an input it
                # sees overlap the output)
                src, other = (held if xp.may_share_memory(v, held) else v for v in (src, other))
                xp.add(src, other, out=held)
                src = held
            w = scratch(ws, "x", yc.shape) if narrow else yc
            if w is not src:
                xp.copyto(w, src)
            normalise(xp, w, ws["mean"][:r1 - r0], ws["inv"][:r1 - r0], step.attrs["epsilon"], step.attrs["rms"])
            w3 = w.reshape(r1 - r0, *dims)
            xp.multiply(w3, scale, out=w3)
            if bias is not None:
                xp.add(w3, bias, out=w3)
            if w is not yc:
                xp.copyto(yc, w)

    def gradient(self, b, node, dys):
        """dX from memplan.LayerNormalizationGrad on Sum (kept anyway as the residual stream) or on X and
        skip (added again chunk by chunk), the Sum's gradient added in its kernel; skip's gradient is
        dX's; the scale's and bias's are its row sums, reduced to their shapes."""
        dy, dsum = (list(dys) + [None])[:2]
        x, skip, scale, bias = (list(node.inputs) + [""] * 4)[:4]
        total = node.outputs[1] if len(node.outputs) > 1 else ""
        if dy is None:
            return [dsum, dsum if skip else None, None, None][:len(node.inputs)]
        source = (total, "") if total else (x, skip)
        grads = layer_norm_gradient(b, node, dy, *source, scale, bias, dsum or "")
        return [grads[0], grads[0] if skip else None, *grads[1:]][:len(node.inputs)]

    def torch(self, torch, x, skip=None, scale=None, bias=None, axis=-1, epsilon=1e-5, rms=0):
        """Y and Sum, the statistics in float32 (float64 for float64), as the kernel."""
        total = x if skip is None else x + skip
        dims = tuple(range(axis % x.dim(), x.dim()))
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        t = total.to(wide)
        if not rms:
            t = t - t.mean(dims, keepdim=True)
        y = t * torch.rsqrt(t.pow(2).mean(dims, keepdim=True) + epsilon) * scale.to(wide)
        return [(y if bias is None else y + bias.to(wide)).to(x.dtype), total]


def layer_norm_gradient(b, node, dy, x, skip, scale, bias, dsum=""):
    """[dX, dscale, dbias (None without a bias)] of a norm of X (+ skip) over the dims from node's `axis`
    by memplan.LayerNormalizationGrad, `dsum` (a gradient reaching X + skip by another way) added to dX;
    the parameters' gradients reduced from the normalised dims to their shapes."""
    shape = b.shape(x)
    first = to_axis(node.attrs.get("axis", -1), len(shape))
    attrs = {"axis": first, "epsilon": node.attrs.get("epsilon", 1e-5), "rms": node.attrs.get("rms", 0)}
    outs = b.op("LayerNormalizationGrad", dy, x, scale, skip, dsum, outputs=3 if bias else 2, domain="memplan", **attrs)
    dims = tuple(shape[first:])
    return [outs[0], b.unbroadcast(outs[1], dims, b.shape(scale)),
            b.unbroadcast(outs[2], dims, b.shape(bias)) if bias else None]


@schema("LayerNormalizationGrad", domain="memplan")
class LayerNormalizationGrad(Schema):
    """Inputs dY, X, scale, skip (optional: the norm is of X + skip) and dSum (optional: added to dX);
    outputs dX (X's shape), dscale and the optional dbias, of the normalised dims' shape (the row sums of
    dY x^ and of dY). Per chunk of rows: x^ and 1/std recomputed, g = dY scale, and
    dX = (g - mean(g) - x^ mean(g x^)) / std (without the mean(g) term under `rms`)."""

    defaults = {"axis": -1, "epsilon": 1e-5, "rms": 0}
    types = (("T", "T", "T", "T", "T"), {"T": FLOATS})

    def infer(self, node, ins):
        dy, x, scale, skip, dsum = (list(ins) + [None] * 5)[:5]
        if dy is None or x is None or scale is None:
            raise ShapeError("dY, X and scale are required")
        first = check(node, self.attr, x, scale, None, skip)
        for name, t in (("dY", dy), ("dSum", dsum)):
            if t is not None and (tuple(t.shape) != tuple(x.shape) or t.dtype != x.dtype):
                raise ShapeError(f"{name} of shape {tuple(t.shape)} ({t.dtype}) must have X's shape "
                                 f"{tuple(x.shape)} and dtype {x.dtype}")
        dims = (tuple(x.shape[first:]), x.dtype)
        return [(x.shape, x.dtype), dims, dims][:max(2, len(node.outputs))]

    def workspace(self, node, ins, outs, limit):
        """Per chunk of rows: x^ (`xhat`) and, for 16-bit floats, g (`g`), in the accumulation dtype; the
        row statistics; the column sums of one chunk (`part`) and, for 16-bit floats, the running sums of
        dscale and dbias."""
        x = ins[1]
        wide = self.accumulation(x.dtype)
        narrow = wide != x.dtype
        rows, cols, _ = rows_and_columns(x.shape, to_axis(self.attr(node, "axis"), x.rank))
        n = chunk_rows(rows, cols, 2 if narrow else 1, wide.itemsize, limit)
        has_bias = len(outs) > 2 and outs[2] is not None
        return Layout.pack(("xhat", (n * cols,), wide), ("g", (n * cols,), wide) if narrow else None,
                           *[(name, (n,), wide) for name in ("mean", "inv", "dot")], ("part", (cols,), wide),
                           ("dscale", (cols,), wide) if narrow else None,
                           ("dbias", (cols,), wide) if narrow and has_bias else None)

    def flops(self, node, ins, outs):
        """About 12 per element: the statistics and x^ again, g, its two row means, dX, and the column sums."""
        return 12 * math.prod(ins[1].shape)

    def kernel(self, xp, step, ins, outs, ws):
        dy, x, scale, skip, dsum = (list(ins) + [None] * 5)[:5]
        dx, dscale, dbias = (list(outs) + [None])[:3]
        rows, cols, dims = rows_and_columns(x.shape, step.attrs["axis"] % x.ndim)
        n, rms = ws["mean"].shape[0], step.attrs["rms"]
        narrow = ws["mean"].dtype != x.dtype
        flat = [None if t is None else t.reshape(rows, cols) for t in (dy, x, skip, dsum, dx)]
        sums = [(ws["dscale"] if narrow else dscale.reshape(cols), dscale)]
        if dbias is not None:
            sums.append((ws["dbias"] if narrow else dbias.reshape(cols), dbias))
        for acc, _ in sums:
            acc.fill(0)
        part = ws["part"]
        for r0, r1 in chunks(rows, n):
            dy2, x2, skip2, dsum2, dx2 = (None if t is None else t[r0:r1] for t in flat)
            m = r1 - r0
            xhat = scratch(ws, "xhat", (m, cols))
            if skip2 is not None:  # X + skip in X's dtype, as the forward rounds it
                held = dx2 if narrow else xhat
                xp.add(x2, skip2, out=held)
                x2 = held
            if x2 is not xhat:
                xp.copyto(xhat, x2)
            mean, inv, dot = (ws[name][:m] for name in ("mean", "inv", "dot"))
            normalise(xp, xhat, mean, inv, step.attrs["epsilon"], rms)
            g = scratch(ws, "g", (m, cols)) if narrow else dx2
            xp.copyto(g, dy2)
            if dbias is not None:
                xp.sum(g, axis=0, out=part)
                xp.add(sums[1][0], part, out=sums[1][0])
            xp.multiply(g, xhat, out=g)
            xp.sum(g, axis=0, out=part)
            xp.add(sums[0][0], part, out=sums[0][0])
            xp.copyto(g, dy2)
            g3 = g.reshape(m, *dims)
            xp.multiply(g3, scale, out=g3)
            xp.matmul(g[:, None, :], xhat[:, :, None], out=dot[:, None, None])
            xp.divide(dot, cols, out=dot)
            if not rms:
                xp.mean(g, axis=1, out=mean)
                xp.subtract(g, mean[:, None], out=g)
            xp.multiply(xhat, dot[:, None], out=xhat)
            xp.subtract(g, xhat, out=g)
            xp.multiply(g, inv[:, None], out=g)
            if dsum2 is not None:
                xp.add(g, dsum2, out=g)
            if g is not dx2:
                xp.copyto(dx2, g)
        if narrow:
            for acc, out in sums:
                xp.copyto(out.reshape(cols), acc)

    def torch(self, torch, dy, x, scale, skip=None, dsum=None, axis=-1, epsilon=1e-5, rms=0):
        """PyTorch's own gradient of the forward's form, the parameters' summed over the rows."""
        dims = x.shape[axis % x.dim():]
        with torch.enable_grad():
            inputs = [x.detach().requires_grad_(), scale.detach().expand(dims).requires_grad_(),
                      torch.zeros(dims, dtype=x.dtype, device=x.device, requires_grad=True)]
            y = get("AddLayerNormalization", "memplan").torch(torch, inputs[0], skip, *inputs[1:], axis=axis,
                                                              epsilon=epsilon, rms=rms)[0]
            dx, dscale, dbias = torch.autograd.grad(y, inputs, dy)
        return [dx if dsum is None else dx + dsum, dscale, dbias]
