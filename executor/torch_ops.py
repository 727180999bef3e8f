"""The PyTorch form of each op for executor.torch_module, from its schema: `form(op_type, domain, version)` is
fn(module, node, ins) returning the node's output tensor, or a list of them, computed with torch from its input
tensors (None for an omitted one). A schema's `torch_node` takes the module too (the planned output shapes,
whether the node runs in training mode, the module's buffers); its `torch` the tensors and the attributes (with
the op's ONNX defaults)."""
import torch

from planner import ops


def form(op_type, domain="", version=None):
    """fn(module, node, ins) computing an op in PyTorch, from its schema at `version` (None: the newest); None
    when the op has no PyTorch form."""
    schema = ops.get(op_type, domain, version) if ops.known(op_type, domain) else None
    if schema is None:
        return None
    if schema.torch_node is not None:
        return lambda m, node, ins: schema.torch_node(torch, m, node, ins)
    if schema.torch is not None:
        return lambda m, node, ins: schema.torch(torch, *ins, **schema.arguments(node))
    return None
