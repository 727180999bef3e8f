"""Check that `frozen` and `trainable` name params of the model, on the graph as the model reads it: before
the rewrites, which may leave an initializer unread (a causal mask once attention is fused)."""
from .. import training
from .base import PRUNED, TYPED, Pass, Property, Result


def check_names(frozen=(), trainable=()):
    """The Pass checking that `frozen` and `trainable` name params of the graph."""
    def apply(graph, context):
        training.check_names(graph, frozen, trainable)
        return Result(graph, False)

    def named(graph, facts):
        return {*frozen, *trainable} <= {t.name for t in graph.params()} and not set(frozen) & set(trainable)
    return Pass("check_names", apply, needs=frozenset({TYPED}), keeps=frozenset({TYPED, PRUNED}),
                ensures=frozenset({Property("whose params frozen and trainable name apart", named)}))
