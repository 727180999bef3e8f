"""The GPU backend: CuPy arrays, the shared kernel table with GPU overrides where they must differ.
CUB reductions are turned off, since they allocate scratch space while running."""
from planner.errors import MemplanError
from planner.units import format_bytes

from ..kernels import KERNELS

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


def check_room(nbytes, what, config):
    """Raise MemplanError when `what` (its `nbytes`) cannot fit in the device's free memory less the
    pool reserve of `config`."""
    free = free_bytes()
    usable = int(free * (1 - config.pool_reserve_percent / 100))
    if nbytes > usable:
        raise MemplanError(f"not enough memory for {what}: {format_bytes(nbytes)} ({nbytes:,} bytes) needed, "
                           f"{format_bytes(usable)} ({usable:,} bytes) usable on the device ({free:,} free less "
                           f"MXNET_GPU_MEM_POOL_RESERVE={config.pool_reserve_percent:g}%)")


def synchronize():
    xp.cuda.get_current_stream().synchronize()


def used_bytes():
    """Device memory in use, by the driver's count (all processes and pools included)."""
    free, total = xp.cuda.runtime.memGetInfo()
    return total - free


def holds(dtype):
    """CuPy's own dtypes: not ml_dtypes' bfloat16, 8-bit and 4-bit floats or 4-bit ints."""
    return dtype.type.__module__ == "numpy"
