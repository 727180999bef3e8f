"""The CPU backend: NumPy arrays, the shared kernel table."""
import numpy as xp  # noqa: F401  (the backend's array module)

from ..kernels import KERNELS

NAME = "numpy"
kernels = KERNELS


def free_bytes():
    """Memory the arena may take: the host is not checked."""
    return None


def synchronize():
    pass


def used_bytes():
    """Device memory in use: none on the host."""
    return None


def holds(dtype):
    """Every dtype NumPy knows, ml_dtypes' (bfloat16, float8, int4) included."""
    return True
