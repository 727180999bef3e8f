"""The loss (planner.losses): a scalar "loss" on a model output becomes the graph's one output, and
the labels or targets a new input. Facts: "loss", "labels", "criterion"."""
from dataclasses import replace

from .. import losses
from .base import LOSS, TYPED, Pass, Result


def loss(kind="cross_entropy", output=None, class_axis=None, ignore_index=losses.IGNORE_INDEX):
    """The Pass adding the loss `kind` on `output` (default the first), see planner.losses.criterion."""
    def apply(graph, context):
        spec = losses.criterion(graph, kind, output, class_axis, ignore_index)
        graph, labels = losses.append(graph, spec)
        return Result(replace(graph, outputs=("loss",)), True, {"loss": "loss", "labels": labels, "criterion": spec})
    return Pass("loss", apply, needs=frozenset({TYPED}), makes=frozenset({LOSS}), keeps=frozenset({TYPED}))
