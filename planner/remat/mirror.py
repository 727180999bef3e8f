"""MXNet's mirror (MXNET_BACKWARD_DO_MIRROR): the outputs of cheap ops are not kept for backward but
recomputed from their inputs, so that only the expensive ops' outputs (convolutions, matrix
products) stay alive between the forward pass and the backward one."""
from .recompute import droppable

NEVER = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum", "Concat", "SoftmaxCrossEntropyLoss"}
"""MXNet's list (Convolution, FullyConnected, Concat, SoftmaxOutput) in ONNX terms."""
RANDOM = {"Dropout", "memplan.Dropout"}


def forced(node):
    """Whether the node carries a true `force_mirroring` annotation (a bool, or text from ONNX metadata)."""
    return str(node.meta.get("force_mirroring", "")).lower() in ("1", "true", "yes")


def need_mirror(node, enabled=True):
    """REFERENCE.md §2: never random ops; yes when forced; otherwise, when mirroring is on, every op
    but the expensive ones."""
    if node.op in RANDOM:
        return False
    return forced(node) or enabled and node.op not in NEVER


def mirror(graph, enabled=True):
    """The tensors to recompute: the droppable outputs of the forward nodes that need mirroring
    (with `enabled=False`, only those annotated `force_mirroring`)."""
    candidates = droppable(graph)
    return {o for n in graph.nodes if "phase" not in n.meta and need_mirror(n, enabled)
            for o in n.outputs if o in candidates}
