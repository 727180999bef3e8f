"""Gradients of the loss (planner.autodiff) for the params a training step updates
(planner.training.choose_params). Facts: "params", "constants" (why each other initializer stays),
"exported_params" (nn.Parameters a torch.export signature in the file lists, or None), "grads", and
for amp-fp16 "scaler" (planner.loss_scaling: the gradients are of the scaled loss, unscaled). With
microbatches (planner.parallel) the gradients are of one microbatch's share of the step's mean loss."""
from dataclasses import replace

import numpy as np

from .. import autodiff, loss_scaling, training
from ..errors import ModelError
from ..ir import Tensor
from .base import GRADIENTS, LOSS, TYPED, Pass, Result


def _gradients(graph, context):
    params, constants = training.choose_params(graph, context.options.frozen, context.options.trainable)
    if not params:
        raise ModelError("the model has no trainable float params that the loss depends on")
    facts = {"params": params, "constants": constants, "exported_params": graph.exported_params}
    parallel = context.options.parallel
    if context.options.precision == "amp-fp16":
        graph, grads, facts["scaler"] = loss_scaling.scaled_gradients(graph, "loss", params)
    elif parallel is not None and parallel.microbatches > 1:  # each microbatch's loss is 1/M of the step's
        t = graph.tensors["loss"]
        share = Tensor("gradients/microbatch_share", (), t.dtype, "const", np.asarray(1 / parallel.microbatches,
                                                                                     t.dtype))
        graph = replace(graph, tensors={**graph.tensors, share.name: share})
        graph, grads = autodiff.gradients(graph, "loss", params, seed=share.name)
    else:
        graph, grads = autodiff.gradients(graph, "loss", params)
    return Result(graph, True, {**facts, "grads": grads})


gradients = Pass("gradients", _gradients, needs=frozenset({TYPED, LOSS}), makes=frozenset({GRADIENTS}),
                 keeps=frozenset({TYPED, LOSS}))
