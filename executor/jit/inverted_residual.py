"""memplan.InvertedResidual compiled, for float32: the jobs (executor.kernels.inverted_residual.jobs) shared
among the plan's lanes, each lane a thread with its own scratch, its GEMMs single-threaded BLAS calls
(executor/jit/blas.py: MKL's, else numba's np.dot on SciPy's BLAS; held to one thread during the call: two
lanes calling a two-thread BLAS ran 2x slower). A block that widens is `block`'s, channels-last between the
GEMMs, so that the widened rows' bias and activation, the padding and the depthwise conv's nine taps are loops
over the channels, as long for a 7x7 image as for a 112x112 one; one that does not is `separable`'s, on rows of
planes."""
from functools import cache

import numpy as np
from numba import njit, prange

from planner.ops import mkl
from planner.ops.inverted_residual import job_size

from ..kernels import inverted_residual as shared
from . import takes
from .blas import dot, sgemm
from .conv import NO_Z, halving_row, same_row
from .scalar import ACTIVATIONS, NO_BIAS, activate_row, f32
from .threads import PARALLEL


@njit(fastmath=True, cache=True)
def _widen(gemm, x, w1, columns, expanded, i0, count, t0, t1):
    """The job's widened pixels (count * (t1 - t0) * W, E): its input pixels gathered, times W1^T."""
    c, width = x.shape[1], x.shape[3]
    plane = (t1 - t0) * width
    cols = columns[:count * plane * c].reshape(c, count * plane)
    for ch in range(c):
        for k in range(count):
            cols[ch, k * plane:(k + 1) * plane] = x[i0 + k, ch, t0:t1].reshape(plane)
    wide = expanded[:count * plane * w1.shape[0]].reshape(count * plane, w1.shape[0])
    dot(gemm, cols.T, w1.T, wide)
    return wide


@njit(fastmath=True, cache=True)
def _pad(padded, wide, b1, code, p0, p1, k, top, t0, t1, height, width):
    """padded (rows, W + 2, E) = image k's widened rows from image row `top` on, their bias and activation
    applied, zeros off the image."""
    plane = (t1 - t0) * width
    for j in range(padded.shape[0]):
        r = top + j
        if r < 0 or r >= height:
            padded[j] = 0
            continue
        padded[j, 0] = 0
        padded[j, width + 1] = 0
        at = k * plane + (r - t0) * width
        for col in range(width):
            for ch in range(padded.shape[2]):
                padded[j, col + 1, ch] = wide[at + col, ch] + (b1[ch] if b1.shape[0] else f32(0))
        activate_row(padded[j, 1:width + 1].reshape(-1), f32(0), code, p0, p1)


@njit(fastmath=True, cache=True)
def _depthwise(padded, taps, b2, code, p0, p1, out, stride, band, out_width):
    """out (band * OW, E) = activation(the 3x3 depthwise conv of padded at `stride` + bias), channel by channel
    in the innermost loop, two pixels at once (an odd last one as a pair overlapping its neighbour), the taps
    loaded once for both: 10 to 30% faster than one at a time. The loop indexes padded, the taps and out
    directly, three arrays, few enough runtime overlap checks for LLVM to vectorise it (with a view per pixel
    and tap, 32 to 144 channels took 1.4 to 4x longer)."""
    for r in range(band):
        ra, first = r * stride, r * out_width
        for pair in range(0, out_width, 2):
            col = min(pair, out_width - 2) if out_width > 1 else 0
            ca, cb, o = col * stride, min(col + 1, out_width - 1) * stride, first + col
            for ch in range(out.shape[1]):
                t00, t01, t02 = taps[0, 0, ch], taps[0, 1, ch], taps[0, 2, ch]
                t10, t11, t12 = taps[1, 0, ch], taps[1, 1, ch], taps[1, 2, ch]
                t20, t21, t22 = taps[2, 0, ch], taps[2, 1, ch], taps[2, 2, ch]
                bias = b2[ch] if b2.shape[0] else f32(0)
                out[o, ch] = (bias + t00 * padded[ra, ca, ch] + t01 * padded[ra, ca + 1, ch]
                              + t02 * padded[ra, ca + 2, ch] + t10 * padded[ra + 1, ca, ch]
                              + t11 * padded[ra + 1, ca + 1, ch] + t12 * padded[ra + 1, ca + 2, ch]
                              + t20 * padded[ra + 2, ca, ch] + t21 * padded[ra + 2, ca + 1, ch]
                              + t22 * padded[ra + 2, ca + 2, ch])
                out[o + 1 if out_width > 1 else o, ch] = (bias + t00 * padded[ra, cb, ch] + t01 * padded[ra, cb + 1, ch]
                                                          + t02 * padded[ra, cb + 2, ch] + t10 * padded[ra + 1, cb, ch]
                                                          + t11 * padded[ra + 1, cb + 1, ch]
                                                          + t12 * padded[ra + 1, cb + 2, ch]
                                                          + t20 * padded[ra + 2, cb, ch]
                                                          + t21 * padded[ra + 2, cb + 1, ch]
                                                          + t22 * padded[ra + 2, cb + 2, ch])
        activate_row(out[first:first + out_width].reshape(-1), f32(0), code, p0, p1)


@njit(fastmath=True, cache=True)
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


@njit(parallel=PARALLEL, fastmath=True, cache=True)
def block(gemm, x, w1, b1, w2, b2, w3, b3, z, y, stride, images, rows, codes, params, taps, columns, expanded, padded,
          depthwise, projected):
    """y = the InvertedResidual of x (executor.kernels.inverted_residual's arithmetic) for a block that widens,
    codes[s] and params[2s], params[2s + 1] stage s's activation; scratch per lane as the op's layout."""
    n, height, width = x.shape[0], x.shape[2], x.shape[3]
    wide_channels, out_height, out_width = w2.shape[0], y.shape[2], y.shape[3]
    lanes = padded.shape[0]
    for ch in range(wide_channels):
        for a in range(3):
            for e in range(3):
                taps[a, e, ch] = w2[ch, 0, a, e]
    jobs = _jobs(n, out_height, images, rows)
    for lane in prange(lanes):
        for job in range(lane * jobs // lanes, (lane + 1) * jobs // lanes):
            i0, r0, count, band = _job(job, n, out_height, images, rows)
            top = r0 * stride - 1
            t0, t1 = max(0, top), min(height, (r0 + band - 1) * stride + 2)
            wide = _widen(gemm, x, w1, columns[lane], expanded[lane], i0, count, t0, t1)
            outputs = band * out_width
            out = depthwise[lane].reshape(-1)[:count * outputs * wide_channels].reshape(count * outputs, wide_channels)
            for k in range(count):
                _pad(padded[lane, :(band - 1) * stride + 3], wide, b1, codes[0], params[0], params[1], k, top, t0, t1,
                     height, width)
                _depthwise(padded[lane], taps, b2, codes[1], params[2], params[3], out[k * outputs:(k + 1) * outputs],
                           stride, band, out_width)
            _narrow(gemm, out, w3, b3, z, y, projected[lane], i0, count, r0, band, codes[2], params[4], params[5])


@njit(parallel=PARALLEL, fastmath=True, cache=True)
def separable(gemm, x, w2, b2, w3, b3, z, y, stride, images, rows, codes, params, depthwise, projected):
    """y = the InvertedResidual of x for a block that does not widen (a depthwise-separable conv), on rows of
    planes as X and Y are, with none of `block`'s transposes: per job, each channel's depthwise rows from X's
    rows (same_row, halving_row: the nine taps in one pass) into (C, outputs), one GEMM W3 times them, its rows
    written into Y's with Z, the bias and the activation. mobilenet_v2's first block (32 channels, 112x112)
    took 35 to 45% less time than by `block`; blocks that widen took 15 to 90% more this way (the widened
    rows' GEMM and bias pass lose more than the transposes cost). Scratch per lane as the op's layout."""
    n, c, height, width = x.shape
    filters, out_height, out_width = y.shape[1], y.shape[2], y.shape[3]
    lanes, zero = depthwise.shape[0], np.zeros(width, np.float32)
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


@cache
def _one_thread():
    """A context manager holding the BLAS libraries the lanes call (MKL's, SciPy's) to one thread."""
    import scipy.linalg  # noqa: F401  (loads the BLAS numba's np.dot calls, so the controller finds it)
    mkl.library()  # loads MKL where it is installed, so the controller finds it even when it is switched off now
    from threadpoolctl import ThreadpoolController
    controller = ThreadpoolController().select(user_api="blas")
    return lambda: controller.limit(limits=1)


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
        jobs = job_size(ws["padded"].shape, ws["depthwise"].shape, stride)
        with _one_thread()():
            if w1 is None:
                return separable(gemm, x, w2, _bias(b2), w3.reshape(w3.shape[0], -1), _bias(b3), z, y, stride, *jobs,
                                 codes, params, ws["depthwise"], ws["projected"])
            block(gemm, x, w1.reshape(w1.shape[0], -1), _bias(b1), w2, _bias(b2), w3.reshape(w3.shape[0], -1),
                  _bias(b3), z, y, stride, *jobs, codes, params, ws["taps"].reshape(3, 3, -1), ws["columns"],
                  ws["expanded"], ws["padded"], ws["depthwise"], ws["projected"])
    return run


def _bias(b):
    """A bias, or NO_BIAS for an omitted one."""
    return NO_BIAS if b is None else b
