"""Array modules the executor runs on: "numpy" (CPU) and "cupy" (GPU); "auto" picks cupy when a GPU
is usable."""
from planner.errors import MemplanError

BACKENDS = ("numpy", "cupy", "auto")


def get(name):
    """The backend module for `name` (see numpy_backend / cupy_backend)."""
    if name not in BACKENDS:
        raise MemplanError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        from . import cupy_backend
        return cupy_backend if cupy_backend.available() else get("numpy")
    if name == "cupy":
        from . import cupy_backend
        if not cupy_backend.available():
            raise MemplanError("backend 'cupy' needs CuPy and a CUDA GPU: pip install \"memplan[gpu]\"")
        return cupy_backend
    from . import numpy_backend
    return numpy_backend
