"""The optimizer step (planner.training.append_optimizer): a node per param updating it and its state
in place, eagerly or after the backward pass. Facts: "optimizer", "args", "update", "lr", "step"."""
from .. import training
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Result


def _optimizer(graph, context):
    options, name = context.options, context.options.optimizer or "sgd"
    args = training.optimizer_arguments(name, options.optimizer_args or {})
    update = "after_backward" if "scaler" in context.facts else options.update  # updates wait for the check
    graph = training.append_optimizer(graph, context.facts["grads"], name, args, update, context.config.inplace_update)
    return Result(graph, True, {"optimizer": name, "args": args, "update": update, "lr": training.LR,
                                "step": training.STEP})


optimizer = Pass("optimizer", _optimizer, needs=frozenset({TYPED, GRADIENTS}), makes=frozenset({UPDATES}),
                 keeps=frozenset({TYPED, LOSS, GRADIENTS}))
