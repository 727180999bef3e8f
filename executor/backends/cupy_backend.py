"""The GPU backend: CuPy arrays, the shared kernel table with GPU overrides where they must differ, GEMMs on
cuBLAS through nvmath-python and convolutions on cuDNN's graphs where those are installed (`memplan[gpu]`).
CUB reductions are turned off, since they allocate scratch space while running."""
from functools import lru_cache

import numpy as np

from planner import ops
from planner.errors import MemplanError

from ..kernels import KERNELS
from . import memory
from .cuda_graph import Replay  # noqa: F401  (the executor's cuda_graph mode)

NAME = "cupy"
kernels = dict(KERNELS)
xp = None
fuse = None
"""fuse(schema, step): the step's kernel from its op's `cuda` body, bound when CuPy is available."""


def available():
    """Whether CuPy imports and sees a CUDA device; binds `xp` to cupy when it does."""
    global xp, fuse
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
    except Exception:
        return False
    cupy._core.set_reduction_accelerators([])
    cupy._core.set_routine_accelerators([])
    if xp is None:
        from .cupy_kernels import fuser, overrides
        kernels.update(overrides(cupy))
        fuse = fuser(cupy)
    xp = cupy
    return True


def table(jit=None):
    """The kernel table (the shared one with the GPU overrides); the compiled CPU kernels are not for it."""
    if jit:
        raise MemplanError("jit=True is for the numpy backend: its compiled kernels run on the CPU")
    return kernels


def free_bytes():
    return xp.cuda.runtime.memGetInfo()[0]


def room(config):
    """(bytes, where) of the device memory a new allocation can take: the free memory less the pool reserve of
    `config`."""
    free = free_bytes()
    return int(free * (1 - config.pool_reserve_percent / 100)), (
        f"usable on the device ({free:,} free less MXNET_GPU_MEM_POOL_RESERVE={config.pool_reserve_percent:g}%)")


def check_room(nbytes, what, config):
    """Raise OutOfMemoryError when `what` (its `nbytes`) cannot fit in the device's room."""
    memory.check(nbytes, what, room(config))


def allocating(nbytes, what, config):
    """A block allocating `what` (`nbytes`) on the device: CuPy's OutOfMemoryError (a MemoryError) becomes the
    one-line one of memplan."""
    return memory.allocating(nbytes, what, lambda: room(config))


def copy_in(view, value):
    """Write a feed into its arena view: a device array by a device copy, a host one straight from the host
    (no device temporary)."""
    if isinstance(value, xp.ndarray):
        view[...] = value
    else:
        view.set(np.ascontiguousarray(value).reshape(view.shape))  # ascontiguousarray makes a scalar 1-D


def host_arena(nbytes):
    """The host arena's buffer of `nbytes` (Arena.host), in pinned memory: the copies to and from it run
    asynchronously and inside CUDA-graph capture."""
    import cupyx
    return cupyx.empty_pinned((max(nbytes, 1),), dtype=np.uint8)


def copies(plan, view):
    """The plan's copies between the arenas on a CUDA stream of their own (cuda_copies.CopyStream), or None where it
    has none."""
    from .cuda_copies import CopyStream
    if not any(ops.of(s).timed for s in plan.steps):
        return None
    return CopyStream(xp, plan, view)


def synchronize():
    xp.cuda.get_current_stream().synchronize()


def used_bytes():
    """Device memory in use, by the driver's count (all processes and pools included)."""
    free, total = xp.cuda.runtime.memGetInfo()
    return total - free


def holds(dtype):
    """CuPy's own dtypes: not ml_dtypes' bfloat16, 8-bit and 4-bit floats or 4-bit ints."""
    return dtype.type.__module__ == "numpy"


class Arrays:
    """CuPy as an executor's kernels see it: every name CuPy's, but `matmul` on the executor's cuBLAS handle
    (executor/backends/cublas.py), which takes strided operands and runs inside CUDA-graph capture."""
    __name__ = "cupy"
    strided_gemm = True
    """planner.ops.into.matmul hands strided products to this matmul as they are."""

    def __init__(self, cupy, gemm):
        self._cupy, self._gemm = cupy, gemm

    def __getattr__(self, name):
        return getattr(self._cupy, name)

    def matmul(self, a, b, out):
        """a @ b into `out` (kernels allocate nothing, so every product has one)."""
        self._gemm.matmul(a, b, out)
        return out


@lru_cache(maxsize=None)
def runtime(tf32=False):
    """The process's Runtime for `tf32`: its library handles (cuBLAS's alone takes tens of MiB of device memory)
    are made once and shared by every executor, as one thread runs them."""
    return Runtime(tf32)


class Runtime:
    """The libraries one executor runs with: `xp` for its kernels, `bind` choosing memplan's depthwise kernel or
    cuDNN for its convolutions, and `libraries`, {library: what runs on it, or why it is not used}. `tf32` lets
    fp32 GEMMs and convolutions use TF32 tensor cores (off: full fp32, as PyTorch with allow_tf32 False)."""

    def __init__(self, tf32=False):
        from .cublas import Gemm
        from .cudnn_conv import Convolutions
        from .cupy_conv import depthwise
        self.depthwise = depthwise(xp)
        self.depthwise_steps = set()
        """The names of the steps memplan's depthwise kernel runs, for the report of what ran where."""
        self.libraries = {}
        gemm = self._load("cublas", "nvmath-python", lambda: Gemm(xp, tf32), "GEMMs on CuPy's matmul")
        self.convs = self._load("cudnn", "nvidia-cudnn-frontend", lambda: Convolutions(xp, tf32),
                                "convolutions by im2col")
        self.xp = Arrays(xp, gemm) if gemm else xp

    def _load(self, name, package, make, otherwise):
        try:
            made = make()
        except (ImportError, OSError) as e:  # not installed, or its shared library not found
            self.libraries[name] = f"{package} unusable ({type(e).__name__}: {e}): {otherwise}"
            return None
        self.libraries[name] = "in use"
        return made

    def bind(self, step, fn, ins, outs, workspace):
        """The kernel `step` runs with: for a Conv or FusedConv, memplan's depthwise kernel where it takes the step,
        else cuDNN's graph where cuDNN does; else `fn`."""
        if (step.domain, step.op) not in (("", "Conv"), ("com.microsoft", "FusedConv")):
            return fn
        depthwise = self.depthwise(step, ins, outs)
        if depthwise:
            self.depthwise_steps.add(step.name)
            return depthwise
        return (self.convs and self.convs.bind(step, ins, outs, workspace)) or fn
