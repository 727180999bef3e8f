"""Kernels: how each op computes, writing into the output views it is given.

A kernel is `fn(xp, step, ins, outs, ws)`: `xp` the array module (numpy or cupy), `step` the plan's
Step (its `.attrs` hold every attribute, ONNX defaults filled in when planning), `ins` the input
arrays (None for an omitted input), `outs` the output views to fill (None for an omitted output;
an output may share memory with an input when the plan wrote it in place), `ws` the op's scratch as
{slice name: view}, cut by the executor from the step's workspace by the Layout its schema's
`workspace` gave (empty when it has none). A kernel allocates nothing on the device: what it needs
besides its inputs and outputs it asks for in that Layout. Kernels register with `@kernel("Op", ...)`
(`domain=` for ops outside ONNX's default domain), keyed by (domain, op) as schemas are; a backend's own forms
of them with `@override(backend, "Op", ...)` beside their code (docs/ARCHITECTURE.md: where a kernel lives).
"""
import math
import pkgutil
from importlib import import_module

import numpy as np

from planner import ops

KERNELS = {}
OVERRIDES = {"cupy": {}, "jit": {}}
"""{backend: {(domain, op): make}}: a backend's own form of an op's kernel (CuPy's fused GPU kernels, numba's
compiled CPU ones), made by `make(source)` when the backend builds its table, from what that backend makes its
forms of (the cupy module; for jit, the shared kernel the form hands the arrays it does not take)."""


def kernel(*op_types, domain=""):
    """Register `fn(xp, step, ins, outs, ws)` as the shared kernel of each op type of `domain`."""
    def register(fn):
        for op in op_types:
            KERNELS[domain, op] = fn
        return fn
    return register


def override(backend, *op_types, domain=""):
    """Register `make(source) -> kernel`, the `backend`'s form of each op type's kernel (see OVERRIDES), where it
    is written: executor/backends/cupy_*.py for "cupy", executor/jit/ for "jit"."""
    def register(make):
        for op in op_types:
            OVERRIDES[backend][domain, op] = make
        return make
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


for _family in pkgutil.iter_modules(__path__):  # every family registers its kernels when imported
    import_module(f"{__name__}.{_family.name}")
