"""Losses appended to a model output, as nodes of ops the planner knows (so autodiff differentiates
them like the rest): a scalar `loss` tensor and the new graph input holding the labels or targets.

cross_entropy reads the classes along one dim of the logits, chosen in this order:
  - `class_axis` when given (negative counts from the end);
  - dim 1 of rank-2 (batch, classes) logits;
  - the last dim when the model reads integer token ids through an embedding Gather (reshaped on the
    way or not): a language model's (batch, seq, vocab) logits, labelled (batch, seq);
  - else dim 1, as ONNX's SoftmaxCrossEntropyLoss and PyTorch's cross_entropy read (N, C, d1, ...).
Labels equal to `ignore_index` (PyTorch's -100 by default; None for none) count neither in the loss
nor in its mean, so padding positions can be marked.
"""
import math
import numbers
from dataclasses import replace

import numpy as np

from . import shapes
from .builder import Builder
from .errors import ConfigError, ModelError, say
from .ir import Phase, Tensor
from .options import IGNORE_INDEX

LOSSES = ("cross_entropy", "mse")


def append_loss(graph, kind, output=None, class_axis=None, ignore_index=IGNORE_INDEX):
    """The typed graph with the loss added as its first output named "loss", and the name of the
    input it adds (see `criterion` and `append`)."""
    return append(graph, criterion(graph, kind, output, class_axis, ignore_index))


def criterion(graph, kind, output=None, class_axis=None, ignore_index=IGNORE_INDEX):
    """What the loss computes, as plain data for plan.training: {"kind", "output"}, and for
    cross_entropy the "class_axis", the "rule" that chose it and the "ignore_index"."""
    if kind not in LOSSES:
        raise ModelError(f"unknown loss {kind!r}; choose one of {', '.join(LOSSES)}")
    output = output or graph.outputs[0]
    if output not in graph.tensors:
        raise ModelError(f"loss_output {output!r} is not a tensor of the model")
    if kind == "mse":
        if class_axis is not None or ignore_index != IGNORE_INDEX:
            raise ConfigError(say("class_axis and ignore_index apply to loss='cross_entropy', not 'mse'",
                                  "--class-axis and --ignore-index apply to --loss cross_entropy, not mse"))
        return {"kind": kind, "output": output}
    shape = graph.tensors[output].shape
    if len(shape) < 2:
        raise ModelError(f"cross_entropy needs (batch, classes, ...) logits; {output!r} is {shape}")
    if ignore_index is not None and not _integer(ignore_index):
        raise ConfigError(f"{say('ignore_index', '--ignore-index')} {ignore_index!r} must be an int (a label value "
                          f"to skip) or {say('None', 'none')}")
    axis, rule = _class_axis(graph, output, class_axis)
    return {"kind": kind, "output": output, "class_axis": axis, "rule": rule,
            "ignore_index": None if ignore_index is None else int(ignore_index)}


def append(graph, spec):
    """The typed graph with `spec`'s loss as its first output "loss", and the input it adds: "labels"
    (int64, the logits' shape without the class dim) for cross_entropy (one fused
    SoftmaxCrossEntropyLoss), "targets" (the output's shape and dtype) for mse. Both average over the
    batch (and the positions)."""
    out = graph.tensors[spec["output"]]
    b = Builder(graph, prefix="loss", phase=Phase.FORWARD)
    if spec["kind"] == "cross_entropy":
        name, total = _cross_entropy(b, graph, out, spec["class_axis"], spec["ignore_index"])
    else:
        name = _input(b, graph, "targets", out.shape, out.dtype)
        diff = b.op("Sub", out.name, name)
        total = b.op("ReduceMean", b.op("Mul", diff, diff), keepdims=0)
    b.tensors["loss"] = Tensor("loss", None, None, "output")
    b.nodes.append(replace(b.nodes.pop(), outputs=("loss",)))
    del b.tensors[total]
    typed = shapes.retype(replace(graph, nodes=(*graph.nodes, *b.nodes), tensors={**graph.tensors, **b.tensors},
                                  inputs=(*graph.inputs, name), outputs=("loss", *graph.outputs)), graph)
    return typed, name


def _cross_entropy(b, graph, out, axis, ignore_index):
    """The labels input and the loss node over `out` with classes on `axis`: dim 1 as it is; the last
    dim through Reshape views to (positions, classes) and (positions,), which copy nothing; any other
    dim moved to 1 by a Transpose."""
    shape = out.shape
    rest = [k for k in range(len(shape)) if k != axis]
    labels = _input(b, graph, "labels", tuple(shape[k] for k in rest), np.dtype(np.int64))
    scores, targets = out.name, labels
    if axis == len(shape) - 1 and axis > 1:
        positions = math.prod(shape[:-1])
        scores = b.op("Reshape", scores, shape=[positions, shape[-1]])
        targets = b.op("Reshape", labels, shape=[positions])
    elif axis != 1:
        scores = b.op("Transpose", scores, perm=[rest[0], axis, *rest[1:]])
    ignore = {} if ignore_index is None else {"ignore_index": ignore_index}
    return labels, b.op("SoftmaxCrossEntropyLoss", scores, targets, reduction="mean", **ignore)


def _class_axis(graph, output, given):
    """The class dim of the logits `output` (see the module's docstring) and the rule that chose it."""
    rank = len(graph.tensors[output].shape)
    if given is not None:
        if not _integer(given) or not -rank <= given < rank:
            raise ConfigError(f"{say('class_axis', '--class-axis')} {given!r} is not a dim of the logits {output!r} of shape "
                              f"{graph.tensors[output].shape}; give an int from {-rank} to {rank - 1}")
        return int(given) % rank, "given as class_axis"
    if rank == 2:
        return 1, "(batch, classes) logits: dim 1"
    tokens = _token_inputs(graph)
    if tokens:
        return rank - 1, (f"a language model (token ids {', '.join(tokens)} feed an embedding Gather): "
                          "(batch, seq, vocab) logits, classes on the last dim")
    return 1, "(N, C, d1, ...) logits: dim 1, as ONNX's SoftmaxCrossEntropyLoss and PyTorch's cross_entropy"


RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
"""Ops that change only the shape of the ids on their way to the embedding (torch.onnx's `view`)."""


def _token_inputs(graph):
    """The integer graph inputs that index an embedding table (a Gather from a param), as they are or
    through RESHAPES."""
    found = []
    for name in graph.inputs:
        if graph.tensors[name].dtype.kind not in "iu":
            continue
        ids = {name}
        for n in graph.nodes:
            if n.op in RESHAPES and not n.domain and n.inputs[0] in ids:
                ids.add(n.outputs[0])
            elif n.op == "Gather" and n.inputs[1] in ids and graph.tensors[n.inputs[0]].kind == "param":
                found.append(name)
                break
    return found


def _integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _input(b, graph, name, shape, dtype):
    if name in graph.tensors:
        raise ModelError(f"the model already has a tensor named {name!r}")
    b.tensors[name] = Tensor(name, shape, dtype, "input")
    return name
