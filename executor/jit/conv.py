"""Conv, FusedConv, BatchedConv and MaxPool compiled, for 2-D float32 images. Where MKL runs, a conv of one
group goes in lanes, one thread each (`banded`, `pointwise`): a job's im2col, one single-threaded GEMM into
Y's rows and their epilogue while in cache. Elsewhere the walk over chunks and groups, and the GEMMs, are
executor.kernels.nn.convolve's, with a depthwise conv in one pass over its output (bias, Z and the activation
applied row by row while the row is in cache), im2col in one pass over the columns (padding written as zeros
on the way) and the epilogue of the GEMM's blocks in one pass. The max pool goes row by row."""
from functools import partial

import numpy as np
import numba
from numba import njit, prange

from .. import mkl

from ..kernels import batched_conv, nn, override
from . import takes
from .blas import dot, one_thread, sgemm
from .scalar import ACTIVATIONS, FASTMATH, NO_BIAS, activate_row, f32
from .threads import PARALLEL

NO_Z = np.zeros((1, 1, 1, 0), np.float32)
"""Z of a conv without one: its rows are empty."""


@njit(inline="always")
def _span(offset, stride, size, count):
    """The output positions o in [0, count) whose source o * stride + offset lies in [0, size)."""
    lo = 0 if offset >= 0 else (-offset + stride - 1) // stride
    return lo, max(lo, min(count, (size - 1 - offset) // stride + 1))


@njit(inline="always", fastmath=FASTMATH)
def finish_row(row, bias, z, code, p0, p1):
    """row = activation(row + bias + z), z a row of Z or empty."""
    if z.shape[0]:
        for k in range(row.shape[0]):
            row[k] += z[k]
    activate_row(row, bias, code, p0, p1)


@njit(inline="always", fastmath=FASTMATH)
def _same_plane(src, out, w, o, pads, dilations):
    """A stride-1 depthwise plane whose output is as wide as its input (rows align), tap by tap as one
    loop over the flattened plane; then the columns where a tap's source lies off the row (which the flat loop
    takes from the next or previous row) summed again from their own window: subtracting the stray products
    would not undo a NaN, an infinity or a huge value of the other row."""
    height, width = src.shape
    flat, source = out.reshape(-1), src.reshape(-1)
    flat[:] = 0
    for a in range(w.shape[2]):
        rows = a * dilations[0] - pads[0]
        first, end = max(0, -rows), min(out.shape[0], height - rows)
        for e in range(w.shape[3]):
            shift, weight = e * dilations[1] - pads[1], w[o, 0, a, e]
            reach = rows * width + shift
            lo, hi = max(first * width, -reach), min(end * width, height * width - reach)
            if lo >= hi:
                continue
            part, line = flat[lo:hi], source[lo + reach:hi + reach]
            for k in range(hi - lo):
                part[k] += line[k] * weight
    left = min(width, max(0, pads[1]))
    right = max(left, width - max(0, (w.shape[3] - 1) * dilations[1] - pads[1]))
    for r in range(out.shape[0]):
        for col in range(left):
            out[r, col] = _window_sum(src, w, o, r, col, pads, dilations)
        for col in range(right, width):
            out[r, col] = _window_sum(src, w, o, r, col, pads, dilations)


@njit(inline="always", fastmath=FASTMATH)
def _window_sum(src, w, o, r, col, pads, dilations):
    """The stride-1 depthwise output (r, col) of filter o: its taps' products on the image, in the flat loop's
    order."""
    total = f32(0)
    for a in range(w.shape[2]):
        row = r + a * dilations[0] - pads[0]
        if 0 <= row < src.shape[0]:
            for e in range(w.shape[3]):
                at = col + e * dilations[1] - pads[1]
                if 0 <= at < src.shape[1]:
                    total += src[row, at] * w[o, 0, a, e]
    return total


@njit(inline="always", fastmath=FASTMATH)
def padded_tap(row, col, weight):
    """row[col] * weight, 0 off the row (padding)."""
    return row[col] * weight if 0 <= col < row.shape[0] else f32(0)


@njit(inline="always", fastmath=FASTMATH)
def same_row(dst, r0, r1, r2, w):
    """dst[k] = the 3x3 window of rows r0..r2 at columns k - 1.. times w, for a stride-1 conv padded by one
    column each side: the nine taps in one pass over the row, each of its loads a slice's element from 0 on
    (so the compiler vectorizes it), the two edge columns apart."""
    width = dst.shape[0]
    inner = max(0, width - 2)
    mid, lo, at, hi = dst[1:1 + inner], slice(0, inner), slice(1, 1 + inner), slice(2, 2 + inner)
    a0, a1, a2, b0, b1, b2, c0, c1, c2 = r0[lo], r0[at], r0[hi], r1[lo], r1[at], r1[hi], r2[lo], r2[at], r2[hi]
    for k in range(inner):
        mid[k] = (w[0, 0] * a0[k] + w[0, 1] * a1[k] + w[0, 2] * a2[k] + w[1, 0] * b0[k] + w[1, 1] * b1[k]
                  + w[1, 2] * b2[k] + w[2, 0] * c0[k] + w[2, 1] * c1[k] + w[2, 2] * c2[k])
    for k in (0, width - 1):
        total = f32(0)
        for e in range(3):
            total += padded_tap(r0, k - 1 + e, w[0, e]) + padded_tap(r1, k - 1 + e, w[1, e]) \
                + padded_tap(r2, k - 1 + e, w[2, e])
        dst[k] = total


@njit(inline="always", fastmath=FASTMATH)
def halving_row(dst, r0, r1, r2, w, pad):
    """dst[k] = the 3x3 window of rows r0..r2 at columns 2k - pad.. times w, for a stride-2 depthwise conv whose
    three input rows all lie on the image: its nine taps in one pass, with a stride the compiler sees (it loads
    two vectors and shuffles), where a pass per tap with the row's stride gathered (mid-sized layers ran 1.6 to
    1.9x faster)."""
    width, count = r0.shape[0], dst.shape[0]
    lo, hi = min(count, (pad + 1) // 2), max(0, min(count, (width - 3 + pad) // 2 + 1))
    for k in range(lo, hi):
        b = 2 * k - pad
        dst[k] = (w[0, 0] * r0[b] + w[0, 1] * r0[b + 1] + w[0, 2] * r0[b + 2] + w[1, 0] * r1[b] + w[1, 1] * r1[b + 1]
                  + w[1, 2] * r1[b + 2] + w[2, 0] * r2[b] + w[2, 1] * r2[b + 1] + w[2, 2] * r2[b + 2])
    for k in range(count):
        if lo <= k < hi:
            continue
        total = f32(0)
        for e in range(3):
            col = 2 * k - pad + e
            total += padded_tap(r0, col, w[0, e]) + padded_tap(r1, col, w[1, e]) + padded_tap(r2, col, w[2, e])
        dst[k] = total


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def depthwise(x, w, bias, z, y, strides, pads, dilations, code, p0, p1):
    """y = activation(depthwise conv(x, w) + bias + z) for x (N, C, H, W), w (M, 1, kh, kw), y and z (N, M,
    OH, OW), output channel o reading input channel o // (M / C); pads are the leading ones. A 3x3 stride-1
    row as wide as its input is `same_row`'s (rows off the image read as zeros); another plane whose rows
    align with its input's is `_same_plane`'s; a 3x3 stride-2 row whose input rows lie on the image is
    `halving_row`'s; others go tap by tap. Each output row is finished (bias, Z, activation) while in cache."""
    n, c, height, width = x.shape
    m, kh, kw = y.shape[1], w.shape[2], w.shape[3]
    per, step = m // c, strides[1]
    aligned = strides[0] == 1 and step == 1 and y.shape[3] == width
    small = kh == 3 and kw == 3 and dilations[0] == 1 and dilations[1] == 1
    same, halving = small and aligned and pads[1] == 1, small and strides[0] == 2 and step == 2
    zero = np.zeros(width, np.float32)
    for job in prange(n * m):
        i, o = job // m, job % m
        src, out = x[i, o // per], y[i, o]
        b = bias[o] if bias.shape[0] else f32(0)
        if aligned and not same:
            _same_plane(src, out, w, o, pads, dilations)
        for r in range(out.shape[0]):
            dst = out[r]
            ih = r * strides[0] - pads[0]
            if same:
                same_row(dst, src[ih] if 0 <= ih < height else zero, src[ih + 1] if 0 <= ih + 1 < height else zero,
                         src[ih + 2] if 0 <= ih + 2 < height else zero, w[o, 0])
            elif halving and 0 <= ih and ih + 2 < height:
                halving_row(dst, src[ih], src[ih + 1], src[ih + 2], w[o, 0], pads[1])
            elif not aligned:
                dst[:] = 0
                for a in range(kh):
                    ih = r * strides[0] - pads[0] + a * dilations[0]
                    if ih < 0 or ih >= height:
                        continue
                    for e in range(kw):
                        offset = e * dilations[1] - pads[1]
                        lo, hi = _span(offset, step, width, dst.shape[0])
                        if lo >= hi:
                            continue
                        weight, part = w[o, 0, a, e], dst[lo:hi]
                        line = src[ih, lo * step + offset:(hi - 1) * step + offset + 1:step]
                        for k in range(hi - lo):
                            part[k] += line[k] * weight
            finish_row(dst, b, z[i, o, r] if z.shape[3] else z[0, 0, 0], code, p0, p1)


@njit(inline="always", fastmath=FASTMATH)
def _window_rows(image, cols, ch, a, first_row, strides, pads, dilations):
    """cols[ch, a, e, r] for each kernel column e and row r = channel ch of `image` (C, H, W) under kernel row a
    of the windows of output rows first_row on, zeros where they lie on padding. Indexed element by element,
    with indices the compiler sees are not negative (no wraparound), and no view per row (a view's reference
    count costs two atomic operations, as long as copying a deep layer's row of 7 to 28 values): 1.5 to 3.4x
    the speed of copies between views of each row. Strides 1 and 2 are loops of their own, so that the step
    is known."""
    kw, rows, width = cols.shape[2], cols.shape[3], cols.shape[4]
    height, source_width, step = image.shape[1], image.shape[2], strides[1]
    for e in range(kw):
        offset = e * dilations[1] - pads[1]
        lo, hi = _span(offset, step, source_width, width)
        lo = max(0, lo)
        for r in range(rows):
            ih = (first_row + r) * strides[0] - pads[0] + a * dilations[0]
            if ih < 0 or ih >= height or lo >= hi:
                for k in range(width):
                    cols[ch, a, e, r, k] = 0
                continue
            for k in range(lo):
                cols[ch, a, e, r, k] = 0
            for k in range(hi, width):
                cols[ch, a, e, r, k] = 0
            at = max(0, lo * step + offset)
            if step == 1:
                for k in range(hi - lo):
                    cols[ch, a, e, r, lo + k] = image[ch, ih, at + k]
            elif step == 2:
                for k in range(hi - lo):
                    cols[ch, a, e, r, lo + k] = image[ch, ih, at + 2 * k]
            else:
                for k in range(hi - lo):
                    cols[ch, a, e, r, lo + k] = image[ch, ih, at + k * step]


@njit(parallel=PARALLEL, cache=True)
def im2col(x, cols, first_row, strides, pads, dilations):
    """cols (N, C, kh, kw, rows, OW) = the windows of x (N, C, H, W) over output rows first_row on, zeros
    where they lie on padding."""
    n, c, kh = cols.shape[:3]
    for job in prange(n * c * kh):
        i, ch, a = job // (c * kh), (job // kh) % c, job % kh
        _window_rows(x[i], cols[i], ch, a, first_row, strides, pads, dilations)


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def banded(gemm, x, w, bias, z, y, columns, rows, strides, pads, dilations, code, p0, p1):
    """y = activation(conv(x, w) + bias + z) for a conv of one group, in jobs of one image by `rows` output rows
    shared among the lanes (columns' rows, one per thread): a job's im2col into its lane's columns, one
    single-threaded GEMM into Y's rows and their epilogue while they are in cache. One pass over X and Y,
    where im2col, the GEMM and the epilogue each over a whole chunk pass over memory three times."""
    n, c, kh, kw = x.shape[0], x.shape[1], w.shape[2], w.shape[3]
    filters, out_height, out_width = y.shape[1], y.shape[2], y.shape[3]
    lanes, bands, weights = columns.shape[0], (out_height + rows - 1) // rows, w.reshape(filters, -1)
    jobs = n * bands
    for lane in prange(lanes):
        for job in range(lane * jobs // lanes, (lane + 1) * jobs // lanes):
            i, r0 = job // bands, job % bands * rows
            band = min(rows, out_height - r0)
            cols = columns[lane, :c * kh * kw * band * out_width].reshape(c, kh, kw, band, out_width)
            for ch in range(c):
                for a in range(kh):
                    _window_rows(x[i], cols, ch, a, r0, strides, pads, dilations)
            plane = y[i].reshape(filters, out_height * out_width)
            dot(gemm, weights, cols.reshape(c * kh * kw, band * out_width),
                plane[:, r0 * out_width:(r0 + band) * out_width])
            for o in range(filters):
                b = bias[o] if bias.shape[0] else f32(0)
                for r in range(r0, r0 + band):
                    finish_row(y[i, o, r], b, z[i, o, r] if z.shape[3] else z[0, 0, 0], code, p0, p1)


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def pointwise(gemm, x, w, bias, z, y, lanes, pixels, code, p0, p1):
    """y = activation(w x + bias + z) for a 1x1 stride-1 conv of one group, x (N, C, P) and y, z (N, M, P), in
    jobs of one image by `pixels` columns shared among `lanes` threads: one single-threaded GEMM into those
    columns of Y's rows and their epilogue while they are in cache, where a pass over the whole of Y after the
    GEMMs took 30 to 40% of resnet50's residual convs."""
    n, filters, size = y.shape[0], y.shape[1], y.shape[2]
    bands = (size + pixels - 1) // pixels
    jobs = n * bands
    for lane in prange(lanes):
        for job in range(lane * jobs // lanes, (lane + 1) * jobs // lanes):
            i, q0 = job // bands, job % bands * pixels
            q1 = min(size, q0 + pixels)
            dot(gemm, w, x[i, :, q0:q1], y[i, :, q0:q1])
            for o in range(filters):
                finish_row(y[i, o, q0:q1], bias[o] if bias.shape[0] else f32(0),
                           z[i, o, q0:q1] if z.shape[2] else z[0, 0, :0], code, p0, p1)


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def epilogue(y, bias, z, code, p0, p1):
    """y = activation(y + bias + z) for a block y (N, M, rows, OW) of the output, z the same block of Z or
    empty, bias one value per channel or none."""
    n, m, rows = y.shape[0], y.shape[1], y.shape[2]
    for job in prange(n * m):
        i, o = job // m, job % m
        b = bias[o] if bias.shape[0] else f32(0)
        for r in range(rows):
            finish_row(y[i, o, r], b, z[i, o, r] if z.shape[3] else z[0, 0, 0], code, p0, p1)


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def write_back(output, y, bias, z, code, p0, p1):
    """y (N, M, rows, OW) = activation(output + bias + z) for a BatchedConv's output (M, N, rows, OW)."""
    n, m, rows = y.shape[0], y.shape[1], y.shape[2]
    for job in prange(n * m):
        i, o = job // m, job % m
        b = bias[o] if bias.shape[0] else f32(0)
        for r in range(rows):
            row = y[i, o, r]
            row[:] = output[o, i, r]
            finish_row(row, b, z[i, o, r] if z.shape[3] else z[0, 0, 0], code, p0, p1)


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def max_pool(x, y, kernel, strides, pads, dilations):
    """y = the maximum over each window of x (N, C, H, W), row by row of the output: a 3x3 stride-2 row whose
    input rows lie on the image in one pass (_halving_max_row), the others tap by tap."""
    n, c, height, width = x.shape
    halving = kernel[0] == 3 and kernel[1] == 3 and strides[0] == 2 and strides[1] == 2 and dilations[0] == 1 \
        and dilations[1] == 1
    for job in prange(n * c):
        src, out = x[job // c, job % c], y[job // c, job % c]
        for r in range(out.shape[0]):
            dst = out[r]
            top = r * 2 - pads[0]
            if halving and 0 <= top and top + 2 < height:
                _halving_max_row(dst, src[top], src[top + 1], src[top + 2], pads[1])
                continue
            dst[:] = -np.inf
            for a in range(kernel[0]):
                ih = r * strides[0] - pads[0] + a * dilations[0]
                if ih < 0 or ih >= height:
                    continue
                for e in range(kernel[1]):
                    offset = e * dilations[1] - pads[1]
                    lo, hi = _span(offset, strides[1], width, dst.shape[0])
                    if lo < hi:
                        part = dst[lo:hi]
                        line = src[ih, lo * strides[1] + offset:(hi - 1) * strides[1] + offset + 1:strides[1]]
                        for k in range(hi - lo):
                            part[k] = max(part[k], line[k])


@njit(inline="always", fastmath=FASTMATH)
def _halving_max_row(dst, r0, r1, r2, pad):
    """dst[k] = the maximum of the 3x3 window of rows r0..r2 at columns 2k - pad.., in one pass with a stride
    the compiler sees (as halving_row); the columns whose window reaches the padding apart."""
    width, count = r0.shape[0], dst.shape[0]
    lo, hi = min(count, (pad + 1) // 2), max(0, min(count, (width - 3 + pad) // 2 + 1))
    for k in range(lo, hi):
        b = 2 * k - pad
        dst[k] = max(max(max(r0[b], r0[b + 1]), max(r0[b + 2], r1[b])), max(max(r1[b + 1], r1[b + 2]),
                                                                             max(max(r2[b], r2[b + 1]), r2[b + 2])))
    for k in range(count):
        if lo <= k < hi:
            continue
        best = -np.inf
        for e in range(3):
            col = 2 * k - pad + e
            if 0 <= col < width:
                best = max(best, max(r0[col], max(r1[col], r2[col])))
        dst[k] = best


@override("jit", "MaxPool")
def pool(generic):
    """The MaxPool kernel for 2-D float32 images of C layout without Indices; `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        x, y = ins[0], outs[0]
        if x.ndim != 4 or len(outs) > 1 and outs[1] is not None or not takes(x, y):
            return generic(xp, step, ins, outs, ws)
        kernel, win = nn.pool_window(step, x, y)
        max_pool(x, y, tuple(kernel), win.strides, win.begin, win.dilations)
    return run


def images(generic, body):
    """A Conv-like kernel running `body(xp, step, ins, outs, ws, epilogue)` for 2-D float32 images of C layout
    (`epilogue` from `epilogue_of`), `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        x, w, b, z = (list(ins) + [None] * 3)[:4]
        y = outs[0]
        if x.ndim != 4 or not takes(x, w, b, z, y) or not x.size or not y.size:
            return generic(xp, step, ins, outs, ws)
        body(xp, step, ins, outs, ws, epilogue_of(step, b, z))
    return run


@override("jit", "Conv")
@override("jit", "FusedConv", domain="com.microsoft")
def conv(generic):
    """The Conv and FusedConv kernel: `_in_lanes`'s where it applies, else nn.convolve's walk with these
    kernels."""
    def body(xp, step, ins, outs, ws, epilogue):
        if not _in_lanes(step, ins[0], ins[1], outs[0], ws, epilogue):
            nn.convolve(xp, step, ins[0], ins[1], outs[0], ws, partial(_finish, *epilogue), fill=_fill,
                        by_channel=partial(_depthwise, epilogue))
    return images(generic, body)


BAND_BYTES = 1 << 21
"""A lane's columns in `banded` at most: a core's L2 cache on the 2-core box. Bands of 128 KiB ran resnet50's
3x3 stride-2 convs 1.3 to 1.6x slower (GEMMs 14 to 56 columns wide); at 2 MiB its 1x1 stride-2 convs took
0.77x the time of the whole-chunk walk, mobilenet_v2's first conv 0.75x, the rest the same."""


def _in_lanes(step, x, w, y, ws, epilogue):
    """Run a conv of one group by `banded` (its lanes' columns cut from the planned ones, at least one output
    row's each) or, without columns, a 1x1 one by `pointwise`, where MKL runs (numba's np.dot would take
    the blocks of Y's rows element by element); whether it ran."""
    if step.attrs.get("group", 1) != 1 or not mkl.available():
        return False
    bias, z, code, p0, p1 = epilogue
    if "columns" not in ws:
        if w.shape[2:] != (1, 1) or x.shape[2:] != y.shape[2:]:
            return False
        n, filters, channels = y.shape[0], y.shape[1], x.shape[1]
        size = y.shape[2] * y.shape[3]
        bands = -(-size * (filters + channels) * 4 // BAND_BYTES)
        flat_z = z.reshape(n, filters, size) if z.size else z.reshape(1, 1, 0)
        with one_thread()():
            pointwise(sgemm(), x.reshape(n, channels, size), w.reshape(filters, channels), bias, flat_z,
                      y.reshape(n, filters, size), numba.get_num_threads(), -(-size // max(1, bands)), code, p0, p1)
        return True
    row, floats = w[0].size * y.shape[3], ws["columns"].nbytes // 4
    lanes = min(numba.get_num_threads(), x.shape[0] * y.shape[2], floats // row)
    if lanes < 1:
        return False
    rows = max(1, min(BAND_BYTES // 4 // row, floats // lanes // row))
    columns = ws["columns"].reshape(-1).view(np.float32)[:lanes * (floats // lanes)].reshape(lanes, -1)
    win = nn.conv_window(step, x, w, y)
    with one_thread()():
        banded(sgemm(), x, w, bias, z, y, columns, rows, win.strides, win.begin, win.dilations, code, p0, p1)
    return True


@override("jit", "BatchedConv", domain="memplan")
def batched(generic):
    """The BatchedConv kernel: where MKL runs, the conv it was made from in lanes (`_in_lanes`, its columns cut
    from the op's scratch; a 1x1 one needs none), which took 0.8 to 0.97x the time of resnet50's 7x7 stage
    batched; else the columns by `im2col` and the output written back by `write_back`."""
    def body(xp, step, ins, outs, ws, epilogue):
        x, w, y = ins[0], ins[1], outs[0]
        one_by_one = w.shape[2:] == (1, 1) and x.shape[2:] == y.shape[2:]
        if _in_lanes(step, x, w, y, {} if one_by_one else {"columns": ws["columns"]}, epilogue):
            return
        bias, z, code, p0, p1 = epilogue

        def back(output, block, at):
            write_back(output.reshape(y.shape[1], *block.shape[:1], *y.shape[2:]), block, bias,
                       z[at] if z.size else z, code, p0, p1)
        batched_conv.convolve(xp, step, ins, outs, ws, batched_conv.columns(xp, _fill), back)
    return images(generic, body)


def epilogue_of(step, b, z):
    """(bias, Z, code, p0, p1) of a conv's epilogue, NO_BIAS and NO_Z for omitted ones."""
    return (NO_BIAS if b is None else b, NO_Z if z is None else z, *activation(step))


def activation(step):
    """(code, p0, p1) of a FusedConv's activation; the identity's for a Conv."""
    name = step.attrs.get("activation") or "Identity"
    params = [float(p) for p in step.attrs.get("activation_params") or ()] + [0.0, 0.0]
    return ACTIVATIONS.index(name), f32(params[0]), f32(params[1])


def _finish(bias, z, code, p0, p1, y, at=()):
    """The epilogue of a GEMM's block Y[at] (all of Y without `at`)."""
    epilogue(y, bias, z[at] if at and z.size else z, code, p0, p1)


def _fill(xp, cols, images, win, grid, rows, first):
    """nn.fill_columns by `im2col`: every column written, padding included, whichever group."""
    im2col(images, cols, rows[0], win.strides, win.begin, win.dilations)


def _depthwise(epilogue_args, xp, step, x, w, y, ws, finish):
    """nn.depthwise in one pass, the epilogue included."""
    win = nn.conv_window(step, x, w, y)
    bias, z, code, p0, p1 = epilogue_args
    depthwise(x, w, bias, z, y, win.strides, win.begin, win.dilations, code, p0, p1)
