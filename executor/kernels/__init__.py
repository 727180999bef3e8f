"""Kernels: how each op computes, writing into the output views it is given.

A kernel is `fn(xp, step, ins, outs, ws)`: `xp` the array module (numpy or cupy), `step` the plan's
Step (its `.attrs`; `attr(step, name)` reads an attribute with its ONNX default), `ins` the input
arrays (None for an omitted input), `outs` the output views to fill (None for an omitted output;
an output may share memory with an input when the plan wrote it in place), `ws` the op's workspace
as a uint8 array, or None. Kernels register with `@kernel("Op", ...)` (`domain=` for ops outside ONNX's
default domain), keyed by (domain, op) as schemas are.
"""
from planner import ops

KERNELS = {}


def kernel(*op_types, domain=""):
    def register(fn):
        for op in op_types:
            KERNELS[domain, op] = fn
        return fn
    return register


def find(table, step, opsets=None):
    """The kernel of a step: the backend's `table` entry for its (domain, op), else the kernel its op's
    definition holds (the elementwise entries); None when neither has one."""
    fn = table.get((step.domain, step.op))
    if fn is None and ops.known(step.op, step.domain):
        fn = ops.of(step, opsets).kernel
    return fn


def attr(step, name):
    """An attribute of the step, or its default from the op's schema."""
    return ops.of(step).attr(step, name)


def evaluated(xp, step, ins, outs):
    """Fill the outputs from the op's NumPy form (its schema's `evaluate`), computed on the host: for
    the rare cases (dtypes, modes) a direct kernel leaves to it."""
    import numpy as np
    host = [None if a is None else (a if xp is np else xp.asnumpy(a)) for a in ins]
    for out, value in zip(outs, ops.of(step).evaluate(step, *host)):
        if out is not None:
            out[...] = xp.asarray(value)


from . import activation, nn, linalg, shape_ops, misc, optim, loss  # noqa: E402,F401
