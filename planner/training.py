"""One training step as a graph: training-mode semantics, the loss, its gradients, and an optimizer
node per parameter whose results the plan writes over the parameter and its state (Graph.updates).

    model -> training mode -> + loss -> + gradients -> + optimizer -> typed graph

(the passes of planner.passes.pipeline, each a function of this module, losses or autodiff).

Each parameter is updated as soon as its gradient is complete ("eager", so gradient buffers are
transient), or after the whole backward pass ("after_backward", as `loss.backward(); opt.step()`).

Which initializers train follows what PyTorch trains in the module an ONNX file was exported from: its
nn.Parameters, not the numbers of its code (`x ** 2`, `x + 1e-6`, `q * 0.125`, clamp bounds), which
torch.onnx writes as one-element initializers. An initializer stays constant when it is frozen, a
running statistic, not a float, not reached by the loss, an input that sets how its op computes (the
exponent of a Pow: `Schema.setting_inputs`), or one element read only by elementwise arithmetic and comparisons
(`Schema.numbers`). A one-element initializer that another op
reads (a Gemm bias of one output) trains, unless shape inference folded what reads it (a lone Exp).
`trainable` forces names to train. An initializer that the torch.export signature of the file lists
as a buffer does not train. Without one, the file cannot say which weight-sized initializers the exporter
folded from buffers (rotary tables, causal masks); the report warns when a torch.export signature
lists fewer nn.Parameters than train.
"""
from dataclasses import replace

import numpy as np

from . import ops, shapes
from .builder import Builder
from .dtypes import is_float
from .errors import ConfigError, ModelError
from .ir import Phase, Tensor
from .ops.base import TrainingStep
from .optimizers import OPTIMIZERS

LR, STEP = "optimizer/lr", "optimizer/step"


def choose_params(graph, frozen=(), trainable=(), loss=("loss",)):
    """The params of a graph with a "loss" that a training step updates (see the module's docstring),
    and {initializer: why it stays constant} for the others; `loss` names what the loss reads where the graph
    has none yet (its outputs, for the params a step of it would train)."""
    stats = {t for _, t in graph.updates}
    reached = _reaching(graph, loss)
    readers = {}
    for node in graph.nodes:
        schema = ops.of(node, graph.opsets)
        for slot, name in enumerate(node.inputs):
            readers.setdefault(name, []).append((schema, slot))
    params, constants = [], {}
    for t in graph.params():
        why = "frozen" if t.name in frozen else _cannot_train(t, stats, reached, graph.buffers)
        if t.name in trainable and why:
            raise ModelError(f"trainable name {t.name!r} cannot train: {why}")
        if t.name not in trainable:
            why = why or _constant_by_use(t, readers.get(t.name, ()))
        if why:
            constants[t.name] = why
        else:
            params.append(t.name)
    return params, constants


CONSTANT_KINDS = (  # how a reason below starts: what one such constant is called, what several are
    ("one element read by", "one-element number of the model's code", "one-element numbers of the model's code"),
    ("the exponent of a Pow", "Pow exponent", "Pow exponents"),
    ("frozen", "frozen", "frozen"),
    ("a running statistic", "running statistic", "running statistics"),
    ("a buffer of the exported module", "module buffer", "module buffers"),
    ("the loss does not depend", "not reached by the loss", "not reached by the loss"),
)


def constant_kind(why):
    """(singular, plural) names of the kind of constant a reason of `choose_params` gives, for reports."""
    return next(((one, many) for start, one, many in CONSTANT_KINDS if why.startswith(start)), (why, why))


def _cannot_train(t, stats, reached, buffers):
    """Why the param `t` cannot train at all; None when it can."""
    if t.name in stats:
        return "a running statistic, which the forward pass updates"
    if t.name in buffers:
        return "a buffer of the exported module, not an nn.Parameter (as the export says)"
    if not is_float(t.dtype):
        return f"{t.dtype} values, not floats"
    if t.name not in reached:
        return "the loss does not depend on it"
    return None


def _constant_by_use(t, uses):
    """Why the float param `t`, read at `uses` ((schema, input index) pairs), is a constant of the model's
    code rather than a weight; None for a weight."""
    for schema, slot in uses:
        if slot in schema.setting_inputs:
            return schema.setting_inputs[slot]
    if t.size == 1 and all(schema.numbers for schema, _ in uses):
        return (f"one element read by {', '.join(sorted({schema.op for schema, _ in uses}))}: a number of the "
                "model's code (a scale, an epsilon, a bound)")
    return None


def check_names(graph, frozen, trainable):
    """frozen and trainable name params of the model, and no name is both."""
    names = {t.name for t in graph.params()}
    for what, given in (("frozen", frozen), ("trainable", trainable)):
        unknown = sorted(set(given) - names)
        if unknown:
            raise ModelError(f"{what} names {', '.join(map(repr, unknown))}, which are not params of the model "
                             "(initializers that it reads)")
    both = sorted(set(frozen) & set(trainable))
    if both:
        raise ConfigError(f"{', '.join(map(repr, both))} named both trainable and frozen; name each in one")


def training_mode(graph):
    """Each node in the form a training step runs it, as its schema's `training_form` makes it: BatchNormalization
    with batch statistics, its running mean and variance written back into their params; Dropout drawing its mask
    (kept for backward); fused attention keeping its rows' log-sum-exp and drawing its dropout by the step. A model
    exported in training mode keeps its own outputs for these."""
    nodes, tensors, updates = [], dict(graph.tensors), list(graph.updates)
    for k, node in enumerate(graph.nodes):
        form = ops.of(node, graph.opsets).training_form
        nodes.append(node if form is None else form(node, TrainingStep(graph, tensors, updates, STEP, k)))
    tensors[STEP] = Tensor(STEP, (), np.dtype(np.float64), "input")
    inputs = graph.inputs if STEP in graph.inputs else (*graph.inputs, STEP)
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors, updates=tuple(updates), inputs=inputs),
                         graph)


def append_optimizer(graph, grads, optimizer, args, update="eager", inplace_update=True):
    """The typed graph with one optimizer node per parameter ({param: gradient} `grads`), reading the
    hyperparameter inputs, the parameter, its gradient and its state, placed in the file right after
    the last node it must follow (eager) or at the end; with `inplace_update=False`
    (MEGENGINE_INPLACE_UPDATE=0) each new param is a tensor of its own, copied over the param at the end
    of the step by an Assign (memplan.Assign), which costs a copy of the params."""
    op, _, state_names = OPTIMIZERS[optimizer]
    b = Builder(graph, prefix="optimizer", phase=Phase.OPTIMIZER)
    scalars = [LR, STEP] if op == "Adam" else [LR]
    b.tensors[LR] = Tensor(LR, (), np.dtype(np.float64), "input")
    attrs = _attributes(optimizer, args)
    updates, fresh = [], []
    for param, grad in grads.items():
        p = graph.tensors[param]
        state = [f"{param}/{s}" for s in state_names]
        for s in state:
            b.tensors[s] = Tensor(s, p.shape, p.dtype, "state")
        outs = b.op(op, *scalars, param, grad, *state, outputs=1 + len(state), domain="memplan", **attrs)
        outs = (outs,) if isinstance(outs, str) else outs
        updates += zip(outs[1:], state)
        if inplace_update:
            updates.append((outs[0], param))
        else:
            fresh.append((outs[0], param))
    steps = list(b.nodes)
    for new, param in fresh:
        updates.append((b.op("Assign", new, domain="memplan"), param))
    b.nodes[len(steps):] = [replace(n, notes=replace(n.notes, assign=True)) for n in b.nodes[len(steps):]]
    nodes = list(graph.nodes)
    if update == "eager":
        nodes = _interleave(nodes, steps, {n.name: n.inputs[len(scalars)] for n in steps})
    else:
        nodes += steps
    nodes += b.nodes[len(steps):]
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors={**graph.tensors, **b.tensors},
                                 inputs=(*graph.inputs, LR), updates=(*graph.updates, *updates)), graph)


def _attributes(optimizer, args):
    if OPTIMIZERS[optimizer][0] == "SGD":
        return {"momentum": float(args.get("momentum", 0.0)), "weight_decay": float(args["weight_decay"]),
                "nesterov": int(bool(args.get("nesterov", False)))}
    beta1, beta2 = args["betas"]
    return {"beta1": float(beta1), "beta2": float(beta2), "epsilon": float(args["eps"]),
            "weight_decay": float(args["weight_decay"]), "decoupled": int(optimizer == "adamw")}


def _interleave(nodes, steps, param_of):
    """`nodes` with each optimizer step inserted after the last node that reads its parameter or writes
    its gradient, so the file's own order already updates every parameter as early as it may."""
    index = {}
    for k, node in enumerate(nodes):
        for name in (*node.inputs, *node.outputs):
            index[name] = k
    after = {}
    for step in steps:
        grad = step.inputs[step.inputs.index(param_of[step.name]) + 1]
        after.setdefault(max(index.get(param_of[step.name], -1), index.get(grad, -1)), []).append(step)
    return [*after.get(-1, []), *(n for k, node in enumerate(nodes) for n in (node, *after.get(k, [])))]


def _reaching(graph, targets):
    """The tensors the `targets` depend on (themselves included)."""
    found = set(targets)
    for node in reversed(graph.nodes):
        if found.intersection(node.outputs):
            found.update(i for i in node.inputs if i)
    return found
