"""Compute the 3x3 convolutions of an inference plan by Winograd's F(2x2, 3x3) or, on LARGE outputs,
F(4x4, 3x3) (memplan.WinogradConv, see planner/ops/winograd.py): a Conv or com.microsoft FusedConv of
float32 with a 3x3 kernel, stride and dilation 1, one group and at least MIN_CHANNELS channels in and out.
Its scratch (the Tiling's images and block, recorded as attributes) fits in the columns its im2col would
take or in the slot all scratch shares (planner.workspace.room): the arena does not grow. F(2x2) does 2.25x
fewer multiply-adds than im2col: on the 2-core CPU box resnet50's 3x3 stride-1 layers took 30 to 45% less
time at batch 8 (the same at batch 1); F(4x4) 4x fewer (see LARGE). Plans for a CUDA device keep their
convolutions (the GPU's are the library's to choose); CompileOptions(winograd=False) keeps them everywhere."""
import math

import numpy as np

from .. import ops
from ..ops.winograd import tiling
from ..workspace import infos, room
from .base import conv_pass

MIN_CHANNELS = 16
"""Fewer channels make GEMMs too thin for the saved products to pay for the transforms."""
LARGE = 28
"""Outputs at least this many pixels high and wide take F(4x4, 3x3), smaller ones F(2x2, 3x3): on the 2-core
CPU box, in resnet50 at batch 8, F(4x4) took its 56x56 layers 8% less time and its 28x28 ones 20% less,
but its 14x14 ones 10% more (rows of 4 tiles leave its transforms' loops too short to pay)."""


def _prepare(graph, config):
    """`choose` for conv_pass: a WinogradConv with the Tiling whose scratch fits in the larger of the conv's
    im2col columns and the slot all scratch shares."""
    limit, held = config.workspace_limit, room(graph, config)

    def choose(node, x, w, y):
        attrs = node.attrs
        if len(w.shape) != 4 or tuple(w.shape[2:]) != (3, 3) or attrs.get("group", 1) != 1 \
                or x.dtype != np.float32 or min(w.shape[:2]) < MIN_CHANNELS or not math.prod(y.shape) \
                or any(v != 1 for v in (*(attrs.get("strides") or ()), *(attrs.get("dilations") or ()))):
            return None
        columns = ops.of(node, graph.opsets).workspace(node, *infos(graph, node), limit).nbytes
        tile = 4 if min(y.shape[2:]) >= LARGE else 2
        found = tiling(x.shape[0], w.shape[1], w.shape[0], y.shape[2:], x.dtype, min(limit, max(columns, held)),
                       tile=tile)
        return found and ("WinogradConv", {"images": found.images, "block": found.block, "tile": tile})
    return choose


winograd = conv_pass("winograd", _prepare)
