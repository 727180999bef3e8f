"""Op schemas, one per ONNX op type, registered by name.

Adding an op is one class with `@schema("OpType")` in the module of its family.
"""
import numpy as np

from ..errors import UnsupportedOpError
from .base import Info, Schema

SCHEMAS = {}


def schema(*op_types):
    """Class decorator registering one schema instance under each given ONNX op type."""
    def register(cls):
        for op in op_types:
            instance = cls()
            instance.op = op
            SCHEMAS[op] = instance
        return cls
    return register


def get(op_type):
    try:
        return SCHEMAS[op_type]
    except KeyError:
        raise UnsupportedOpError([op_type]) from None


def check_supported(op_types):
    """Raise UnsupportedOpError listing every op type (with counts) that has no schema."""
    missing = [op for op in op_types if op not in SCHEMAS]
    if missing:
        raise UnsupportedOpError(missing)


def node_flops(graph, node):
    """Floating-point operations of one run of `node` (a Node, or a Plan's Step) given `graph.tensors`
    (a typed Graph's or a Plan's), see `Schema.flops`."""
    def typed(name):
        t = graph.tensors[name]
        return tuple(t.shape), np.dtype(t.dtype)
    ins = [Info(*typed(i)) if i else None for i in node.inputs]
    outs = [typed(o) if o else None for o in node.outputs]
    return int(get(node.op).flops(node, ins, outs))


from . import elementwise, activation, nn, linalg, shape_ops, views, resize, reduce, misc, optim, loss  # noqa: E402,F401  (registration)

__all__ = ["SCHEMAS", "schema", "get", "check_supported", "node_flops", "Info", "Schema"]
