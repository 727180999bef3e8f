"""memplan.InvertedResidual: MobileNetV2's block (Sandler et al., 2018) as one op, a 1x1 convolution widening C
channels to E (optional), a 3x3 depthwise convolution of stride 1 or 2 and padding 1, and a 1x1 convolution
narrowing E to P, each with its bias and activation, and Z (a residual) added before the last activation.
planner/passes/inverted_residual.py makes it from the three convolutions of an inference plan.

The kernel walks the output in jobs of `images` images by `rows` output rows, the jobs shared among `lanes`
(LANES at most), each with its scratch: the plan is the same on every machine, and the executor runs the lanes
on as many threads as it has, up to that. A job widens its input rows with one GEMM over its images, straight into the channels-last rows the
depthwise conv reads (no padded copy: the conv's edge columns skip the padding), runs the depthwise conv
every channel at once (a plane of 7x7 pixels vectorises as well as one of 112x112) and narrows the result
with one GEMM into Y. The widened tensors, E/C times the input, are never written to the arena: each job's
lives in its lane's scratch, sized to stay in a core's cache.

Scratch (`Banding.layout`): `taps` (9, E), the depthwise weights channels-last; per lane `columns` (C by the
job's input pixels) where the block widens, `widened` (the job's input rows, each holding every image's
pixels by E, rows off the image zero), `depthwise` (the job's output pixels by E, one image after another)
and `projected` (P by the job's output pixels); `product` (one image's band of outputs by E), one tap's
products for the NumPy and CuPy kernel. The kernels read a job's images and rows off the shape of `widened`
(`job_size`)."""
import math
from typing import NamedTuple

import numpy as np

from .registry import schema
from .base import Layout, Schema, elements
from .fused_conv import check_activation
from ..errors import ShapeError

STAGES = ("expand_", "depthwise_", "")
"""The prefix of each convolution's `<prefix>activation` and `<prefix>activation_params` attributes, in order:
the last is the project's, named as FusedConv names its own."""
LANES = 2
"""The most lanes a block's scratch holds: jobs that run at once, whatever the cores of the machine that plans or
runs it (the 2-core box's; each lane adds up to LANE_BYTES to the arena: mobilenet_v2's at batch 1 is 18.4 MiB
with one lane, 20.3 with two, 22.9 with four)."""
LANE_BYTES = 2 ** 21
"""A lane's scratch at most, where one row of outputs fits: a core's L2 cache on the 2-core box; mobilenet_v2
ran 4% slower with 1 MiB lanes, and no faster with 4 MiB."""
PIXELS = 256
"""Output pixels a job aims at where whole images fit (as many images as make them, at most): narrower GEMMs
ran at 75% or less of the speed of one core (a 960x160 GEMM of 49 columns: 103 GFLOP/s, of 196: 141)."""


class Banding(NamedTuple):
    """How the kernel walks an InvertedResidual: jobs of `images` images by `rows` output rows, on `lanes`
    threads, in the scratch `layout`."""

    images: int
    rows: int
    lanes: int
    layout: Layout


def banding(batch, channels, expanded, filters, in_spatial, out_spatial, stride, dtype, widens, lanes,
            images=0, rows=0, budget=None):
    """The Banding of `images` and `rows` where given; else the one whose lane scratch fits LANE_BYTES with the
    most rows (one at least); where whole images fit, the most images, at most PIXELS output pixels' worth, in
    jobs that split the batch evenly among the `lanes` (as near as it divides); where there are fewer groups
    of images than lanes, the rows split among them. Under a `budget` of bytes, a lane's scratch is halved
    until the whole fits (None where one row of one image does not). `lanes` is capped at the jobs."""
    (height, width), (out_height, out_width) = in_spatial, out_spatial
    batch = max(batch, 1)  # an empty batch, which has no job to run, is banded as one image

    def layout(images, rows, lanes):
        held = min(height, (rows - 1) * stride + 3)
        pixels, outputs = images * held * width, images * rows * out_width
        return Layout.pack(("taps", (9, expanded), dtype),
                           ("columns", (lanes, pixels * channels), dtype) if widens else None,
                           ("widened", (lanes, (rows - 1) * stride + 3, images, width, expanded), dtype),
                           ("depthwise", (lanes, images, rows * out_width * expanded), dtype),
                           ("projected", (lanes, filters * outputs), dtype),
                           ("product", (rows, out_width, expanded), dtype), align=64)

    def lane_bytes(images, rows):
        return layout(images, rows, 2).nbytes - layout(images, rows, 1).nbytes

    def jobs(images, rows):
        return -(-batch // images) * -(-out_height // rows)

    if images and rows:
        images, rows = min(images, batch), min(rows, out_height)
        lanes = max(1, min(lanes, jobs(images, rows)))
        return Banding(images, rows, lanes, layout(images, rows, lanes))
    limit = LANE_BYTES
    while True:
        rows = next((r for r in range(out_height, 0, -1) if lane_bytes(1, r) <= limit), 1)
        images, want = 1, -(-PIXELS // (out_height * out_width))
        if rows == out_height:
            images = next((n for n in (-(-batch // (lanes * k)) for k in range(1, batch + 1))
                           if n <= want and lane_bytes(n, rows) <= limit), 1)
        groups = -(-batch // images)
        if groups < lanes:
            rows = min(rows, -(-out_height // -(-lanes // groups)))
        found = banding(batch, channels, expanded, filters, in_spatial, out_spatial, stride, dtype, widens, lanes,
                        images, rows)
        if budget is None or found.layout.nbytes <= budget:
            return found
        if images == rows == 1:
            return None
        limit //= 2


def job_size(widened, stride):
    """(images, rows) of each job, read off the shape of the `widened` scratch slice."""
    return widened[2], (widened[1] - 3) // stride + 1


@schema("InvertedResidual", domain="memplan")
class InvertedResidual(Schema):
    """Inputs X (N, C, H, W); W1 (E, C, 1, 1) and B1 (E), the widening conv's, or empty names where the block
    does not widen (E = C); W2 (E, 1, 3, 3) and B2, the depthwise conv's; W3 (P, E, 1, 1) and B3, the
    narrowing conv's; Z (N, P, OH, OW), optional. Biases may be omitted. Attributes: `strides` (the depthwise
    conv's, [1, 1] or [2, 2]), each stage's activation and activation_params (as FusedConv's, see STAGES),
    and the Banding's `images`, `rows` and `lanes` (0: chosen from the block's shape, LANES at most)."""

    stat = "inverted_residual"
    defaults = {"strides": [1, 1], "images": 0, "rows": 0, "lanes": 0,
                **{f"{stage}activation": "" for stage in STAGES},
                **{f"{stage}activation_params": None for stage in STAGES}}

    def infer(self, node, ins):
        x, w1, b1, w2, b2, w3, b3, z = [*ins, *[None] * 8][:8]
        if x.rank != 4 or not np.issubdtype(x.dtype, np.floating):
            raise ShapeError(f"InvertedResidual takes float images (N, C, H, W), got {x.shape} {x.dtype}")
        if w2 is None or w3 is None:
            raise ShapeError("InvertedResidual needs the depthwise and narrowing weights W2 and W3")
        channels = x.shape[1] if w1 is None else w1.shape[0]
        self._check_weights(x, w1, w2, w3, channels)
        for name, bias, size in (("B1", b1, channels), ("B2", b2, channels), ("B3", b3, w3.shape[0])):
            if bias is not None and tuple(bias.shape) != (size,):
                raise ShapeError(f"{name} {tuple(bias.shape)} must hold one value per channel, ({size},)")
        stride = self.stride(node)
        y = (x.shape[0], w3.shape[0], *((s - 1) // stride + 1 for s in x.shape[2:]))
        if z is not None and (tuple(z.shape) != y or z.dtype != x.dtype):
            raise ShapeError(f"Z {tuple(z.shape)} {z.dtype} must have the output's shape and dtype {y} {x.dtype}")
        for stage in STAGES:
            check_activation(self.attr(node, f"{stage}activation"), self.attr(node, f"{stage}activation_params"))
        return [(y, x.dtype)]

    @staticmethod
    def _check_weights(x, w1, w2, w3, channels):
        """Raise a ShapeError unless the weights are those of a block widening x's channels to `channels`."""
        expected = [("W2", w2, (channels, 1, 3, 3)), ("W3", w3, (w3.shape[0], channels, 1, 1))]
        if w1 is not None:
            expected.insert(0, ("W1", w1, (channels, x.shape[1], 1, 1)))
        for name, w, shape in expected:
            if tuple(w.shape) != shape or w.dtype != x.dtype:
                raise ShapeError(f"{name} {tuple(w.shape)} {w.dtype} must be {shape} {x.dtype} for an input "
                                 f"{x.shape} widened to {channels} channels")

    def stride(self, node):
        """The depthwise conv's stride, 1 or 2 on both axes."""
        strides = list(self.attr(node, "strides"))
        if strides not in ([1, 1], [2, 2]):
            raise ShapeError(f"InvertedResidual's depthwise conv takes strides [1, 1] or [2, 2], got {strides}")
        return strides[0]

    def banding(self, node, ins, outs, budget=None):
        """The Banding of the attributes (as planner/passes/inverted_residual.py chose them), or the one
        `banding` chooses for LANES lanes (under `budget`) where they are 0."""
        x, w1, w3 = ins[0], ins[1], ins[5]
        expanded = x.shape[1] if w1 is None else w1.shape[0]
        return banding(x.shape[0], x.shape[1], expanded, w3.shape[0], x.shape[2:], outs[0][0][2:],
                       self.stride(node), x.dtype, w1 is not None, self.attr(node, "lanes") or LANES,
                       self.attr(node, "images"), self.attr(node, "rows"), budget)

    def workspace(self, node, ins, outs, limit):
        return self.banding(node, ins, outs).layout

    def flops(self, node, ins, outs):
        """The three convolutions' (2 per multiply-add, one per bias), one per element for Z and for each
        activation."""
        x, w1, b1, _, b2, w3, b3, z = [*ins, *[None] * 8][:8]
        y = outs[0][0]
        expanded = x.shape[1] if w1 is None else w1.shape[0]
        inner = y[0] * expanded * math.prod(y[2:])
        widened = 0 if w1 is None else x.shape[0] * expanded * math.prod(x.shape[2:])
        acts = [bool(self.attr(node, f"{stage}activation")) for stage in STAGES]
        return (widened * (2 * x.shape[1] + (b1 is not None) + acts[0]) + inner * (18 + (b2 is not None) + acts[1])
                + elements(outs) * (2 * expanded + (b3 is not None) + (z is not None) + acts[2]))
