"""memplan.InvertedResidual compiled, for float32: the jobs (executor.kernels.inverted_residual.jobs) shared
among workers, as many as the plan's lanes or the threads numba runs, whichever is fewer, each a thread with its
lane's scratch (the plan holds the same lanes on every machine), its GEMMs single-threaded BLAS calls
(executor/jit/blas.py: MKL's, else numba's np.dot on SciPy's BLAS; held to one thread during the call: two
lanes calling a two-thread BLAS ran 2x slower). A block that widens is `block`'s, channels-last between the
GEMMs, so that the widened rows' bias and activation and the depthwise conv's nine taps are loops over the
channels, as long for a 7x7 image as for a 112x112 one; one that does not is `separable`'s, on rows of planes.
"""

import numba
import numpy as np
from numba import njit, prange

from planner.ops.inverted_residual import job_size

from ..kernels import inverted_residual as shared
from ..kernels import override
from . import takes
from .blas import dot, one_thread, sgemm
from .conv import NO_Z, halving_row, same_row
from .scalar import ACTIVATIONS, FASTMATH, NO_BIAS, activate_row, f32
from .threads import PARALLEL


@njit(fastmath=FASTMATH, cache=True)
def _widen(gemm, x, w1, b1, code, p0, p1, columns, rows, i0, count, top, t0, t1):
    """rows (held rows, count images * W, E) = activation(the job's input pixels times W1^T + bias), zero off
    the image: the pixels gathered row by row, each row's images side by side, so that one GEMM writes every
    image row the depthwise conv reads where it reads it."""
    width, wide = x.shape[3], rows.shape[2]
    line = count * width
    cols = columns[:x.shape[1] * (t1 - t0) * line].reshape(x.shape[1], (t1 - t0) * line)
    for ch in range(x.shape[1]):
        if count == 1:
            cols[ch] = x[i0, ch, t0:t1].reshape(-1)
            continue
        for t in range(t0, t1):
            for k in range(count):
                at = ((t - t0) * count + k) * width
                for col in range(width):
                    cols[ch, at + col] = x[i0 + k, ch, t, col]
    flat = rows.reshape(rows.shape[0], line * wide)
    dot(gemm, cols.T, w1.T, flat[t0 - top:t1 - top].reshape(-1, wide))
    for j in range(rows.shape[0]):
        row = flat[j]
        if j < t0 - top or j >= t1 - top:
            row[:] = 0
            continue
        if b1.shape[0]:
            for p in range(line):
                for ch in range(wide):
                    row[p * wide + ch] += b1[ch]
        activate_row(row, f32(0), code, p0, p1)


@njit(inline="always", fastmath=FASTMATH)
def _quad(rows, taps, b2, out, r, s, o, left, right):
    """out[o..o + 3] = bias + the stride-1 3x3 windows from rows r.., columns s.. (column s on the padding
    where `left`, s + 5 where `right`), channel by channel innermost: each tap row's six columns loaded once
    for the four pixels, its three taps once for all."""
    for ch in range(out.shape[1]):
        s0 = s1 = s2 = s3 = b2[ch] if b2.shape[0] else f32(0)
        for a in range(3):
            p = rows[r + a]
            t0, t1, t2 = taps[a, 0, ch], taps[a, 1, ch], taps[a, 2, ch]
            x0 = f32(0) if left else p[s, ch]
            x5 = f32(0) if right else p[s + 5, ch]
            x1, x2, x3, x4 = p[s + 1, ch], p[s + 2, ch], p[s + 3, ch], p[s + 4, ch]
            s0 += t0 * x0 + t1 * x1 + t2 * x2
            s1 += t0 * x1 + t1 * x2 + t2 * x3
            s2 += t0 * x2 + t1 * x3 + t2 * x4
            s3 += t0 * x3 + t1 * x4 + t2 * x5
        out[o, ch], out[o + 1, ch], out[o + 2, ch], out[o + 3, ch] = s0, s1, s2, s3


@njit(inline="always", fastmath=FASTMATH)
def _pair(rows, taps, b2, out, r, s, o):
    """out[o..o + 1] = bias + the stride-2 3x3 windows from rows 2r.., columns s..: each tap row's five columns
    loaded once for both pixels."""
    for ch in range(out.shape[1]):
        s0 = s1 = b2[ch] if b2.shape[0] else f32(0)
        for a in range(3):
            p = rows[2 * r + a]
            t0, t1, t2 = taps[a, 0, ch], taps[a, 1, ch], taps[a, 2, ch]
            x0, x1, x2, x3, x4 = p[s, ch], p[s + 1, ch], p[s + 2, ch], p[s + 3, ch], p[s + 4, ch]
            s0 += t0 * x0 + t1 * x1 + t2 * x2
            s1 += t0 * x2 + t1 * x3 + t2 * x4
        out[o, ch], out[o + 1, ch] = s0, s1


@njit(inline="always", fastmath=FASTMATH)
def _edge(rows, taps, b2, out, first_row, s, e, o):
    """out[o] = bias + taps e, e + 1 of each tap row times columns s, s + 1 from row `first_row`: a window with
    its third column on the padding (e = 1: the left one, e = 0: the right one)."""
    for ch in range(out.shape[1]):
        total = b2[ch] if b2.shape[0] else f32(0)
        for a in range(3):
            p = rows[first_row + a]
            total += taps[a, e, ch] * p[s, ch] + taps[a, e + 1, ch] * p[s + 1, ch]
        out[o, ch] = total


@njit(inline="always", fastmath=FASTMATH)
def _pixel(rows, taps, b2, out, stride, r, c, o, left, width):
    """out[o] = bias + the 3x3 window at output row r, column c, at `stride`, of the image whose columns are
    rows[:, left:left + width], its columns off the image (the padding) skipped: the columns of rows too
    narrow for `_quad` or `_pair`."""
    for ch in range(out.shape[1]):
        out[o, ch] = b2[ch] if b2.shape[0] else f32(0)
    for a in range(3):
        p = rows[r * stride + a]
        for e in range(3):
            col = c * stride + e - 1
            if 0 <= col < width:
                for ch in range(out.shape[1]):
                    out[o, ch] += taps[a, e, ch] * p[left + col, ch]


@njit(fastmath=FASTMATH, cache=True)
def _depthwise(rows, k, width, taps, b2, code, p0, p1, out, stride, band, out_width):
    """out (band * OW, E) = activation(the 3x3 depthwise conv, padded by one, at `stride` + bias) of image k of
    `rows` (held rows, images * W, E), channel by channel in the innermost loop, several output columns at
    once sharing their loads (four at stride 1, the padding read as zeros at the edges; two at stride 2, its
    edge columns one by one; the last group overlapping its neighbour): 1.1 to 1.6x the speed of pairs of
    pixels loading their own, whose loop spilled its 28 pointers to the stack."""
    left = k * width
    for r in range(band):
        first = r * out_width
        if stride == 1 and width >= 4:
            for at in range(0, width, 4):
                c = min(at, width - 4)
                _quad(rows, taps, b2, out, r, left + c - 1, first + c, c == 0, c == width - 4)
        elif stride == 2 and width >= 6:
            inner = (width - 2) // 2  # output columns 1..inner have their whole window in the image
            for at in range(1, inner + 1, 2):
                c = min(at, inner - 1)
                _pair(rows, taps, b2, out, r, left + 2 * c - 1, first + c)
            _edge(rows, taps, b2, out, 2 * r, left, 1, first)
            if inner < out_width - 1:
                _edge(rows, taps, b2, out, 2 * r, left + width - 2, 0, first + out_width - 1)
        else:
            for c in range(out_width):
                _pixel(rows, taps, b2, out, stride, r, c, first + c, left, width)
        activate_row(out[first:first + out_width].reshape(-1), f32(0), code, p0, p1)


@njit(fastmath=FASTMATH, cache=True)
def _narrow(gemm, out, w3, b3, z, y, projected, i0, count, r0, band, code, p0, p1):
    """Y's rows r0.. of images i0.. = activation(W3 out^T + bias + Z), `out` the job's depthwise outputs: the GEMM
    channels-last (out W3^T: 15 to 60% faster than W3 out^T on these shapes), transposed as Y's rows are written
    with Z, then the bias and activation."""
    filters, out_width = y.shape[1], y.shape[3]
    outputs = band * out_width
    narrow = projected[:count * outputs * filters].reshape(count * outputs, filters)
    dot(gemm, out, w3.T, narrow)
    for o in range(filters):
        bias = b3[o] if b3.shape[0] else f32(0)
        for k in range(count):
            for r in range(band):
                row, at = y[i0 + k, o, r0 + r], k * outputs + r * out_width
                if z.shape[3]:
                    residual = z[i0 + k, o, r0 + r]
                    for col in range(out_width):
                        row[col] = narrow[at + col, o] + residual[col]
                else:
                    for col in range(out_width):
                        row[col] = narrow[at + col, o]
                activate_row(row, bias, code, p0, p1)


@njit(inline="always")
def _jobs(n, out_height, images, rows):
    """How many jobs of `images` images by `rows` output rows cover the output."""
    return (n + images - 1) // images * ((out_height + rows - 1) // rows)


@njit(inline="always")
def _job(job, n, out_height, images, rows):
    """(first image, first output row, images, rows) of job `job`, band by band of each group of images."""
    bands = (out_height + rows - 1) // rows
    i0, r0 = job // bands * images, job % bands * rows
    return i0, r0, min(n, i0 + images) - i0, min(out_height, r0 + rows) - r0


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def block(gemm, x, w1, b1, w2, b2, w3, b3, z, y, stride, images, rows, codes, params, taps, columns, widened,
          depthwise, projected, lanes):
    """y = the InvertedResidual of x (executor.kernels.inverted_residual's arithmetic) for a block that widens,
    codes[s] and params[2s], params[2s + 1] stage s's activation; scratch per lane as the op's layout, the jobs
    shared among the first `lanes`."""
    n, height, width = x.shape[0], x.shape[2], x.shape[3]
    wide_channels, out_height, out_width = w2.shape[0], y.shape[2], y.shape[3]
    for ch in range(wide_channels):
        for a in range(3):
            for e in range(3):
                taps[a, e, ch] = w2[ch, 0, a, e]
    jobs = _jobs(n, out_height, images, rows)
    for lane in prange(lanes):
        for job in range(lane * jobs // lanes, (lane + 1) * jobs // lanes):
            i0, r0, count, band = _job(job, n, out_height, images, rows)
            top, held = r0 * stride - 1, (band - 1) * stride + 3
            t0, t1 = max(0, top), min(height, (r0 + band - 1) * stride + 2)
            wide = widened[lane].reshape(-1)[:held * count * width * wide_channels].reshape(
                held, count * width, wide_channels)
            _widen(gemm, x, w1, b1, codes[0], params[0], params[1], columns[lane], wide, i0, count, top, t0, t1)
            outputs = band * out_width
            out = depthwise[lane].reshape(-1)[:count * outputs * wide_channels].reshape(count * outputs, wide_channels)
            for k in range(count):
                _depthwise(wide, k, width, taps, b2, codes[1], params[2], params[3], out[k * outputs:(k + 1) * outputs],
                           stride, band, out_width)
            _narrow(gemm, out, w3, b3, z, y, projected[lane], i0, count, r0, band, codes[2], params[4], params[5])


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def separable(gemm, x, w2, b2, w3, b3, z, y, stride, images, rows, codes, params, depthwise, projected, lanes):
    """y = the InvertedResidual of x for a block that does not widen (a depthwise-separable conv), on rows of
    planes as X and Y are, with none of `block`'s transposes: per job, each channel's depthwise rows from X's
    rows (same_row, halving_row: the nine taps in one pass) into (C, outputs), one GEMM W3 times them, its rows
    written into Y's with Z, the bias and the activation. mobilenet_v2's first block (32 channels, 112x112)
    took 35 to 45% less time than by `block`; blocks that widen took 15 to 90% more this way (the widened
    rows' GEMM and bias pass lose more than the transposes cost). Scratch per lane as the op's layout, the jobs
    shared among the first `lanes`."""
    n, c, height, width = x.shape
    filters, out_height, out_width = y.shape[1], y.shape[2], y.shape[3]
    zero = np.zeros(width, np.float32)
    jobs = _jobs(n, out_height, images, rows)
    for lane in prange(lanes):
        for job in range(lane * jobs // lanes, (lane + 1) * jobs // lanes):
            i0, r0, count, band = _job(job, n, out_height, images, rows)
            outputs = band * out_width
            out = depthwise[lane].reshape(-1)[:c * count * outputs].reshape(c, count * outputs)
            for ch in range(c):
                taps, bias = w2[ch, 0], b2[ch] if b2.shape[0] else f32(0)
                for k in range(count):
                    src = x[i0 + k, ch]
                    for r in range(band):
                        top = (r0 + r) * stride - 1
                        dst = out[ch, k * outputs + r * out_width:k * outputs + (r + 1) * out_width]
                        above = src[top] if top >= 0 else zero
                        below = src[top + 2] if top + 2 < height else zero
                        if stride == 1:
                            same_row(dst, above, src[top + 1], below, taps)
                        else:
                            halving_row(dst, above, src[top + 1], below, taps, 1)
                        activate_row(dst, bias, codes[1], params[2], params[3])
            narrow = projected[lane, :filters * count * outputs].reshape(filters, count * outputs)
            dot(gemm, w3, out, narrow)
            for o in range(filters):
                bias = b3[o] if b3.shape[0] else f32(0)
                for k in range(count):
                    for r in range(band):
                        row, at = y[i0 + k, o, r0 + r], k * outputs + r * out_width
                        line = narrow[o, at:at + out_width]
                        if z.shape[3]:
                            residual = z[i0 + k, o, r0 + r]
                            for col in range(out_width):
                                row[col] = line[col] + residual[col]
                        else:
                            row[:] = line
                        activate_row(row, bias, codes[2], params[4], params[5])


@override("jit", "InvertedResidual", domain="memplan")
def inverted_residual(generic):
    """The InvertedResidual kernel for float32 arrays of C layout, `generic` for the rest."""
    def run(xp, step, ins, outs, ws):
        x, w1, b1, w2, b2, w3, b3, z = [*ins, *[None] * 8][:8]
        y = outs[0]
        if not takes(*ins, y):
            return generic(xp, step, ins, outs, ws)
        stages = shared.stages(step)
        codes = tuple(ACTIVATIONS.index(name or "Identity") for name, _ in stages)
        params = tuple(f32(v) for _, p in stages for v in (*(p or ()), 0.0, 0.0)[:2])
        stride = step.attrs["strides"][0]
        gemm, z = sgemm(), NO_Z if z is None else z
        jobs = job_size(ws["widened"].shape, stride)
        lanes = max(1, min(ws["widened"].shape[0], numba.get_num_threads()))
        with one_thread()():
            if w1 is None:
                return separable(gemm, x, w2, _bias(b2), w3.reshape(w3.shape[0], -1), _bias(b3), z, y, stride, *jobs,
                                 codes, params, ws["depthwise"], ws["projected"], lanes)
            block(gemm, x, w1.reshape(w1.shape[0], -1), _bias(b1), w2, _bias(b2), w3.reshape(w3.shape[0], -1),
                  _bias(b3), z, y, stride, *jobs, codes, params, ws["taps"].reshape(3, 3, -1), ws["columns"],
                  ws["widened"], ws["depthwise"], ws["projected"], lanes)
    return run


def _bias(b):
    """A bias, or NO_BIAS for an omitted one."""
    return NO_BIAS if b is None else b
