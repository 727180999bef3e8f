"""Drop the nodes no graph output or update needs, and the tensors nothing reads or writes."""
from .. import shapes
from .base import PRUNED, TYPED, Pass, Result


def _prune(graph, context):
    pruned = shapes.prune(graph)
    return Result(pruned, len(pruned.nodes) != len(graph.nodes) or len(pruned.tensors) != len(graph.tensors))


prune = Pass("prune", _prune, makes=frozenset({PRUNED}), keeps=frozenset({TYPED}))
