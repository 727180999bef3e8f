"""The GPU backend: CuPy arrays, the shared kernel table with GPU overrides where they must differ.
CUB reductions are turned off, since they allocate scratch space while running."""
from ..kernels import KERNELS

NAME = "cupy"
kernels = dict(KERNELS)
xp = None


def available():
    """Whether CuPy imports and sees a CUDA device; binds `xp` to cupy when it does."""
    global xp
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
    except Exception:
        return False
    cupy._core.set_reduction_accelerators([])
    cupy._core.set_routine_accelerators([])
    if xp is None:
        from .cupy_kernels import overrides
        kernels.update(overrides(cupy))
    xp = cupy
    return True


def free_bytes():
    return xp.cuda.runtime.memGetInfo()[0]


def synchronize():
    xp.cuda.get_current_stream().synchronize()


def used_bytes():
    """Device memory in use, by the driver's count (all processes and pools included)."""
    free, total = xp.cuda.runtime.memGetInfo()
    return total - free


def holds(dtype):
    """CuPy's own dtypes: not ml_dtypes' bfloat16, 8-bit and 4-bit floats or 4-bit ints."""
    return dtype.type.__module__ == "numpy"
