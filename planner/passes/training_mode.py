"""Training-mode semantics (planner.training.training_mode): BatchNormalization with batch statistics
written back into its running ones, Dropout drawing its mask."""
from .. import ops, training
from .base import PRUNED, TYPED, Pass, Property, Result


def _training_mode(graph, context):
    return Result(training.training_mode(graph), True)


def _in_training(graph, facts):
    """Every BatchNormalization normalises by batch statistics, writing its running ones back; no Dropout of
    ONNX's domain drops anything (memplan's draws the mask)."""
    written = {new for new, _ in graph.updates}
    return all(n.attrs.get("training_mode") and set(n.outputs[1:3]) <= written
               for n in graph.nodes if n.op == "BatchNormalization") and \
        not any(n.op == "Dropout" and not n.domain and ops.get("Dropout").attr(n, "ratio") for n in graph.nodes)


training_mode = Pass("training_mode", _training_mode, needs=frozenset({TYPED}), keeps=frozenset({TYPED, PRUNED}),
                     ensures=frozenset({Property("in training mode", _in_training)}))
