"""MXNet's mirror (MXNET_BACKWARD_DO_MIRROR): the outputs of cheap ops are not kept for backward but
recomputed from their inputs, so that only the expensive ops' outputs (convolutions, matrix
products) stay alive between the forward pass and the backward one."""
from .. import ops
from .recompute import droppable


def need_mirror(node, opsets, enabled=True):
    """REFERENCE.md §2: never random ops; yes when forced; otherwise, when mirroring is on, every op
    but the expensive ones, whose schemas say `mirror = False` (MXNet's list: Convolution,
    FullyConnected, Concat, SoftmaxOutput, in ONNX terms Conv, ConvTranspose, Gemm, MatMul, Einsum,
    Concat, SoftmaxCrossEntropyLoss). `opsets`: the graph's, which select the op's schema."""
    schema = ops.of(node, opsets)
    if schema.random:
        return False
    return node.notes.force_mirroring or enabled and schema.mirror


DEPTH = 4
"""The longest chain of recomputations one recomputed tensor may need. Without a bound, a residual
network's identity shortcuts chain every block's Add and Relu to the first block: recomputing the
last block would recompute them all, at the start of backward, and keep them to the end."""


def mirror(graph, enabled=True, depth=DEPTH):
    """The tensors to recompute: the droppable outputs of the forward nodes that need mirroring (with
    `enabled=False`, only those annotated `force_mirroring`), except where recomputing one would take
    a chain of more than `depth` recomputations; there the output is kept, which ends the chain."""
    candidates = droppable(graph)
    chain, drop = {}, set()
    for node in (n for n in graph.nodes if n.notes.forward):
        length = 1 + max((chain.get(i, 0) for i in node.inputs), default=0)
        if need_mirror(node, graph.opsets, enabled) and (length <= depth or node.notes.force_mirroring):
            for o in node.outputs:
                if o in candidates:
                    drop.add(o)
                    chain[o] = length
    return drop
