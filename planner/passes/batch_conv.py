"""Compute the convolutions of an inference plan whose images are small as one GEMM over a chunk of images
(memplan.BatchedConv, see planner/ops/batched_conv.py): a Conv or com.microsoft FusedConv of float32 in one
group, of at most SMALL output pixels an image and LARGE weights or more, in a batch of two or more, where
the scratch of two images or more fits in the slot all scratch shares (planner.workspace.room), so that the
arena does not grow. Runs after the winograd pass, which takes the 3x3 stride-1 ones. Plans for a CUDA
device keep their convolutions; CompileOptions(batch_conv=False) keeps them everywhere."""
import math
from dataclasses import replace

import numpy as np

from ..ir import Node
from ..ops.batched_conv import batched_images
from ..workspace import room
from .base import TYPED, Pass, Result

SMALL, LARGE = 64, 1 << 19
"""Up to SMALL output pixels an image, a GEMM per image packs the weights once for few columns; where the
weights have LARGE elements or more (2 MiB of float32), that packing is much of the time and one GEMM over
the batch packs them once: resnet50's 7x7 stage ran 20% faster batched. Its 14x14 stage ran 10% slower, and
mobilenet_v2's 7x7 stage (weights of 160 x 960 elements) 20% slower: there the columns' copy and the
write-back cost more than the packing saved."""
CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}


def _rewrite(graph, node, budget):
    """The BatchedConv computing `node`, over as many images as fit `budget` bytes; None where it takes none."""
    if (node.domain, node.op) not in CONVS:
        return None
    x, w = (graph.tensors[name] for name in node.inputs[:2])
    y = graph.tensors[node.outputs[0]]
    if node.attrs.get("group", 1) != 1 or x.dtype != np.float32 or x.shape[0] < 2 \
            or not 0 < math.prod(y.shape[2:]) <= SMALL or math.prod(w.shape) < LARGE:
        return None
    images = batched_images(x.shape[0], w.shape[1], w.shape[0], w.shape[2:], y.shape[2:], x.dtype, budget)
    if images < 2:
        return None
    return Node("BatchedConv", node.inputs, node.outputs, {"activation": "", **node.attrs, "images": images},
                node.name, node.notes, "memplan")


def _apply(graph, context):
    options, config = context.options, context.config
    if not options.batch_conv or options.training or options.device.startswith("cuda"):
        return Result(graph, False)
    budget = min(config.workspace_limit, room(graph, config))
    nodes = [_rewrite(graph, node, budget) or node for node in graph.nodes]
    changed = any(a is not b for a, b in zip(nodes, graph.nodes))
    return Result(replace(graph, nodes=tuple(nodes)) if changed else graph, changed)


batch_conv = Pass("batch_conv", _apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}))
