"""The op registry: schemas by (domain, op type, first version), as ONNX versions its operators, and the
look-ups every layer uses (get, of, known). A leaf of planner.ops: the families import it to register,
it imports none of them."""
import bisect

import numpy as np

from ..errors import UnsupportedOpError
from ..ir import op_name
from .base import Info
from .refused import REASONS

SCHEMAS = {}
"""(domain, op type) -> [(since version, schema)], oldest first."""


def register(instance):
    """Register a schema instance under its `op` of its `domain`, for the opsets from its `since` on
    (until a schema of the same op with a later `since`)."""
    versions = SCHEMAS.setdefault((instance.domain, instance.op), [])
    if any(since == instance.since for since, _ in versions):
        raise ValueError(f"{op_name(instance.domain, instance.op)} since {instance.since} is registered twice")
    versions.insert(bisect.bisect([v for v, _ in versions], instance.since), (instance.since, instance))
    return instance


def schema(*op_types, domain="", since=1):
    """Class decorator registering one instance of the class under each given op type of `domain`."""
    def decorate(cls):
        for op in op_types:
            instance = cls()
            instance.op, instance.domain, instance.since = op, domain, since
            register(instance)
        return cls
    return decorate


def get(op_type, domain="", version=None):
    """The schema of `op_type` in `domain` at opset `version` (None: the newest)."""
    versions = SCHEMAS.get((domain, op_type), ())
    if len(versions) == 1 and (version is None or versions[0][0] <= version):  # most ops: one schema
        return versions[0][1]
    chosen = [s for since, s in versions if version is None or since <= version]
    if not chosen:
        raise UnsupportedOpError([op_name(domain, op_type)])
    return chosen[-1]


def of(node, opsets=None):
    """The schema of a Node at the graph's `opsets` ({domain: version}), or of a Plan's Step at the
    version it records."""
    version = opsets.get(node.domain) if opsets is not None else getattr(node, "version", None)
    return get(node.op, node.domain, version)


def known(op_type, domain=""):
    """Whether any version of the op has a schema."""
    return (domain, op_type) in SCHEMAS


def check_supported(nodes, opsets=None):
    """Raise UnsupportedOpError listing every op (with counts) of `nodes` that has no schema at `opsets`,
    with the reason of those memplan refuses by design."""
    missing = []
    for node in nodes:
        try:
            of(node, opsets)
        except UnsupportedOpError:
            missing.append(op_name(node.domain, node.op))
    if missing:
        raise UnsupportedOpError(missing, REASONS)


def node_flops(graph, node):
    """Floating-point operations of one run of `node` (a Node, or a Plan's Step) given `graph.tensors`
    (a typed Graph's or a Plan's), see `Schema.flops`."""
    def typed(name):
        t = graph.tensors[name]
        return tuple(t.shape), np.dtype(t.dtype)
    ins = [Info(*typed(i)) if i else None for i in node.inputs]
    outs = [typed(o) if o else None for o in node.outputs]
    return int(of(node, getattr(graph, "opsets", None)).flops(node, ins, outs))
