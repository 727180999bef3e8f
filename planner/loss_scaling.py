"""Dynamic loss scaling for float16 autocast training, as torch.amp.GradScaler does it, built of nodes:
backward starts from the scale instead of 1 (the loss scaled), the gradients are unscaled, one check
says whether all of them are finite (on the sum of their sums, `total`, which a data-parallel plan sums over
the ranks so that all of them skip a step together), and the scale and its count of finite steps are updated
in place.
When a gradient overflowed, the executor skips that training step's optimizer steps (GradScaler's
`step` skipping `optimizer.step()`) and the scale halves; after GROWTH_INTERVAL finite steps in a row
it doubles.

The scale is SCALE_INIT * 2**exponent, the exponent a zero-initialised state like the optimizer's, so
that halving and doubling are exact and the state needs no initial value."""
from dataclasses import replace

import numpy as np

from . import autodiff, shapes
from .builder import Builder
from .ir import Tensor

SCALE_INIT, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000
"""torch.amp.GradScaler's defaults (the factors are the exponent's steps of +1 and -1)."""
EXPONENT, GROWTH = "scaler/exponent", "scaler/growth"


def scaled_gradients(graph, loss, params):
    """(the typed graph computing the unscaled gradients of `loss` for `params`, the finite check and
    the scale's update; {param: unscaled gradient}; the facts for plan.training["scaler"]). The finite
    check is a graph output, which the executor reads."""
    state = {name: Tensor(name, (), np.dtype(np.float32), "state") for name in (EXPONENT, GROWTH)}
    graph = replace(graph, tensors={**graph.tensors, **state})
    b = Builder(graph, prefix="scaler")
    scale = b.op("Mul", b.op("Pow", b.const(2.0, EXPONENT), EXPONENT), b.const(SCALE_INIT, EXPONENT))
    graph = _appended(graph, b, (*graph.outputs, scale))
    graph, grads = autodiff.gradients(graph, loss, params, seed=scale)
    b = Builder(graph, prefix="scaler")
    b.tensors.update(state)  # pruned while nothing read them
    inverse = b.op("Reciprocal", scale)
    unscaled = {p: b.op("Mul", g, inverse) for p, g in grads.items()}
    sums = [b.op("ReduceSum", g, keepdims=0) for g in unscaled.values()]
    total = b.op("Sum", *sums)
    finite = b.op("Not", b.op("Or", b.op("IsNaN", total), b.op("IsInf", total)))
    grown = b.op("Add", GROWTH, b.const(1.0, GROWTH))
    full = b.op("GreaterOrEqual", grown, b.const(float(GROWTH_INTERVAL), GROWTH))
    one, zero = b.const(1.0, EXPONENT), b.const(0.0, EXPONENT)
    updates = ((b.op("Add", EXPONENT, b.op("Where", finite, b.op("Where", full, one, zero), b.const(-1.0, EXPONENT))),
                EXPONENT), (b.op("Where", finite, b.op("Where", full, zero, grown), zero), GROWTH))
    outputs = tuple(o for o in graph.outputs if o != scale)
    graph = _appended(replace(graph, updates=(*graph.updates, *updates)), b, (*outputs, finite, *unscaled.values()))
    facts = {"exponent": EXPONENT, "growth": GROWTH, "finite": finite, "total": total, "init": SCALE_INIT,
             "growth_factor": GROWTH_FACTOR, "backoff_factor": BACKOFF_FACTOR, "growth_interval": GROWTH_INTERVAL}
    return replace(graph, outputs=(*outputs, finite)), unscaled, facts


def _appended(graph, b, outputs):
    """The graph with the Builder's nodes appended, typed, keeping what `outputs` need."""
    grown = replace(graph, nodes=(*graph.nodes, *b.nodes), tensors={**graph.tensors, **b.tensors}, outputs=outputs)
    return shapes.retype(grown, graph)
