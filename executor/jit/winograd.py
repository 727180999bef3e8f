"""memplan.WinogradConv's transforms compiled, for float32, of F(2x2, 3x3) and F(4x4, 3x3): each tile's
inputs gathered and transformed in one pass over the images, each filter transformed in one pass over the
weights, and each tile's outputs transformed back with the bias, Z and the activation applied row by row
while in cache. The walk over chunks and blocks, and the GEMMs, are executor.kernels.winograd.convolve's."""
import numpy as np
from numba import njit, prange

from planner import ops

from ..kernels import override, winograd
from .conv import finish_row, images
from .scalar import FASTMATH, f32
from .threads import PARALLEL


@njit(inline="always")
def _bt(d0, d1, d2, d3):
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@njit(inline="always")
def _g(g0, g1, g2):
    half = f32(0.5)
    return g0, half * (g0 + g1 + g2), half * (g0 - g1 + g2), g2


@njit(inline="always")
def _at(m0, m1, m2, m3):
    return m0 + m1 + m2, m1 - m2 - m3


@njit(inline="always")
def _load(src, row, col):
    """src[row, col], 0 off the plane (padding)."""
    if 0 <= row < src.shape[0] and 0 <= col < src.shape[1]:
        return src[row, col]
    return f32(0)


@njit(inline="always")
def _row(src, row, col):
    """B^T of a tile's row of four inputs."""
    return _bt(_load(src, row, col), _load(src, row, col + 1), _load(src, row, col + 2), _load(src, row, col + 3))


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def tiles(x, v, pad_rows, pad_cols, grid_rows, grid_cols):
    """v[4a + e, c * T + t] = (B^T d B)[a, e] for tile t of channel c of the images x (N, C, H, W), its 4x4
    inputs d from (2 row - pad_rows, 2 col - pad_cols), T = N * grid_rows * grid_cols."""
    n, c = x.shape[0], x.shape[1]
    per_image = grid_rows * grid_cols
    count = n * per_image
    for job in prange(n * c):
        i, ch = job // c, job % c
        src = x[i, ch]
        for tr in range(grid_rows):
            row = 2 * tr - pad_rows
            base = ch * count + i * per_image + tr * grid_cols
            for tc in range(grid_cols):
                col = 2 * tc - pad_cols
                h0, h1 = _row(src, row, col), _row(src, row + 1, col)
                h2, h3 = _row(src, row + 2, col), _row(src, row + 3, col)
                at = base + tc
                for e in range(4):
                    r = _bt(h0[e], h1[e], h2[e], h3[e])
                    v[e, at], v[4 + e, at], v[8 + e, at], v[12 + e, at] = r


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def weights(w, u):
    """u[4a + e, o * C + i] = (G g G^T)[a, e] for the filter g = w[o, i] (M, C, 3, 3)."""
    m, c = w.shape[0], w.shape[1]
    for o in prange(m):
        for i in range(c):
            g = w[o, i]
            c0, c1, c2 = _g(g[0, 0], g[1, 0], g[2, 0]), _g(g[0, 1], g[1, 1], g[2, 1]), _g(g[0, 2], g[1, 2], g[2, 2])
            at = o * c + i
            for a in range(4):
                u[4 * a, at], u[4 * a + 1, at], u[4 * a + 2, at], u[4 * a + 3, at] = _g(c0[a], c1[a], c2[a])


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def outputs(p, y, bias, z, code, p0, p1, grid_rows, grid_cols):
    """y (N, M, OH, OW) = activation(A^T m A + bias + z) for each tile's products m = p[:, o * T + t], each
    pair of output rows finished once its tiles are written."""
    n, m, height, width = y.shape
    per_image = grid_rows * grid_cols
    count = n * per_image
    for job in prange(n * m):
        i, o = job // m, job % m
        out = y[i, o]
        b = bias[o] if bias.shape[0] else f32(0)
        for tr in range(grid_rows):
            row = 2 * tr
            base = o * count + i * per_image + tr * grid_cols
            for tc in range(grid_cols):
                at, col = base + tc, 2 * tc
                q0 = _at(p[0, at], p[4, at], p[8, at], p[12, at])
                q1 = _at(p[1, at], p[5, at], p[9, at], p[13, at])
                q2 = _at(p[2, at], p[6, at], p[10, at], p[14, at])
                q3 = _at(p[3, at], p[7, at], p[11, at], p[15, at])
                top, bottom = _at(q0[0], q1[0], q2[0], q3[0]), _at(q0[1], q1[1], q2[1], q3[1])
                out[row, col] = top[0]
                if col + 1 < width:
                    out[row, col + 1] = top[1]
                if row + 1 < height:
                    out[row + 1, col] = bottom[0]
                    if col + 1 < width:
                        out[row + 1, col + 1] = bottom[1]
            for r in range(row, min(row + 2, height)):
                finish_row(out[r], b, z[i, o, r] if z.shape[3] else z[0, 0, 0], code, p0, p1)


@njit(inline="always")
def _bt6(d0, d1, d2, d3, d4, d5):
    """F(4x4, 3x3)'s B^T of six inputs, in 12 additions and 5 multiplications."""
    t0, t1, t2, t3 = d4 - f32(4) * d2, d3 - f32(4) * d1, d4 - d2, f32(2) * (d3 - d1)
    return f32(4) * d0 - f32(5) * d2 + d4, t0 + t1, t0 - t1, t2 + t3, t2 - t3, f32(4) * d1 - f32(5) * d3 + d5


@njit(inline="always")
def _g6(g0, g1, g2):
    """F(4x4, 3x3)'s G of a filter's column of three."""
    sixth, outer, inner = f32(1 / 6), f32(1 / 24) * g0 + f32(1 / 6) * g2, f32(1 / 12) * g1
    return f32(0.25) * g0, -sixth * (g0 + g1 + g2), -sixth * (g0 - g1 + g2), outer + inner, outer - inner, g2


@njit(inline="always")
def _at6(m0, m1, m2, m3, m4, m5):
    """F(4x4, 3x3)'s A^T of six products."""
    a, b, c, d = m1 + m2, m1 - m2, m3 + m4, m3 - m4
    return m0 + a + c, b + f32(2) * d, a + f32(4) * c, b + f32(8) * d + m5


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def tiles4(x, v, pad_rows, pad_cols, grid_rows, grid_cols):
    """v[6a + e, c * T + t] = (B^T d B)[a, e] of F(4x4, 3x3) for tile t of channel c of the images x, its 6x6
    inputs d from (4 row - pad_rows, 4 col - pad_cols), T = N * grid_rows * grid_cols: row of tiles by row
    of tiles (_tile_row4)."""
    n, c, height, width = x.shape
    per_image = grid_rows * grid_cols
    for job in prange(n * c):
        i, ch = job // c, job % c
        line, phases = np.zeros((6, 4 * grid_cols + 4), np.float32), np.empty((6, 4, grid_cols + 1), np.float32)
        zero = np.zeros(width, np.float32)
        for tr in range(grid_rows):
            at = (ch * n + i) * per_image + tr * grid_cols
            _tile_row4(x[i, ch], 4 * tr - pad_rows, pad_cols, line, phases, zero, v[:, at:at + grid_cols])


@njit(inline="always", fastmath=FASTMATH)
def _tile_row4(src, row, pad_cols, line, phases, zero, v):
    """v[6a + e, t] = (B^T d B)[a, e] for the row of tiles whose inputs start at row `row` of src, in loops
    the compiler vectorizes (each indexes arrays sliced to start at 0): B^T over the six input rows, column
    by column, into `line` (zeros left where the columns are padding); those columns split by their place in
    a tile (column 4t + k to phases[:, k, t]); B^T over each tile's six columns, tile by tile."""
    inside, count = min(src.shape[1], line.shape[1] - pad_cols), v.shape[1]
    r0, r1, r2 = _row_or(src, row, zero), _row_or(src, row + 1, zero), _row_or(src, row + 2, zero)
    r3, r4, r5 = _row_or(src, row + 3, zero), _row_or(src, row + 4, zero), _row_or(src, row + 5, zero)
    at = slice(pad_cols, pad_cols + inside)
    l0, l1, l2, l3, l4, l5 = line[0, at], line[1, at], line[2, at], line[3, at], line[4, at], line[5, at]
    for s in range(inside):
        l0[s], l1[s], l2[s], l3[s], l4[s], l5[s] = _bt6(r0[s], r1[s], r2[s], r3[s], r4[s], r5[s])
    for a in range(6):
        la, q0, q1, q2, q3 = line[a], phases[a, 0], phases[a, 1], phases[a, 2], phases[a, 3]
        for t in range(count + 1):
            q0[t], q1[t], q2[t], q3[t] = la[4 * t], la[4 * t + 1], la[4 * t + 2], la[4 * t + 3]
        v0, v1, v2, v3, v4, v5 = v[6 * a], v[6 * a + 1], v[6 * a + 2], v[6 * a + 3], v[6 * a + 4], v[6 * a + 5]
        for t in range(count):
            v0[t], v1[t], v2[t], v3[t], v4[t], v5[t] = _bt6(q0[t], q1[t], q2[t], q3[t], q0[t + 1], q1[t + 1])


@njit(inline="always")
def _row_or(src, row, zero):
    """src[row], or the row of zeros where row lies on the padding."""
    return src[row] if 0 <= row < src.shape[0] else zero


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def weights4(w, u):
    """u[6a + e, o * C + i] = (G g G^T)[a, e] of F(4x4, 3x3) for the filter g = w[o, i] (M, C, 3, 3)."""
    m, c = w.shape[0], w.shape[1]
    for o in prange(m):
        for i in range(c):
            g = w[o, i]
            c0, c1, c2 = _g6(g[0, 0], g[1, 0], g[2, 0]), _g6(g[0, 1], g[1, 1], g[2, 1]), _g6(g[0, 2], g[1, 2], g[2, 2])
            at = o * c + i
            for a in range(6):
                r = _g6(c0[a], c1[a], c2[a])
                for e in range(6):
                    u[6 * a + e, at] = r[e]


@njit(parallel=PARALLEL, fastmath=FASTMATH, cache=True)
def outputs4(p, y, bias, z, code, p0, p1, grid_rows, grid_cols):
    """y (N, M, OH, OW) = activation(A^T m A + bias + z) of F(4x4, 3x3) for each tile's products
    m = p[:, o * T + t]: per row of tiles, the row transform over the row of tiles at once, then each output
    row's column transform, and the row finished while in cache."""
    n, m, height, width = y.shape
    per_image = grid_rows * grid_cols
    count = n * per_image
    for job in prange(n * m):
        i, o = job // m, job % m
        out = y[i, o]
        b = bias[o] if bias.shape[0] else f32(0)
        q = np.empty((4, 6, grid_cols), np.float32)
        for tr in range(grid_rows):
            row, base = 4 * tr, o * count + i * per_image + tr * grid_cols
            for e in range(6):
                for t in range(grid_cols):
                    at = base + t
                    q[0, e, t], q[1, e, t], q[2, e, t], q[3, e, t] = _at6(
                        p[e, at], p[6 + e, at], p[12 + e, at], p[18 + e, at], p[24 + e, at], p[30 + e, at])
            for r in range(min(4, height - row)):
                line, h = out[row + r], q[r]
                for t in range(grid_cols):
                    col, values = 4 * t, _at6(h[0, t], h[1, t], h[2, t], h[3, t], h[4, t], h[5, t])
                    if col + 4 <= width:
                        line[col], line[col + 1], line[col + 2], line[col + 3] = values
                    else:
                        for k in range(width - col):
                            line[col + k] = values[k]
                finish_row(line, b, z[i, o, row + r] if z.shape[3] else z[0, 0, 0], code, p0, p1)


class Stages:
    """winograd.convolve's stages by the compiled passes of F(tile x tile, 3x3)."""

    def __init__(self, epilogue, tile):
        self.epilogue = epilogue
        self.transform = {2: (tiles, weights, outputs), 4: (tiles4, weights4, outputs4)}[tile]

    def tiles(self, x, ws, grid, pads):
        self.transform[0](x, ws["tiles"], pads[0], pads[1], *grid)

    def weights(self, w, ws):
        self.transform[1](w, ws["weights"])

    def outputs(self, ws, y, grid, at):
        bias, z, *rest = self.epilogue
        self.transform[2](ws["products"], y, bias, z[at] if z.size else z, *rest, *grid)


@override("jit", "WinogradConv", domain="memplan")
def winograd_conv(generic):
    """The WinogradConv kernel for 2-D float32 images of C layout; `generic` for the rest."""
    def body(xp, step, ins, outs, ws, epilogue):
        winograd.convolve(xp, step, ins, outs, ws, Stages(epilogue, ops.of(step).attr(step, "tile")))
    return images(generic, body)
