"""The loss (planner.losses): a scalar "loss" on a model output becomes the graph's one output, and
the labels or targets a new input. Facts: "loss", "labels", "criterion"."""
from dataclasses import replace

from .. import losses
from .base import LOSS, TYPED, Pass, Result


def _loss(graph, context):
    options = context.options
    spec = losses.criterion(graph, options.loss or "cross_entropy", options.loss_output, options.class_axis,
                            options.ignore_index)
    graph, labels = losses.append(graph, spec)
    return Result(replace(graph, outputs=("loss",)), True, {"loss": "loss", "labels": labels, "criterion": spec})


loss = Pass("loss", _loss, needs=frozenset({TYPED}), makes=frozenset({LOSS}), keeps=frozenset({TYPED}))
