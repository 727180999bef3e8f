"""Convolutions, pooling and normalisations over the (N, C, spatial...) layout.

A sliding window is walked one kernel tap at a time, each tap a strided view of the input paired
with the output positions whose window it lands in (padding is the positions no tap reaches). Conv
is im2col + GEMM and ConvTranspose GEMM + col2im, one group at a time, with the column buffer in the
planned workspace and the batch walked in the chunks the plan sized it for (the shape of its
`columns` slice, see `planner.ops.nn.Conv.workspace`). Kernels allocate nothing, with one exception:
NumPy's inference BatchNormalization (two vectors of C values, cheaper than a pass per channel). On
CuPy a GEMM into a chunk of rows (when one image's columns exceed the workspace limit) goes to cuBLAS
with the row stride (`planner.ops.into.matmul`).
"""
import math
from functools import cache, partial
from itertools import product

import numpy as np

from planner import ops
from planner.ops.activation import sigmoid
from planner.ops.into import matmul
from planner.ops.nn import Chunks, window

from . import cut, kernel


def _padded(items, n):
    """`items` (a step's inputs or outputs) extended with None to `n` entries: omitted optionals."""
    return [*items, *[None] * (n - len(items))][:n]


def _window(step, in_spatial, kernel_shape, out_spatial, transposed=False):
    """The window of a Conv, ConvTranspose or pool step (see planner.ops.nn.window)."""
    return window(ops.of(step), step, in_spatial, kernel_shape, out_spatial, transposed)


def conv_window(step, x, w, y):
    """The window of a Conv step with input x, weights w and output y."""
    return _window(step, x.shape[2:], w.shape[2:], y.shape[2:])


def span(offset, stride, n_source, lo, hi):
    """The grid indices o in [lo, hi) whose source o * stride + offset lies in [0, n_source): a pair
    (slice of o - lo, slice of the sources), or None when there is none."""
    first = max(lo, -(offset // stride))
    stop = min(hi, (n_source - 1 - offset) // stride + 1)
    if stop <= first:
        return None
    return slice(first - lo, stop - lo), slice(first * stride + offset, (stop - 1) * stride + offset + 1, stride)


def _taps(win, kernel_shape, grid, source, rows=None):
    """(tap, grid slices, source slices) for each kernel tap reaching the source: grid index o meets
    source index o * stride + tap * dilation - pad. `rows` = (lo, hi) restricts the first grid dim,
    its slices then being relative to lo."""
    per_dim = []
    for d, (k, s, dil, b) in enumerate(zip(kernel_shape, win.strides, win.dilations, win.begin)):
        lo, hi = rows if d == 0 and rows else (0, grid[d])
        per_dim.append([(t, span(t * dil - b, s, source[d], lo, hi)) for t in range(k)])
    for combo in product(*per_dim):
        if all(span is not None for _, span in combo):
            yield tuple(t for t, _ in combo), tuple(s[0] for _, s in combo), tuple(s[1] for _, s in combo)


def _at(spatial):
    """An index taking every image and channel and the given spatial slices."""
    return (slice(None), slice(None), *spatial)


def _chunks(ws):
    """The Chunks the plan sized the column buffer for, read off its (images, rows, row bytes) shape;
    None when there are no columns (a pointwise conv runs the GEMM on the images themselves)."""
    columns = ws.get("columns")
    return None if columns is None else Chunks(*columns.shape[:2], columns.nbytes)


def _walk(chunks, batch, rows):
    """(first image, end image, first row, end row) of each chunk, in order."""
    for n0 in range(0, batch, chunks.images):
        for r0 in range(0, rows, chunks.rows):
            yield n0, min(n0 + chunks.images, batch), r0, min(r0 + chunks.rows, rows)


def _cupy(xp):
    return xp.__name__ == "cupy"


def _matmul(xp, a, b, out):
    """out[i] = a @ b[i] for each image i (on the host one strided-batch GEMM). CuPy's batched matmul allocates
    a pointer array when an operand is broadcast, so there each image is its own GEMM (into a chunk of its rows
    in place)."""
    if not _cupy(xp):
        matmul(xp, a, b, out)
        return
    for i in range(out.shape[0]):
        matmul(xp, a, b[i], out[i])


def _add_bias(xp, y, b):
    """y += b, one value per output channel (b may be omitted)."""
    if b is not None:
        xp.add(y, b.reshape(-1, *[1] * (y.ndim - 2)), out=y)


def _pointwise(xp, x, w, y, group, transposed):
    """A 1x1 stride-1 unpadded Conv or ConvTranspose: per group one batched GEMM on the images."""
    n, cg, mg = x.shape[0], x.shape[1] // group, y.shape[1] // group
    for g in range(group):
        wg = w[g * cg:(g + 1) * cg].reshape(cg, mg).T if transposed else w[g * mg:(g + 1) * mg].reshape(mg, cg)
        _matmul(xp, wg, x[:, g * cg:(g + 1) * cg].reshape(n, cg, -1), y[:, g * mg:(g + 1) * mg].reshape(n, mg, -1))


def _zero_padding(cols, kernel_shape, taps):
    """Zero the columns no tap's copy writes (where a window lies on padding), once per chunk: every
    group's copies write the same places. `taps` (from `_taps`) come in the order of np.ndindex."""
    reaching = next(taps, None)
    for tap in np.ndindex(*kernel_shape):
        block = cols[(slice(None), slice(None), *tap)]
        if reaching is None or reaching[0] != tap:
            block.fill(0)
            continue
        at, reaching = reaching[1], next(taps, None)
        for d, (span, size) in enumerate(zip(at, block.shape[2:])):
            for gap in (slice(0, span.start), slice(span.stop, size)):
                if gap.start < gap.stop:
                    block[(slice(None),) * (2 + d) + (gap,)].fill(0)


@kernel("Conv")
def conv(xp, step, ins, outs, ws):
    """im2col + GEMM: per chunk and group, the columns (images, C/group, k..., rows, out...) are zeroed
    where padding shows, filled tap by tap, and multiplied by the group's weights into the output."""
    x, w, b = _padded(ins, 3)
    convolve(xp, step, x, w, outs[0], ws, partial(_finish, xp, b))


@kernel("FusedConv", domain="com.microsoft")
def fused_conv(xp, step, ins, outs, ws):
    """Conv, then in each chunk of the output while it is in cache: the bias, Z, the activation."""
    x, w, b, z = _padded(ins, 4)
    convolve(xp, step, x, w, outs[0], ws, epilogue(xp, step, b, z))


def as_fused_conv(xp, step, ins, outs, ws):
    """A memplan.WinogradConv or memplan.BatchedConv computed as the FusedConv it was made from (im2col, one
    GEMM per image), its columns chunked into the largest slice of its scratch: the GPU's form of them, where
    a GEMM into strided planes would allocate."""
    scratch = max(ws.values(), key=lambda a: a.nbytes)
    chunks = ops.get("Conv").chunks(step, ins[:2], [(outs[0].shape, outs[0].dtype)], scratch.nbytes)
    columns = {}
    if chunks.nbytes:
        columns["columns"] = scratch.reshape(-1).view(np.uint8)[:chunks.nbytes].reshape(chunks.images, chunks.rows, -1)
    fused_conv(xp, step, ins, outs, columns)


def epilogue(xp, step, b, z):
    """FusedConv's epilogue as `finish(block, at)` for the block Y[at]: the bias, Z[at], the activation."""
    activation = _ACTIVATIONS.get(step.attrs.get("activation") or "")
    return partial(_finish, xp, b, z=z, activation=activation, params=step.attrs.get("activation_params") or ())


_ACTIVATIONS = {  # in place on y, with the activation_params
    "Relu": lambda xp, y: xp.maximum(y, 0, out=y),
    "Sigmoid": lambda xp, y: sigmoid(xp, y, out=y),
    "Tanh": lambda xp, y: xp.tanh(y, out=y),
    "Clip": lambda xp, y, low, high: xp.clip(y, low, high, out=y),
    "HardSigmoid": lambda xp, y, alpha, beta: xp.clip(xp.add(xp.multiply(y, alpha, out=y), beta, out=y), 0, 1, out=y),
}


def activate(xp, y, name, params=()):
    """y = FusedConv's activation `name` of y, in place ("" or None: y as it is)."""
    if name:
        _ACTIVATIONS[name](xp, y, *(params or ()))


def _finish(xp, b, y, at=(), z=None, activation=None, params=()):
    """The epilogue of a conv on the output block y = Y[at] (every channel of some images and rows): the
    bias, Z[at], the activation."""
    _add_bias(xp, y, b)
    if z is not None:
        xp.add(y, z[at] if at else z, out=y)
    if activation is not None:
        activation(xp, y, *params)


def fill_columns(xp, cols, images, win, grid, rows, first):
    """im2col of one chunk and group: `cols` (images, C/group, k..., rows, out...) of the output `grid`'s
    `rows` (first, end), zeroed where windows lie on padding (for the `first` group: every group's copies
    write the same places), and each tap's strided view of `images` copied in."""
    kernel_shape = cols.shape[2:2 + len(grid)]
    taps = partial(_taps, win, kernel_shape, grid, images.shape[2:], rows)
    if first:
        _zero_padding(cols, kernel_shape, taps())
    for tap, at, source in taps():
        xp.copyto(cols[(slice(None), slice(None), *tap, *at)], images[_at(source)])


def depthwise(xp, step, x, w, y, ws, finish):
    """A depthwise conv by `_depthwise` in the planned `product` scratch, then `finish(Y)`."""
    _depthwise(xp, step, x, w, y, ws["product"])
    finish(y)


def convolve(xp, step, x, w, y, ws, finish, fill=fill_columns, by_channel=depthwise):
    """Y = conv(X, W), `finish(block, at)` applied to each block of Y once the GEMMs wrote it: per chunk of
    images and rows (the columns' walk), else the whole of Y. `fill` writes a chunk's columns (as
    `fill_columns`); a depthwise conv (a `product` scratch) is `by_channel`'s (as `depthwise`)."""
    group, chunks = step.attrs["group"], _chunks(ws)
    if not x.size:  # no input channels or pixels: every output is an empty sum (or one over padding)
        y.fill(0)
        finish(y)
    elif "product" in ws:
        by_channel(xp, step, x, w, y, ws, finish)
    elif chunks is None:
        _pointwise(xp, x, w, y, group, transposed=False)
        finish(y)
    else:
        kernel_shape, cg, mg = w.shape[2:], x.shape[1] // group, y.shape[1] // group
        win = _window(step, x.shape[2:], kernel_shape, y.shape[2:])
        for n0, n1, r0, r1 in _walk(chunks, x.shape[0], y.shape[2]):
            cols = cut(ws["columns"], (n1 - n0, cg, *kernel_shape, r1 - r0, *y.shape[3:]), x.dtype)
            for g in range(group):
                fill(xp, cols, x[n0:n1, g * cg:(g + 1) * cg], win, y.shape[2:], (r0, r1), g == 0)
                _matmul(xp, w[g * mg:(g + 1) * mg].reshape(mg, -1), cols.reshape(n1 - n0, w[0].size, -1),
                        y[n0:n1, g * mg:(g + 1) * mg, r0:r1].reshape(n1 - n0, mg, -1))
            at = (slice(n0, n1), slice(None), slice(r0, r1))
            finish(y[at], at)


def _depthwise(xp, step, x, w, y, product):
    """A conv whose groups read one channel each: per chunk of outputs, every channel at once, one tap at
    a time, y += x(tap) * w(tap), the products in the planned `product` scratch. Each input channel
    feeds W.shape[0] / C outputs in a row (the channel multiplier)."""
    chunks = Chunks(*product.shape[:2], product.nbytes)
    (n, c), kernel_shape, spatial = x.shape[:2], w.shape[2:], y.shape[3:]
    per = w.shape[0] // c
    weights = w.reshape(c, per, *kernel_shape)
    win = _window(step, x.shape[2:], kernel_shape, y.shape[2:])
    for n0, n1, r0, r1 in _walk(chunks, n, y.shape[2]):
        out = y[n0:n1, :, r0:r1].reshape(n1 - n0, c, per, r1 - r0, *spatial)
        products = cut(product, out.shape, y.dtype)
        out.fill(0)
        for tap, at, source in _taps(win, kernel_shape, y.shape[2:], x.shape[2:], (r0, r1)):
            where = (slice(None), slice(None), slice(None), *at)
            tap_weights = weights[(slice(None), slice(None), *tap)].reshape(c, per, *[1] * len(at))
            block = out[where]  # one view object for input and output: CuPy copies an input it sees overlap
            xp.multiply(x[n0:n1][_at(source)][:, :, None], tap_weights, out=products[where])
            xp.add(block, products[where], out=block)


@kernel("ConvTranspose")
def conv_transpose(xp, step, ins, outs, ws):
    """GEMM + col2im: per chunk and group, the weights' transpose times the input rows gives the
    columns (images, M/group, k..., rows, in...), which are added tap by tap into the zeroed output."""
    x, w, b = _padded(ins, 3)
    y, group = outs[0], step.attrs["group"]
    chunks = _chunks(ws)
    if not x.size:  # no input channels or pixels: every output is an empty sum
        y.fill(0)
    elif "product" in ws:
        _depthwise(xp, step, x, w, y, ws["product"])
    elif chunks is None:
        _pointwise(xp, x, w, y, group, transposed=True)
    else:
        kernel_shape, cg, mg = w.shape[2:], x.shape[1] // group, y.shape[1] // group
        win = _window(step, x.shape[2:], kernel_shape, y.shape[2:], transposed=True)
        y.fill(0)
        for n0, n1, r0, r1 in _walk(chunks, x.shape[0], x.shape[2]):
            taps = partial(_taps, win, kernel_shape, x.shape[2:], y.shape[2:], (r0, r1))
            cols = cut(ws["columns"], (n1 - n0, mg, *kernel_shape, r1 - r0, *x.shape[3:]), x.dtype)
            for g in range(group):
                rows = x[n0:n1, g * cg:(g + 1) * cg, r0:r1].reshape(n1 - n0, cg, -1)
                _matmul(xp, w[g * cg:(g + 1) * cg].reshape(cg, -1).T, rows, cols.reshape(n1 - n0, w[0].size, -1))
                image = y[n0:n1, g * mg:(g + 1) * mg]
                for tap, at, target in taps():
                    dst = image[_at(target)]
                    xp.add(dst, cols[(slice(None), slice(None), *tap, *at)], out=dst)
    _add_bias(xp, y, b)


def pool_window(step, x, y):
    """A pool's kernel shape and window."""
    kernel_shape = step.attrs["kernel_shape"]
    return kernel_shape, _window(step, x.shape[2:], kernel_shape, y.shape[2:])


def _lowest(dtype):
    """The value below every other of `dtype`: where a running maximum starts."""
    return np.iinfo(dtype).min if dtype.kind in "iu" else -np.inf


@kernel("MaxPool")
def max_pool(xp, step, ins, outs, ws):
    """The maximum over the taps reaching each output; with Indices, the flat index of the first."""
    x, (y, indices) = ins[0], _padded(outs, 2)
    kernel_shape, win = pool_window(step, x, y)
    taps = partial(_taps, win, kernel_shape, y.shape[2:], x.shape[2:])
    y.fill(_lowest(y.dtype))
    for _, at, source in taps():
        dst = y[_at(at)]
        xp.maximum(dst, x[_at(source)], out=dst)
    if indices is not None and indices.size:
        _argmax(xp, x, y, indices, list(taps()), win, ws["mask"], step.attrs["storage_order"])


def _argmax(xp, x, y, indices, taps, win, masks, storage_order):
    """Indices of the maxima into x flattened (spatial dims column-major when storage_order is 1),
    the first tap in window order winning ties as in ONNX's reference.

    Taps are walked last to first; where a tap holds the maximum, its offset in the window replaces
    the index, as index = (index - offset) * (x != max) + offset with the comparison in `masks` (the
    workspace's one bool per output value of as many images as it holds): ufuncs with a scalar, so
    nothing is allocated. The offset of each window's start is added at the end.
    """
    spatial = x.shape[2:]
    sizes = spatial[::-1] if storage_order else spatial
    strides = [math.prod(sizes[d + 1:]) for d in range(len(sizes))]
    strides = strides[::-1] if storage_order else strides
    images = masks.shape[0]
    indices.fill(0)
    for n0 in range(0, x.shape[0], images):
        n1 = min(n0 + images, x.shape[0])
        mask = masks[:n1 - n0]
        for tap, at, source in reversed(taps):
            offset = sum(t * dil * s for t, dil, s in zip(tap, win.dilations, strides))
            other, where = mask[_at(at)], (slice(n0, n1), slice(None), *at)
            index = indices[where]
            xp.not_equal(x[n0:n1][_at(source)], y[where], out=other)
            xp.subtract(index, offset, out=index)
            xp.multiply(index, other, out=index)
            xp.add(index, offset, out=index)
    _add_window_starts(xp, indices, win, strides, math.prod(spatial))


def _add_window_starts(xp, indices, win, strides, image_size):
    """Add to each index the flat index its window starts at: image and channel, then each spatial dim."""
    n, c = indices.shape[:2]
    for d, (size, scale) in enumerate(((n, c * image_size), (c, image_size))):
        for i in range(size):
            part = indices[(slice(None),) * d + (i,)]
            xp.add(part, i * scale, out=part)
    for d, (s, b, stride) in enumerate(zip(win.strides, win.begin, strides)):
        for o in range(indices.shape[2 + d]):
            part = indices[(slice(None),) * (2 + d) + (o,)]
            xp.add(part, (o * s - b) * stride, out=part)


@kernel("AveragePool")
def average_pool(xp, step, ins, outs, ws):
    """The sum over the taps reaching each output, divided by the count of taps (padding counted
    when count_include_pad, but never the overhang ceil_mode adds)."""
    x, y = ins[0], outs[0]
    kernel_shape, win = pool_window(step, x, y)
    y.fill(0)
    for _, at, source in _taps(win, kernel_shape, y.shape[2:], x.shape[2:]):
        dst = y[_at(at)]
        xp.add(dst, x[_at(source)], out=dst)
    for d, counts in enumerate(ops.of(step).counts(step, win, kernel_shape, x.shape[2:], y.shape[2:])):
        for o0, o1, count in _runs(counts):
            dst = y[(slice(None),) * (2 + d) + (slice(o0, o1),)]
            xp.divide(dst, count, out=dst)


def _runs(values):
    """(start, end, value) of each run of equal values."""
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            yield start, i, values[start]
            start = i


@kernel("GlobalAveragePool")
def global_average_pool(xp, step, ins, outs, ws):
    """The mean over the spatial dims, written through an (N, C) view of the output (keepdims=True
    with out= allocates on CuPy). NumPy's float32 and float64 sum by einsum, then scale: 4x faster than
    mean's reduction row by row on 7x7 planes (CuPy's einsum takes no out=)."""
    x, size = ins[0], math.prod(ins[0].shape[2:])
    out = outs[0].reshape(x.shape[:2])
    if xp is np and x.dtype in (np.float32, np.float64) and size:
        np.einsum("ncs->nc", x.reshape(*x.shape[:2], size), out=out)
        np.multiply(out, 1 / size, out=out)
    else:
        xp.mean(x, axis=tuple(range(2, x.ndim)), out=out)


@kernel("GlobalMaxPool")
def global_max_pool(xp, step, ins, outs, ws):
    """The maximum over the spatial dims, through an (N, C) view of the output like the mean."""
    x = ins[0]
    xp.max(x, axis=tuple(range(2, x.ndim)), out=outs[0].reshape(x.shape[:2]))


def _per_channel(v, ndim):
    """A (C,) vector shaped to broadcast over (N, C, spatial...)."""
    return v.reshape(-1, *[1] * (ndim - 2))


@kernel("BatchNormalization")
def batch_normalization(xp, step, ins, outs, ws):
    """Y = (X - mean) * scale / sqrt(var + epsilon) + B; Y may be X itself.

    In training (training_mode=1, or statistics outputs asked for) mean and var are the batch's,
    kept in the workspace with the partial sums of squares (see the schema), and the running ones
    are updated. Inference has no workspace: on CuPy one fused elementwise kernel; on NumPy the
    per-channel factor and shift are two small temporaries (C values each).
    """
    x, scale, bias, mean, var = ins
    y, eps = outs[0], step.attrs["epsilon"]
    if xp.may_share_memory(x, y):
        x = y  # in place: one array object for both, or CuPy copies the input it sees overlapping
    if not (step.attrs["training_mode"] or any(o is not None for o in outs[1:])):
        _normalize(xp, x, y, *(_per_channel(v, x.ndim) for v in (scale, bias, mean, var)), eps)
        return
    batch_mean, batch_var = ws["mean"], ws["var"]
    _batch_statistics(xp, x, y, batch_mean, batch_var, ws["partial"])
    _running_statistics(xp, step, outs, mean, var, batch_mean, batch_var)
    factor = batch_var  # y holds X - batch mean: scale it by scale / sqrt(var + epsilon), then shift
    xp.add(batch_var, eps, out=factor)
    xp.sqrt(factor, out=factor)
    xp.divide(scale, factor, out=factor)
    xp.multiply(y, _per_channel(factor, x.ndim), out=y)
    xp.add(y, _per_channel(bias, x.ndim), out=y)


def _normalize(xp, x, y, scale, bias, mean, var, eps):
    """y = (x - mean) * scale / sqrt(var + eps) + bias, the statistics broadcasting per channel."""
    if _cupy(xp):
        _cupy_normalize(xp)(x, scale, bias, mean, var, scale.dtype.type(eps), y)
        return
    factor = xp.sqrt(var + eps)
    xp.divide(scale, factor, out=factor)
    shift = bias - mean * factor
    xp.multiply(x, factor, out=y)
    xp.add(y, shift, out=y)


@cache
def _cupy_normalize(cupy):
    """The fused inference BatchNormalization kernel: one pass, nothing allocated; in the statistics' type
    (float32 statistics of a 16-bit input under autocast)."""
    return cupy.ElementwiseKernel("T x, S s, S b, S m, S v, S eps", "T y",
                                  "y = (T)(((S)x - m) * (s / sqrt(v + eps)) + b)", "memplan_batch_norm")


def _running_statistics(xp, step, outs, mean, var, batch_mean, batch_var):
    """The outputs after Y: running mean and variance (old * momentum + batch * (1 - momentum)),
    then the batch's own mean and variance, each only where asked for."""
    running_mean, running_var, saved_mean, saved_var = _padded(outs[1:], 4)
    momentum = step.attrs["momentum"]
    for out, old, new in ((running_mean, mean, batch_mean), (running_var, var, batch_var)):
        if out is not None:  # as new + (old - new) * momentum, needing no temporary
            xp.subtract(old, new, out=out)
            xp.multiply(out, momentum, out=out)
            xp.add(out, new, out=out)
    for out, value in ((saved_mean, batch_mean), (saved_var, batch_var)):
        if out is not None:
            xp.copyto(out, value)


def _batch_statistics(xp, x, y, mean, var, partial):
    """The per-channel mean and (population) variance of x, leaving Y = X - mean: the squares are
    summed by a batched GEMV per image and channel, which needs no temporary."""
    (n, c), pixels = x.shape[:2], math.prod(x.shape[2:])
    count = n * pixels
    xp.sum(x, axis=(0, *range(2, x.ndim)), out=mean, dtype=mean.dtype)
    xp.divide(mean, count, out=mean)  # NaN for an empty batch, as onnxruntime's (np.mean would warn)
    xp.subtract(x, _per_channel(mean, x.ndim), out=y)
    flat = y.reshape(n, c, 1, pixels)
    xp.matmul(flat, flat.reshape(n, c, pixels, 1), out=partial)
    xp.sum(partial.reshape(n, c), axis=0, out=var)
    xp.divide(var, count, out=var)


@kernel("LayerNormalization")
def layer_normalization(xp, step, ins, outs, ws):
    """Y = (X - mean) / sqrt(var + epsilon) * scale + B over the dims from `axis` on, the statistics
    in the stash_type dtype, kept in the Mean and InvStdDev outputs or, for those omitted, in the
    workspace (mean first, see the schema)."""
    x, scale, bias = _padded(ins, 3)
    y, mean, inv_std = _padded(outs, 3)
    a = step.attrs["axis"] % x.ndim
    rows = math.prod(x.shape[:a])
    mean, inv_std = (ws[name] if out is None else out.reshape(rows) for out, name in ((mean, "mean"),
                                                                                      (inv_std, "inv_std")))
    x2, y2 = x.reshape(rows, -1), y.reshape(rows, -1)
    xp.mean(x2, axis=1, out=mean, dtype=mean.dtype)
    xp.subtract(x2, mean[:, None], out=y2)
    xp.matmul(y2[:, None, :], y2[:, :, None], out=inv_std[:, None, None])
    xp.divide(inv_std, y2.shape[1], out=inv_std)
    xp.add(inv_std, step.attrs["epsilon"], out=inv_std)
    xp.sqrt(inv_std, out=inv_std)
    xp.divide(1, inv_std, out=inv_std)
    xp.multiply(y2, inv_std[:, None], out=y2)
    xp.multiply(y, scale, out=y)
    if bias is not None:
        xp.add(y, bias, out=y)
