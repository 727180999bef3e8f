"""memplan.WinogradConv: a 3x3, stride-1, ungrouped 2-D FusedConv computed by Winograd's F(m x m, 3x3) (Lavin &
Gray, 2016), m (the `tile` attribute) 2 or 4, as cuDNN, oneDNN and NNPACK compute such convolutions: each
(m+2)x(m+2) tile of the input and each 3x3 filter are transformed (V = B^T d B, U = G g G^T), the (m+2)^2
transformed positions are as many GEMMs U[k] V[k] over the channels, and each tile's m x m outputs are
A^T M A, then the bias, Z and the activation. F(2x2, 3x3) does 16 products per 4 outputs, F(4x4, 3x3) 36 per
16, instead of im2col's 9 per output: 2.25x and 4x fewer multiply-adds (F(4x4)'s rounding error is about 6x
im2col's, as oneDNN's). planner/passes/winograd.py makes it from the convolutions whose scratch fits in the
columns im2col would take or in the slot all scratch shares.

Scratch, in `Tiling.layout`: `tiles` (the gathered then transformed inputs) and `products` (the GEMMs'
results, then the transformed outputs), a plane per transformed position, each of max(C, M) rows and one
column per tile of a chunk of images; `weights`, the planes of the transformed filters of a block of output
channels. Planes are padded
so that the 16 streams a transform reads or writes do not start at the same offset of a 4 KiB page (their
loads and stores would alias: the input transform ran 2.3x slower); planes of a page or less are not."""
import math
from typing import NamedTuple

import numpy as np

from .registry import schema
from .base import Layout
from .fused_conv import FusedConv
from .nn import window
from ..errors import ShapeError

TILES = (2, 4)
"""The output tiles m of the F(m x m, 3x3) the kernels compute."""
PAGE, SKEW, ALIGN = 4096, 320, 64


def plane_elements(elements, itemsize):
    """Elements of a plane holding `elements`: its bytes rounded up to ALIGN, and past PAGE to SKEW more than
    a multiple of PAGE."""
    nbytes = -(-elements * itemsize // ALIGN) * ALIGN
    if nbytes > PAGE:
        nbytes += (SKEW - nbytes) % PAGE
    return nbytes // itemsize


def planes(tile):
    """Transformed positions of F(tile x tile, 3x3)'s input tile: (tile + 2)^2."""
    return (tile + 2) ** 2


class Tiling(NamedTuple):
    """How the kernel walks a WinogradConv: `images` images per chunk, `block` output channels per GEMM, and
    the scratch `layout`."""

    images: int
    block: int
    layout: Layout


def tiling(batch, channels, filters, out_spatial, dtype, budget, images=0, block=0, tile=2):
    """The Tiling of F(tile x tile, 3x3) of `images` images a chunk and `block` output channels a GEMM where
    given (at most the batch and the filters); else the one whose scratch fits `budget` bytes with the most
    images, then the largest block (all filters, or a multiple of 16 and at least min(filters, 64)); None
    when none fits."""
    grid = tuple(-(-s // tile) for s in out_spatial)
    itemsize, tiles, count = np.dtype(dtype).itemsize, math.prod(grid), planes(tile)

    def layout(images, block):
        data = plane_elements(max(channels, filters) * tiles * images, itemsize)
        return Layout.pack(("tiles", (count, data), dtype), ("products", (count, data), dtype),
                           ("weights", (count, plane_elements(block * channels, itemsize)), dtype), align=ALIGN)

    if images and block:
        images, block = min(images, batch), min(block, filters)
        return Tiling(images, block, layout(images, block))
    least = min(filters, 64)
    for images in range(batch, 0, -1):
        for block in (filters, *range(filters - filters % 16, least - 1, -16)):
            found = layout(images, block)
            if block >= least and found.nbytes <= budget:
                return Tiling(images, block, found)
    return None


@schema("WinogradConv", domain="memplan")
class WinogradConv(FusedConv):
    """FusedConv's inputs and attributes, for a 3x3 kernel of stride and dilation 1 in one group, the output
    `tile` m of F(m x m, 3x3), and the Tiling's `images` and `block` (0: chosen from the workspace limit); its
    FLOPs are the convolution's (the model's arithmetic, whichever algorithm computes it)."""

    stat = "winograd"
    defaults = {**FusedConv.defaults, "images": 0, "block": 0, "tile": 2}

    def infer(self, node, ins):
        w = ins[1]
        if w.rank != 4 or w.shape[2:] != (3, 3) or self.attr(node, "group") != 1 or \
                any(v != 1 for v in (*(self.attr(node, "strides") or ()), *(self.attr(node, "dilations") or ()))):
            raise ShapeError(f"WinogradConv takes a 3x3 kernel of stride and dilation 1 in one group, got weights "
                             f"{w.shape}, group {self.attr(node, 'group')}, strides {self.attr(node, 'strides')}, "
                             f"dilations {self.attr(node, 'dilations')}")
        if self.attr(node, "tile") not in TILES:
            raise ShapeError(f"WinogradConv computes F(m x m, 3x3) for m in {TILES}, "
                             f"got tile {self.attr(node, 'tile')}")
        return super().infer(node, ins)

    def workspace(self, node, ins, outs, limit):
        return self.tiling(node, ins, outs, limit).layout

    def tiling(self, node, ins, outs, limit):
        """The Tiling of the attributes `images` and `block` (as planner/passes/winograd.py chose them);
        without them, the one whose scratch is no larger than the columns im2col would take under `limit`,
        or one image in one block where none is."""
        x, w = ins[0], ins[1]
        args = (x.shape[1], w.shape[0], outs[0][0][2:], x.dtype)
        images, block, tile = self.attr(node, "images"), self.attr(node, "block"), self.attr(node, "tile")
        if images and block:
            return tiling(x.shape[0], *args, None, images, block, tile)
        return tiling(x.shape[0], *args, super().workspace(node, ins[:2], outs, limit).nbytes, tile=tile) or \
            tiling(1, *args, None, 1, w.shape[0], tile)

    def padding(self, node, x, y):
        """The rows and columns of zeros before the input (auto_pad resolved)."""
        return window(self, node, x.shape[2:], (3, 3), y.shape[2:]).begin
