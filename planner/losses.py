"""Losses appended to a model output, as nodes of ops the planner knows (so autodiff differentiates
them like the rest): a scalar `loss` tensor and the new graph input holding the labels or targets."""
from dataclasses import replace

import numpy as np

from . import shapes
from .autodiff import Builder
from .errors import ModelError
from .ir import Tensor

LOSSES = ("cross_entropy", "mse")


def append_loss(graph, kind, output=None):
    """The typed graph with the loss added as its first output named "loss", and the name of the
    input it adds: "labels" (int64 class indices, the output's shape without its class dim 1) for
    cross_entropy (one fused SoftmaxCrossEntropyLoss), "targets" (the output's shape and dtype) for
    mse. Both average over the batch (and the positions)."""
    if kind not in LOSSES:
        raise ModelError(f"unknown loss {kind!r}; choose one of {', '.join(LOSSES)}")
    output = output or graph.outputs[0]
    if output not in graph.tensors:
        raise ModelError(f"loss_output {output!r} is not a tensor of the model")
    out = graph.tensors[output]
    b = Builder(graph, prefix="loss", phase=None)
    if kind == "cross_entropy":
        if len(out.shape) < 2:
            raise ModelError(f"cross_entropy needs (batch, classes, ...) logits; {output!r} is {out.shape}")
        name = _input(b, graph, "labels", (out.shape[0], *out.shape[2:]), np.dtype(np.int64))
        total = b.op("SoftmaxCrossEntropyLoss", output, name, reduction="mean")
    else:
        name = _input(b, graph, "targets", out.shape, out.dtype)
        diff = b.op("Sub", output, name)
        total = b.op("ReduceMean", b.op("Mul", diff, diff), keepdims=0)
    b.tensors["loss"] = Tensor("loss", None, None, "output")
    b.nodes.append(replace(b.nodes.pop(), outputs=("loss",)))
    del b.tensors[total]
    typed = shapes.infer(replace(graph, nodes=(*graph.nodes, *b.nodes), tensors={**graph.tensors, **b.tensors},
                                 inputs=(*graph.inputs, name), outputs=("loss", *graph.outputs)))
    return typed, name


def _input(b, graph, name, shape, dtype):
    if name in graph.tensors:
        raise ModelError(f"the model already has a tensor named {name!r}")
    b.tensors[name] = Tensor(name, shape, dtype, "input")
    return name
