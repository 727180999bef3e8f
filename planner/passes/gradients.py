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


def gradients(frozen=(), trainable=(), scale_loss=False, microbatches=1):
    """The Pass adding the backward pass: gradients of the params that train (not `frozen`, and `trainable`
    whatever their use), of a scaled loss where `scale_loss` (amp-fp16), of one of `microbatches` shares."""
    def apply(graph, context):
        params, constants = training.choose_params(graph, frozen, trainable)
        if not params:
            raise ModelError("the model has no trainable float params that the loss depends on")
        facts = {"params": params, "constants": constants, "exported_params": graph.exported_params}
        if scale_loss:
            graph, grads, facts["scaler"] = loss_scaling.scaled_gradients(graph, "loss", params)
        elif microbatches > 1:  # each microbatch's loss is 1/M of the step's
            t = graph.tensors["loss"]
            share = Tensor("gradients/microbatch_share", (), t.dtype, "const", np.asarray(1 / microbatches, t.dtype))
            graph = replace(graph, tensors={**graph.tensors, share.name: share})
            graph, grads = autodiff.gradients(graph, "loss", params, seed=share.name)
        else:
            graph, grads = autodiff.gradients(graph, "loss", params)
        return Result(graph, True, {**facts, "grads": grads})
    return Pass("gradients", apply, needs=frozenset({TYPED, LOSS}), makes=frozenset({GRADIENTS}),
                keeps=frozenset({TYPED, LOSS}))
