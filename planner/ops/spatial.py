"""Ops that move values between places of an image: DepthToSpace, SpaceToDepth, CenterCropPad, Col2Im.
Each is planned as the ops it is made of (`decompose`), so their kernels, gradients and PyTorch forms
are those of Reshape, Transpose, Pad and ConvTranspose."""
import math

import numpy as np

from .registry import register, schema
from .base import Schema, axis, no_flops
from .composite import Composite
from ..dtypes import is_float
from ..errors import ShapeError


@schema("DepthToSpace", "SpaceToDepth")
class Rearrange(Schema):
    """DepthToSpace and SpaceToDepth: blocks of blocksize x blocksize pixels moved between the channel
    dim and the spatial dims of (N, C, H, W), as a reshape to six dims, a transpose and a reshape back;
    `mode` orders a block's channels depth first (DCR) or channel first (CRD)."""

    ranks = "same"
    defaults = {"blocksize": None, "mode": "DCR"}
    flops = staticmethod(no_flops)

    def layout(self, node, shape):
        """(the six dims the input is read as, the permutation of them, the output shape)."""
        n, c, h, w = shape
        bs, crd = self.attr(node, "blocksize"), self.attr(node, "mode") == "CRD"
        if self.op == "DepthToSpace":
            depth = c // (bs * bs)
            six, perm = ((n, depth, bs, bs, h, w), (0, 1, 4, 2, 5, 3)) if crd else \
                ((n, bs, bs, depth, h, w), (0, 3, 4, 1, 5, 2))
            return six, perm, (n, depth, h * bs, w * bs)
        perm = (0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)
        return (n, c, h // bs, bs, w // bs, bs), perm, (n, c * bs * bs, h // bs, w // bs)

    def infer(self, node, ins):
        x, bs, mode = ins[0], self.attr(node, "blocksize"), self.attr(node, "mode")
        if x.rank != 4:
            raise ShapeError(f"input of shape {x.shape} is not (N, C, H, W)")
        if bs < 1:
            raise ShapeError(f"blocksize {bs} must be at least 1")
        if mode not in ("DCR", "CRD"):
            raise ShapeError(f"mode {mode!r} is not DCR or CRD")
        if self.op == "DepthToSpace" and x.shape[1] % (bs * bs):
            raise ShapeError(f"the {x.shape[1]} channels of {x.shape} do not divide into blocks of {bs}x{bs}")
        if self.op == "SpaceToDepth" and (x.shape[2] % bs or x.shape[3] % bs):
            raise ShapeError(f"height and width of {x.shape} do not divide into blocks of {bs}x{bs}")
        return [(self.layout(node, x.shape)[2], x.dtype)]

    def decompose(self, b, node):
        x = node.inputs[0]
        six, perm, out = self.layout(node, b.shape(x))
        moved = b.op("Transpose", b.op("Reshape", x, shape=list(six)), perm=list(perm))
        return [b.op("Reshape", moved, shape=list(out))]


@schema("CenterCropPad")
class CenterCropPad(Schema):
    """CenterCropPad: each of `axes` cropped or zero-padded to its size in `shape` about its centre (the
    odd element at the end): a Pad whose negative counts crop."""

    ranks = "same"
    attr_inputs = (("shape", 1, 18),)
    defaults = {"shape": None, "axes": None}
    flops = staticmethod(no_flops)

    def pads(self, node, shape):
        """Pad's counts: the begin, then the end, of every axis of an input of `shape`."""
        rank, target = len(shape), self.attr(node, "shape")
        axes = self.attr(node, "axes")
        axes = list(range(rank)) if axes is None else [axis(a, rank) for a in axes]
        if len(target) != len(axes) or len(set(axes)) != len(axes):
            raise ShapeError(f"shape {tuple(target)} must give one size for each of the distinct axes {tuple(axes)}")
        if min(target, default=0) < 0:
            raise ShapeError(f"shape {tuple(target)} has a negative size")
        begin, end = [0] * rank, [0] * rank
        for a, size in zip(axes, target):
            grow = size - shape[a]
            begin[a] = grow // 2 if grow >= 0 else -(-grow // 2)
            end[a] = grow - begin[a]
        return begin + end

    def infer(self, node, ins):
        x = ins[0]
        pads = self.pads(node, x.shape)
        return [(tuple(d + b + e for d, b, e in zip(x.shape, pads, pads[x.rank:])), x.dtype)]

    def decompose(self, b, node):
        x = node.inputs[0]
        return [b.op("Pad", x, pads=self.pads(node, b.shape(x)))]


class Col2Im(Composite):
    """Col2Im: each column of the input (C x prod(block_shape) values) added back at its block's place in
    an image of `image_shape`, overlaps summing: the inverse of the im2col a Conv does. Planned as a
    ConvTranspose with identity weights, images and channels folded into its batch."""

    arity = None
    ranks = None
    attr_inputs = (("image_shape", 1, 18), ("block_shape", 2, 18))

    def __init__(self):
        super().__init__("Col2Im", self.parts_of, {"image_shape": None, "block_shape": None, "dilations": None,
                                                    "pads": None, "strides": None})

    def window(self, node):
        """(strides, dilations, pads, blocks per spatial dim), checked against the image's dims."""
        image, block = self.attr(node, "image_shape"), self.attr(node, "block_shape")
        n = len(image)
        strides = self.attr(node, "strides") or [1] * n
        dilations = self.attr(node, "dilations") or [1] * n
        pads = self.attr(node, "pads") or [0] * 2 * n
        if (len(block), len(strides), len(dilations), len(pads)) != (n, n, n, 2 * n):
            raise ShapeError(f"block_shape {tuple(block)}, strides, dilations or pads do not match "
                             f"the {n} dims of image_shape {tuple(image)}")
        for what, values, least in (("image_shape", image, 1), ("block_shape", block, 1), ("strides", strides, 1),
                                    ("dilations", dilations, 1), ("pads", pads, 0)):
            if min(values, default=least) < least:
                raise ShapeError(f"{what} {tuple(values)} must be {'at least 1' if least else 'non-negative'}")
        grid = [(i + b + e - (k - 1) * d - 1) // s + 1
                for i, b, e, k, d, s in zip(image, pads, pads[n:], block, dilations, strides)]
        return strides, dilations, pads, grid

    def infer(self, node, ins):
        x, block = ins[0], self.attr(node, "block_shape")
        *_, grid = self.window(node)
        if x.rank != 3:
            raise ShapeError(f"input of shape {x.shape} is not (N, C x prod(block_shape), blocks)")
        if not is_float(x.dtype):
            raise ShapeError(f"Col2Im of {x.dtype} is not planned: it sums blocks by a ConvTranspose, of floats only")
        if min(grid) < 1 or x.shape[1] % math.prod(block) or x.shape[2] != math.prod(grid):
            raise ShapeError(f"input of shape {x.shape} is not (N, C x {math.prod(block)}, {math.prod(grid)}): "
                             f"blocks {tuple(block)} fit {tuple(grid)} times in the padded image")
        return [((x.shape[0], x.shape[1] // math.prod(block), *self.attr(node, "image_shape")), x.dtype)]

    def parts_of(self, b, node, x, image_shape, block_shape, **rest):
        strides, dilations, pads, grid = self.window(node)
        n, taps = b.shape(x)[0], math.prod(block_shape)
        channels = b.shape(x)[1] // taps
        folded = b.op("Reshape", x, shape=[n * channels, taps, *grid])
        identity = b.const(np.eye(taps).reshape(taps, 1, *block_shape), x)
        beyond = [(i + p + e - (k - 1) * d - 1) % s  # image positions past the last block's reach
                  for i, p, e, k, d, s in zip(image_shape, pads, pads[len(grid):], block_shape, dilations, strides)]
        y = b.op("ConvTranspose", folded, identity, strides=list(strides), dilations=list(dilations), pads=list(pads),
                 output_padding=beyond)
        return b.op("Reshape", y, shape=[n, channels, *image_shape])


register(Col2Im())
