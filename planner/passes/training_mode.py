"""Training-mode semantics (planner.training.training_mode): BatchNormalization with batch statistics
written back into its running ones, Dropout drawing its mask."""
from .. import training
from .base import PRUNED, TYPED, Pass, Result


def _training_mode(graph, context):
    return Result(training.training_mode(graph), True)


training_mode = Pass("training_mode", _training_mode, needs=frozenset({TYPED}), keeps=frozenset({TYPED, PRUNED}))
