"""Check that `frozen` and `trainable` name params of the model, on the graph as the model reads it: before
the rewrites, which may leave an initializer unread (a causal mask once attention is fused)."""
from .. import training
from .base import PRUNED, TYPED, Pass, Result


def _check_names(graph, context):
    training.check_names(graph, context.options.frozen, context.options.trainable)
    return Result(graph, False)


check_names = Pass("check_names", _check_names, needs=frozenset({TYPED}), keeps=frozenset({TYPED, PRUNED}))
