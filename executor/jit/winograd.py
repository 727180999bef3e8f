"""memplan.WinogradConv's transforms compiled, for float32: each tile's 16 inputs gathered and transformed in
one pass over the images, each filter transformed in one pass over the weights, and each tile's 2x2 outputs
transformed back with the bias, Z and the activation applied row by row while in cache. The walk over
chunks and blocks, and the 16 GEMMs, are executor.kernels.winograd.convolve's."""
from numba import njit, prange

from ..kernels import winograd
from .conv import finish_row, images
from .scalar import f32
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


@njit(parallel=PARALLEL, fastmath=True, cache=True)
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


@njit(parallel=PARALLEL, fastmath=True, cache=True)
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


@njit(parallel=PARALLEL, fastmath=True, cache=True)
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


class Stages:
    """winograd.convolve's stages by the compiled passes."""

    def __init__(self, epilogue):
        self.epilogue = epilogue

    def tiles(self, x, ws, grid, pads):
        tiles(x, ws["tiles"], pads[0], pads[1], *grid)

    def weights(self, w, ws):
        weights(w, ws["weights"])

    def outputs(self, ws, y, grid, at):
        bias, z, *rest = self.epilogue
        outputs(ws["products"], y, bias, z[at] if z.size else z, *rest, *grid)


def winograd_conv(generic):
    """The WinogradConv kernel for 2-D float32 images of C layout; `generic` for the rest."""
    def body(xp, step, ins, outs, ws, epilogue):
        winograd.convolve(xp, step, ins, outs, ws, Stages(epilogue))
    return images(generic, body)
