"""Replace composite ops by the ops they are made of (planner.decomposition), once shapes are known."""
from ..decomposition import decomposed
from .base import TYPED, Pass, Property, Result


def _decompose(graph, context):
    result = decomposed(graph)
    return Result(result, result is not graph)


decompose = Pass("decompose", _decompose, needs=frozenset({TYPED}), makes=frozenset({TYPED}), ensures=frozenset({
    Property("without a composite op", lambda graph, facts: decomposed(graph) is graph)}))
