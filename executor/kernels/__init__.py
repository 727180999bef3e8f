"""Kernels: how each op computes, writing into the output views it is given.

A kernel is `fn(xp, step, ins, outs, ws)`: `xp` the array module (numpy or cupy), `step` the plan's
Step (its `.attrs` hold every attribute, ONNX defaults filled in when planning), `ins` the input
arrays (None for an omitted input), `outs` the output views to fill (None for an omitted output;
an output may share memory with an input when the plan wrote it in place), `ws` the op's scratch as
{slice name: view}, cut by the executor from the step's workspace by the Layout its schema's
`workspace` gave (empty when it has none). A kernel allocates nothing on the device: what it needs
besides its inputs and outputs it asks for in that Layout. Kernels register with `@kernel("Op", ...)`
(`domain=` for ops outside ONNX's default domain), keyed by (domain, op) as schemas are.
"""
import math

import numpy as np

from planner import ops

KERNELS = {}


def kernel(*op_types, domain=""):
    def register(fn):
        for op in op_types:
            KERNELS[domain, op] = fn
        return fn
    return register


def find(table, step, fuse=None):
    """The kernel of a step: the backend's `table` entry for its (domain, op); else, where the backend
    can `fuse(schema, step)` the op's CUDA body, that; else the kernel its op's entry holds; None when
    there is none."""
    fn = table.get((step.domain, step.op))
    if fn is None and ops.known(step.op, step.domain):
        schema = ops.of(step)
        fn = fuse and fuse(schema, step) or schema.kernel
    return fn


def cut(raw, shape, dtype):
    """The front of a raw (uint8) scratch slice as an array of `shape` and `dtype`: for scratch whose
    views change from one use to the next (a chunk of columns, the results between passes)."""
    dtype = np.dtype(dtype)
    return raw.reshape(-1)[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


from . import activation, nn, linalg, shape_ops, misc, optim, loss, winograd, batched_conv, inverted_residual  # noqa: E402,F401
from . import collectives, quantized  # noqa: E402,F401
