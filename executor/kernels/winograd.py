"""memplan.WinogradConv (planner/ops/winograd.py) over NumPy or CuPy arrays. Per chunk of images: the
(m+2)^2 inputs of each tile gathered into `products` (zeros where a tile lies on padding), transformed into
`tiles` by one GEMM with B^T (x) B^T; per block of output channels, the filters transformed into `weights`
by one GEMM with G (x) G, and the (m+2)^2 GEMMs of the block into `products`; the products transformed back
into `tiles` by one GEMM with A^T (x) A^T and scattered into Y's m x m tiles; then FusedConv's epilogue.

The transforms mix each tile's inputs (and each filter's taps): a NaN or an infinity would make NaN of every
output of its tile, where the convolution has it in the outputs whose window holds it alone, and a huge value
would round its neighbours' outputs by its own size. A chunk of images holding one (past HUGE), or weights
holding one (past WEIGHTS), is convolved directly instead, tap by tap in the same scratch."""
from functools import cache

import numpy as np

from planner import ops
from planner.ops.into import matmul

from . import kernel
from .nn import epilogue, span

HUGE = 2.0 ** 16
"""The largest magnitude of an image the transforms take: no network that runs in float16 (whose largest value is
65504) meets more, and past it a value's rounding in its tile's transforms would drown its neighbours' outputs."""
WEIGHTS = 2.0 ** 64
"""The largest magnitude of a weight the transforms take: their products stay far inside float32's range."""

TRANSFORMS = {
    2: ([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        [[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]],
        [[1, 1, 1, 0], [0, 1, -1, -1]]),
    4: ([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
         [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
         [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
}
"""F(m x m, 3x3)'s input, filter and output transforms by m: V = B^T d B, U = G g G^T, Y = A^T M A (the
interpolation points 0, 1, -1 and for m = 4 also 2, -2, as Lavin & Gray's)."""


@cache
def transforms(xp, dtype, tile):
    """(B^T (x) B^T, G (x) G, A^T (x) A^T) of F(tile x tile, 3x3) in `dtype` on xp's device, made once per
    process: the 2-D transforms of a flattened tile, (P, P), (P, 9) and (tile^2, P) for P = (tile + 2)^2."""
    return tuple(xp.asarray(np.kron(t, t), dtype=dtype) for t in map(np.array, TRANSFORMS[tile]))


def planes(scratch, rows, cols):
    """The front (rows, cols) of each plane of a scratch slice, as one (planes, rows, cols) view."""
    return scratch[:, :rows * cols].reshape(scratch.shape[0], rows, cols)


@kernel("WinogradConv", domain="memplan")
def winograd_conv(xp, step, ins, outs, ws):
    """Y = activation(conv(X, W) + B + Z) by the stages the module says."""
    convolve(xp, step, ins, outs, ws, Stages(xp, step, ins))


class Stages:
    """The transforms of `convolve` in NumPy's or CuPy's calls: each a GEMM with a Kronecker product of
    the 1-D transforms, over planes of the scratch."""

    def __init__(self, xp, step, ins):
        x, _, b, z = [*ins, None, None][:4]
        self.xp, self.finish, self.tile = xp, epilogue(xp, step, b, z), ops.of(step).attr(step, "tile")
        self.to_tiles, self.to_weights, self.to_outputs = transforms(xp, x.dtype, self.tile)

    def tiles(self, x, ws, grid, pads):
        """ws["tiles"]: the transformed tiles of the images x, (P, C, tiles); `products` as scratch."""
        c, cols = x.shape[1], x.shape[0] * grid[0] * grid[1]
        gather(self.xp, x, planes(ws["products"], c, cols), grid, pads, self.tile)
        matmul(self.xp, self.to_tiles, ws["products"][:, :c * cols], ws["tiles"][:, :c * cols])

    def weights(self, w, ws):
        """ws["weights"]: the transformed filters w (block, C, 3, 3), (P, block, C)."""
        matmul(self.xp, self.to_weights, w.reshape(-1, 9).T, ws["weights"][:, :w.shape[0] * w.shape[1]])

    def outputs(self, ws, y, grid, at):
        """Y[at] = y from the products (P, M, tiles), the epilogue included; `tiles` as scratch."""
        m, cols, count = y.shape[1], y.shape[0] * grid[0] * grid[1], self.tile ** 2
        matmul(self.xp, self.to_outputs, ws["products"][:, :m * cols], ws["tiles"][:count, :m * cols])
        scatter(self.xp, planes(ws["tiles"][:count], m, cols), y, grid, self.tile)
        self.finish(y, at)


def convolve(xp, step, ins, outs, ws, stages):
    """Per chunk of images: the tiles, then per block of output channels its weights (once for all chunks
    where one block holds every filter) and its GEMMs, then the outputs; the chunk and the block the largest
    the scratch holds."""
    x, w = ins[:2]
    y = outs[0]
    (n, c), m, tile = x.shape[:2], w.shape[0], ops.of(step).attr(step, "tile")
    grid = tuple(-(-s // tile) for s in y.shape[2:])
    per_image = grid[0] * grid[1]
    images = max(1, min(n, ws["tiles"].shape[1] // (max(c, m) * per_image)))
    block = max(1, min(m, ws["weights"].shape[1] // c))
    pads = ops.of(step).padding(step, x, y)
    weighted = transformable(xp, w, WEIGHTS)
    if block >= m and weighted:  # one block: its weights transformed once for every chunk
        stages.weights(w, ws)
    for n0 in range(0, n, images):
        n1 = min(n, n0 + images)
        cols = (n1 - n0) * per_image
        if not (weighted and transformable(xp, x[n0:n1], HUGE)):
            direct(xp, x[n0:n1], w, y[n0:n1], ws, pads)
            epilogue(xp, step, *[*ins, None, None][2:4])(y[n0:n1], (slice(n0, n1),))
            continue
        stages.tiles(x[n0:n1], ws, grid, pads)
        for m0 in range(0, m, block):
            m1 = min(m, m0 + block)
            if block < m:
                stages.weights(w[m0:m1], ws)
            matmul(xp, planes(ws["weights"], m1 - m0, c), planes(ws["tiles"], c, cols),
                   ws["products"][:, m0 * cols:m1 * cols].reshape(-1, m1 - m0, cols))
        stages.outputs(ws, y[n0:n1], grid, (slice(n0, n1),))


def transformable(xp, a, limit):
    """Whether the transforms keep the convolution's results on `a` (a chunk of images, or the weights): every
    value finite and of a magnitude below `limit` (a NaN fails the comparisons)."""
    return not a.size or -limit < float(xp.min(a)) and float(xp.max(a)) < limit


def direct(xp, x, w, y, ws, pads):
    """y = conv(x, w) of the 3x3 stride-1 window, without the transforms: per image and tap, the tap's shifted
    image (zeros on padding) in `tiles`, each block of the tap's filters after it, their GEMM in `products`,
    added into y. The products hold any output channels' rows, the tiles the image and a filter at least."""
    (c, height, width), m, out = x.shape[1:], w.shape[0], y.shape[2:]
    pixels = out[0] * out[1]
    room = ws["tiles"].reshape(-1)
    shifted = room[:c * pixels].reshape(c, *out)
    block = max(1, min(m, (room.size - c * pixels) // c))
    for image, target in zip(x, y.reshape(len(y), m, pixels)):
        target.fill(0)
        for a in range(3):
            rows = span(a - pads[0], 1, height, 0, out[0])
            for e in range(3):
                cols = span(e - pads[1], 1, width, 0, out[1])
                shifted.fill(0)
                if rows is not None and cols is not None:
                    xp.copyto(shifted[:, rows[0], cols[0]], image[:, rows[1], cols[1]])
                for m0 in range(0, m, block):
                    m1 = min(m, m0 + block)
                    taps = room[c * pixels:c * pixels + (m1 - m0) * c].reshape(m1 - m0, c)
                    product = ws["products"].reshape(-1)[:(m1 - m0) * pixels].reshape(m1 - m0, pixels)
                    xp.copyto(taps, w[m0:m1, :, a, e])
                    matmul(xp, taps, shifted.reshape(c, pixels), product)
                    xp.add(target[m0:m1], product, out=target[m0:m1])


def gather(xp, x, tiles, grid, pads, tile):
    """tiles[side a + e] (C, images, tile rows, tile cols) = the input at offset (a, e) of each input tile of
    `side` = tile + 2, whose top left lies at (tile row - pad, tile col - pad); zeros where that is padding."""
    n, c, height, width = x.shape
    side = tile + 2
    for a in range(side):
        rows = span(a - pads[0], tile, height, 0, grid[0])
        for e in range(side):
            plane = tiles[side * a + e].reshape(c, n, *grid)
            cols = span(e - pads[1], tile, width, 0, grid[1])
            if rows is None or cols is None:
                plane.fill(0)
                continue
            for gap in (slice(0, rows[0].start), slice(rows[0].stop, grid[0])):
                plane[:, :, gap].fill(0)
            for gap in (slice(0, cols[0].start), slice(cols[0].stop, grid[1])):
                plane[:, :, :, gap].fill(0)
            xp.copyto(plane[:, :, rows[0], cols[0]], x[:, :, rows[1], cols[1]].transpose(1, 0, 2, 3))


def scatter(xp, outputs, y, grid, tile):
    """Y's tile x tile tiles from outputs[tile a + e] (M, images, tile rows, tile cols), the last row and
    column of tiles cut where Y's size is no multiple of the tile."""
    n, m, height, width = y.shape
    for a in range(tile):
        for e in range(tile):
            target = y[:, :, a::tile, e::tile]
            source = outputs[tile * a + e].reshape(m, n, *grid)[:, :, :target.shape[2], :target.shape[3]]
            xp.copyto(target, source.transpose(1, 0, 2, 3))
