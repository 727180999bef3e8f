"""Compute the 3x3 convolutions of an inference plan by Winograd's F(2x2, 3x3) (memplan.WinogradConv, see
planner/ops/winograd.py): a Conv or com.microsoft FusedConv of float32 with a 3x3 kernel, stride and
dilation 1, one group and at least MIN_CHANNELS channels in and out. Its scratch (the Tiling's images and
block, recorded as attributes) fits in the columns its im2col would take or in the slot all scratch shares
(planner.workspace.room): the arena does not grow. 2.25x fewer multiply-adds: on the 2-core CPU box
resnet50's 3x3 stride-1 layers took 30 to 45% less time at batch 8 (the same at batch 1). Plans for a CUDA device keep their convolutions (the GPU's are
the library's to choose); CompileOptions(winograd=False) keeps them everywhere."""
import math

import numpy as np

from .. import ops
from ..ops.winograd import tiling
from ..workspace import infos, room
from .base import conv_pass

MIN_CHANNELS = 16
"""Fewer channels make GEMMs too thin for the saved products to pay for the transforms."""


def _prepare(graph, context):
    """`choose` for conv_pass: a WinogradConv with the Tiling whose scratch fits in the larger of the conv's
    im2col columns and the slot all scratch shares."""
    limit, held = context.config.workspace_limit, room(graph, context.config)

    def choose(node, x, w, y):
        attrs = node.attrs
        if len(w.shape) != 4 or tuple(w.shape[2:]) != (3, 3) or attrs.get("group", 1) != 1 \
                or x.dtype != np.float32 or min(w.shape[:2]) < MIN_CHANNELS or not math.prod(y.shape) \
                or any(v != 1 for v in (*(attrs.get("strides") or ()), *(attrs.get("dilations") or ()))):
            return None
        columns = ops.of(node, graph.opsets).workspace(node, *infos(graph, node), limit).nbytes
        found = tiling(x.shape[0], w.shape[1], w.shape[0], y.shape[2:], x.dtype, min(limit, max(columns, held)))
        return found and ("WinogradConv", {"images": found.images, "block": found.block})
    return choose


winograd = conv_pass("winograd", _prepare)
