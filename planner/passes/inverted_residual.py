"""Compute MobileNetV2's blocks of an inference plan as one op each (memplan.InvertedResidual, see
planner/ops/inverted_residual.py): a 1x1 convolution (optional), a 3x3 depthwise convolution of stride 1 or
2 and padding 1, and a 1x1 convolution, each a Conv or com.microsoft FusedConv of float32 (the last may add
Z), where each of the first two writes a tensor only the next reads. The widened tensors are then never in
the arena: mobilenet_v2's arena falls from 69.6 to 42.0 MiB at batch 8 (238.4 to 128.2 at batch 32). On the
2-core box it ran 1.3x (batch 1) to 1.6x (batch 32) faster with the compiled kernels, and with the NumPy
ones alone 1.3x (322 against 417 ms at batch 8). Not for a CUDA device; and where the arena does not grow:
every block where the plan of the rewritten graph is no larger, else each in scratch no larger than the two
tensors it drops or than the slot all scratch shares (planner.workspace.room), in smaller bands where
needed. CompileOptions(inverted_residual=False) keeps the convolutions."""
from dataclasses import replace
from functools import partial

import numpy as np

from .. import ops, shapes
from ..ir import Node
from ..ops.inverted_residual import STAGES
from ..workspace import infos, room
from .base import CONVS, TYPED, Pass, Result


def _conv(graph, node, kernel, strides, pads):
    """Whether `node` is a float32 2-D convolution of one group per output channel (kernel 3) or of one
    group (kernel 1), with that kernel, strides and padding, and dilation 1."""
    if (node.domain, node.op) not in CONVS:
        return False
    w = graph.tensors[node.inputs[1]]
    x = graph.tensors[node.inputs[0]]
    if len(w.shape) != 4 or x.dtype != np.float32 or tuple(w.shape[2:]) != (kernel, kernel):
        return False
    attrs = node.attrs
    return list(attrs.get("strides") or [1, 1]) in strides and list(attrs.get("pads") or [0] * 4) == [pads] * 4 \
        and list(attrs.get("dilations") or [1, 1]) == [1, 1] and attrs.get("auto_pad", "NOTSET") == "NOTSET" \
        and attrs.get("group", 1) == (x.shape[1] if kernel == 3 else 1) and (kernel == 1 or w.shape[0] == x.shape[1])


def _only_reader(graph, node, reader):
    """Whether `node` adds no Z and `reader` alone reads what it writes, which is no graph output or update."""
    out = node.outputs[0]
    if len(node.inputs) > 3 and node.inputs[3]:
        return False
    held = {*graph.outputs, *(new for new, _ in graph.updates)}
    return out not in held and [c.name for c in graph.consumers.get(out, ())] == [reader.name]


def _block(graph, project):
    """(widen or None, depthwise, project) where `project` ends a block, else None."""
    if not _conv(graph, project, 1, ([1, 1],), 0):
        return None
    depthwise = graph.producers.get(project.inputs[0])
    if depthwise is None or not _conv(graph, depthwise, 3, ([1, 1], [2, 2]), 1) or \
            not _only_reader(graph, depthwise, project):
        return None
    widen = graph.producers.get(depthwise.inputs[0])
    if widen is None or not _conv(graph, widen, 1, ([1, 1],), 0) or not _only_reader(graph, widen, depthwise):
        widen = None
    return widen, depthwise, project


def _fused(graph, widen, depthwise, project, budget=None):
    """The InvertedResidual node of a block, its scratch within the larger of `budget` bytes (where given) and
    the bytes of the tensors it drops; None where none fits."""
    def weights(node):
        return [*node.inputs[1:3], ""][:2] if node else ["", ""]
    z = project.inputs[3] if len(project.inputs) > 3 else ""
    first = widen or depthwise
    inputs = (first.inputs[0], *weights(widen), *weights(depthwise), *weights(project), z)
    attrs = {"strides": list(depthwise.attrs.get("strides") or [1, 1])}
    for stage, node in zip(STAGES, (widen, depthwise, project)):
        attrs[f"{stage}activation"] = node.attrs.get("activation", "") if node else ""
        attrs[f"{stage}activation_params"] = node.attrs.get("activation_params") if node else None
    node = Node("InvertedResidual", tuple(inputs), project.outputs, attrs, first.name, first.notes, "memplan")
    dropped = sum(graph.tensors[n.outputs[0]].nbytes for n in (widen, depthwise) if n)
    found = ops.of(node, graph.opsets).banding(node, *infos(graph, node), budget=budget and max(budget, dropped))
    if found is None:
        return None
    return replace(node, attrs={**attrs, "images": found.images, "rows": found.rows, "lanes": found.lanes})


def _blocks(graph):
    """The blocks of `graph`, (widen or None, depthwise, project) each, none sharing a node."""
    found, taken = [], set()
    for node in graph.nodes:
        block = _block(graph, node)
        if block and block[0] and block[0].name in taken:  # the last block's narrowing conv: this one does not widen
            block = (None, *block[1:])
        if block:
            found.append(block)
            taken.update(n.name for n in block if n)
    return found


def _rewritten(graph, blocks, budget=None):
    """`graph` with each block whose scratch fits `budget` (see _fused) one InvertedResidual, pruned; and how
    many."""
    fused = {block[2].name: (block, _fused(graph, *block, budget)) for block in blocks}
    fused = {name: (block, node) for name, (block, node) in fused.items() if node}
    dropped = {n.name for block, _ in fused.values() for n in block[:2] if n}
    nodes = tuple(fused[n.name][1] if n.name in fused else n for n in graph.nodes if n.name not in dropped)
    return shapes.prune(replace(graph, nodes=nodes)), len(fused)


def inverted_residual(config):
    """The Pass fusing the blocks, their scratch within what `config` allows."""
    return Pass("inverted_residual", partial(_apply, config=config), needs=frozenset({TYPED}), makes=frozenset({TYPED}))


def _apply(graph, context, config):
    blocks = _blocks(graph)
    if not blocks:
        return Result(graph, False)
    every, _ = _rewritten(graph, blocks)
    if context.measure is not None and \
            context.measure(every, context.facts).arena() <= context.measure(graph, context.facts).arena():
        return Result(every, True)
    fitting, count = _rewritten(graph, blocks, max(1, room(graph, config)))
    return Result(fitting, bool(count))
