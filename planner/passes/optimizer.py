"""The optimizer step (planner.training.append_optimizer): a node per param updating it and its state
in place, eagerly or after the backward pass. Facts: "optimizer", "args", "update", "lr", "step"."""
from .. import optimizers, training
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Result


def optimizer(name="sgd", args=None, update="eager", inplace=True):
    """The Pass adding the optimizer `name` with `args` over its defaults, updating each param `update`
    ("eager" or "after_backward"), in place where `inplace` (MEGENGINE_INPLACE_UPDATE)."""
    args = optimizers.optimizer_arguments(name, args or {})

    def apply(graph, context):
        when = "after_backward" if "scaler" in context.facts else update  # updates wait for the check
        graph = training.append_optimizer(graph, context.facts["grads"], name, args, when, inplace)
        return Result(graph, True, {"optimizer": name, "args": args, "update": when, "lr": training.LR,
                                    "step": training.STEP})
    return Pass("optimizer", apply, needs=frozenset({TYPED, GRADIENTS}), makes=frozenset({UPDATES}),
                keeps=frozenset({TYPED, LOSS, GRADIENTS}))
