"""memplan.BatchedConv: a FusedConv of one group whose images are small, computed as one GEMM over a chunk of
images instead of one GEMM per image. The columns of the chunk are laid out (C k..., images, pixels) so that
the weights (M, C k...) multiply all of them at once into `output` (M, images, pixels), which the epilogue
writes back into Y's (images, M, pixels) with the bias, Z and the activation. A GEMM 49 columns wide
(resnet50's last stage) runs at two thirds of the speed of one over 8 images (OpenBLAS, 2 cores).
planner/passes/batch_conv.py makes it where the scratch fits in the slot the plan already holds."""
import math

from .registry import schema
from .base import Layout
from .fused_conv import FusedConv
from ..errors import ShapeError


def batched_layout(images, channels, filters, kernel, out_spatial, dtype):
    """The scratch of a BatchedConv over `images` images: `columns` (C k..., images pixels) and `output`
    (M, images pixels)."""
    pixels = images * math.prod(out_spatial)
    return Layout.pack(("columns", (channels * math.prod(kernel), pixels), dtype), ("output", (filters, pixels), dtype),
                       align=64)


def batched_images(batch, channels, filters, kernel, out_spatial, dtype, budget):
    """The most images (at most the batch) whose BatchedConv scratch fits `budget` bytes."""
    per_image = batched_layout(1, channels, filters, kernel, out_spatial, dtype).nbytes
    return max(0, min(batch, budget // per_image)) if per_image else batch


@schema("BatchedConv", domain="memplan")
class BatchedConv(FusedConv):
    """FusedConv's inputs and attributes in one group, and `images`, the images of a chunk (0: as many as
    fit the workspace limit, at least one)."""

    stat = "batched_conv"
    defaults = {**FusedConv.defaults, "images": 0}

    def infer(self, node, ins):
        if self.attr(node, "group") != 1:
            raise ShapeError(f"BatchedConv takes one group, got group {self.attr(node, 'group')}")
        return super().infer(node, ins)

    def workspace(self, node, ins, outs, limit):
        x, w = ins[0], ins[1]
        args = (x.shape[1], w.shape[0], w.shape[2:], outs[0][0][2:], x.dtype)
        images = self.attr(node, "images") or max(1, batched_images(x.shape[0], *args, limit))
        return batched_layout(min(images, x.shape[0]), *args)
