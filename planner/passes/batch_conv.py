"""Compute the convolutions of an inference plan whose images are small as one GEMM over a chunk of images
(memplan.BatchedConv, see planner/ops/batched_conv.py): a Conv or com.microsoft FusedConv of float32 in one
group, of at most SMALL output pixels an image and LARGE weights or more, in a batch of two or more, where
the scratch of two images or more fits in the slot all scratch shares (planner.workspace.room), so that the
arena does not grow. Runs after the winograd pass, which takes the 3x3 stride-1 ones. Plans for a CUDA
device keep their convolutions; CompileOptions(batch_conv=False) keeps them everywhere. Where MKL runs, the
compiled kernels compute a BatchedConv as the conv it was made from, in lanes (executor/jit/conv.py), which
runs the GEMM per image as fast; the plan stays the same whichever kernels run it."""
import math

import numpy as np

from ..ops.batched_conv import batched_images
from ..workspace import room
from .base import conv_pass

SMALL, LARGE = 64, 1 << 19
"""Up to SMALL output pixels an image, a GEMM per image packs the weights once for few columns; where the
weights have LARGE elements or more (2 MiB of float32), that packing is much of the time and one GEMM over
the batch packs them once: resnet50's 7x7 stage ran 20% faster batched. Its 14x14 stage ran 10% slower, and
mobilenet_v2's 7x7 stage (weights of 160 x 960 elements) 20% slower: there the columns' copy and the
write-back cost more than the packing saved."""


def _prepare(graph, config):
    """`choose` for conv_pass: a BatchedConv over as many images as fit in the slot all scratch shares."""
    budget = min(config.workspace_limit, room(graph, config))

    def choose(node, x, w, y):
        if node.attrs.get("group", 1) != 1 or x.dtype != np.float32 or x.shape[0] < 2 \
                or not 0 < math.prod(y.shape[2:]) <= SMALL or math.prod(w.shape) < LARGE:
            return None
        images = batched_images(x.shape[0], w.shape[1], w.shape[0], w.shape[2:], y.shape[2:], x.dtype, budget)
        return images >= 2 and ("BatchedConv", {"images": images})
    return choose


batch_conv = conv_pass("batch_conv", _prepare)
