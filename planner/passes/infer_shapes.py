"""Shape inference: bind the inputs, give every tensor a concrete shape and dtype, fold constants."""
from .. import shapes
from .base import TYPED, Pass, Result


def _infer_shapes(graph, context):
    return Result(shapes.infer(graph, context.input_shapes, pruned=False), True)


infer_shapes = Pass("infer_shapes", _infer_shapes, makes=frozenset({TYPED}))
