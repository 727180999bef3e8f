"""Intel MKL's GEMM on the host through ctypes, where the `mkl` wheel is installed (the `memplan[cpu]` extra on
x86-64): on this project's convolution shapes it runs 10 to 25% faster than NumPy's OpenBLAS with two threads,
and twice as fast on thin ones such as a 7x7 stem's (benchmarks/RESULTS.md). MKL runs its threads on TBB, the
pool numba's compiled kernels use, so the two never spin against each other; without TBB, or with
MEMPLAN_MKL=0, `matmul` declines and the caller runs NumPy's matmul. threadpoolctl sees the library once it is
loaded, so an Executor's `threads` cap applies to it as to OpenBLAS. The NumPy backend installs `matmul` as the
host GEMM of planner.ops.into, which the kernels call."""
import ctypes
import os
from contextlib import contextmanager
from functools import cache
from importlib import metadata

import numpy as np

from planner.ops.into import NO_TRANS, matrix

ROW_MAJOR = 101
THREADING_TBB = 4
INT_MAX = 2 ** 31 - 1
"""MKL's LP64 interface: dimensions and strides are C ints."""


def wanted():
    """Whether MEMPLAN_MKL allows MKL (anything but 0, false, no or off)."""
    return os.environ.get("MEMPLAN_MKL", "1").strip().lower() not in ("0", "false", "no", "off")


def _shared_library(distribution, prefix):
    """The path of the shared library named `prefix`... that the installed `distribution` ships, or None."""
    try:
        files = metadata.distribution(distribution).files or ()
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith(prefix):
            return str(file.locate())
    return None


@cache
def library():
    """MKL's runtime library with its threads on TBB, loaded once per process; None where MKL or TBB is not
    installed, does not load, or MEMPLAN_MKL turns it off."""
    rt, tbb = _shared_library("mkl", "libmkl_rt.so"), _shared_library("tbb", "libtbb.so.12")
    if not wanted() or rt is None or tbb is None:
        return None
    try:
        ctypes.CDLL(tbb, mode=ctypes.RTLD_GLOBAL)  # MKL's TBB layer needs it, and has no search path of its own
        lib = ctypes.CDLL(rt, mode=ctypes.RTLD_GLOBAL)
        if lib.MKL_Set_Threading_Layer(THREADING_TBB) != THREADING_TBB:
            return None
    except (OSError, AttributeError):
        return None
    P, I = ctypes.c_void_p, ctypes.c_int
    for name, scalar in (("cblas_sgemm_batch_strided", ctypes.c_float), ("cblas_dgemm_batch_strided", ctypes.c_double)):
        getattr(lib, name).argtypes = [I, I, I, I, I, I, scalar, P, I, I, P, I, I, scalar, P, I, I, I]
        getattr(lib, name).restype = None
    return lib


def available():
    """Whether `matmul` runs on MKL (loading it on the first call), unless `switched_off`."""
    return not _switched[0] and library() is not None


_switched = [False]


@contextmanager
def switched_off():
    """Within it, `matmul` declines and `available()` is False: NumPy's OpenBLAS runs the GEMMs of the same plan,
    for side-by-side timings (benchmarks/run_latency.py --openblas)."""
    before, _switched[0] = _switched[0], True
    try:
        yield
    finally:
        _switched[0] = before


_GEMMS = {np.dtype(np.float32): "cblas_sgemm_batch_strided", np.dtype(np.float64): "cblas_dgemm_batch_strided"}


def _operand(x, count):
    """(pointer, transpose flag, leading dimension, stride between matrices) of a 2-D operand (one matrix for
    all `count` products) or a 3-D stack of `count`; None when MKL cannot read it in place."""
    layout = matrix(x.shape[-2:], x.strides[-2:], x.itemsize)
    if layout is None:
        return None
    between = 0
    if x.ndim == 3 and count > 1:
        if x.strides[0] % x.itemsize or x.strides[0] < 0:
            return None
        between = x.strides[0] // x.itemsize
    if max(layout[1], between) > INT_MAX:
        return None
    return x.ctypes.data, *layout, between


def _stacked(x, batch):
    """x as one matrix (2-D) or a 3-D stack of matrices, its batch dims (`batch`, out's) collapsed into one
    without a copy; None when they are other dims or do not collapse."""
    if x.ndim == 2 or x.ndim == 3 and x.shape[:1] == batch:
        return x
    if x.shape[:-2] != batch:
        return None
    dims = [(size, stride) for size, stride in zip(x.shape[:-2], x.strides[:-2]) if size != 1]
    if any(outer != size * inner for (_, outer), (size, inner) in zip(dims, dims[1:])):
        return None
    return x.reshape(-1, *x.shape[-2:])  # a view: the batch dims step evenly


FEW_ROWS = 16
"""Rows of a product (one matrix) `gemm` leaves to NumPy's BLAS: a decoded token's products stream their weights
from memory, which OpenBLAS's GEMV does faster than MKL's GEMM (a 1536 x 512 float32 matrix read from DRAM by 1
row: 149 us against 408; by 8 rows: 304 against 486, on the 2-core CPU box)."""


def gemm(a, b, out):
    """`matmul` for the executor's products (planner.ops.into's GEMM on the host): those of more than FEW_ROWS rows
    or of a stack of matrices; False for the others, which NumPy's matmul computes."""
    return (a.ndim != 2 or a.shape[0] > FEW_ROWS) and matmul(a, b, out)


def matmul(a, b, out):
    """out = a @ b on MKL for float32 or float64 NumPy arrays of one dtype: 2-D matrices, or stacks of
    matrices (a 2-D operand taken for each), read in place by their strides, `out` with contiguous rows.
    True when done; False (nothing written) where MKL is off or the operands are not such arrays."""
    lib = None if _switched[0] else library()
    if lib is None or not all(isinstance(t, np.ndarray) for t in (a, b, out)) or out.dtype not in _GEMMS \
            or not a.dtype == b.dtype == out.dtype or min(a.ndim, b.ndim) < 2 or out.ndim != max(a.ndim, b.ndim):
        return False
    batch = out.shape[:-2]
    a, b, out = _stacked(a, batch), _stacked(b, batch), _stacked(out, batch)
    if a is None or b is None or out is None:
        return False
    count = out.shape[0] if out.ndim == 3 else 1
    (m, k), n = a.shape[-2:], b.shape[-1]
    if out.shape[-2:] != (m, n) or b.shape[-2] != k or any(t.ndim == 3 and t.shape[0] != count for t in (a, b)) \
            or not m * n * k * count or max(m, n, k, count) > INT_MAX:
        return False
    left, right, result = _operand(a, count), _operand(b, count), _operand(out, count)
    if left is None or right is None or result is None or result[1] != NO_TRANS:
        return False
    apart = result[3] if count > 1 else result[2] * m  # MKL checks that the outputs do not overlap
    if apart < result[2] * m or apart > INT_MAX:
        return False
    getattr(lib, _GEMMS[out.dtype])(ROW_MAJOR, left[1], right[1], m, n, k, 1.0, left[0], left[2], left[3],
                                    right[0], right[2], right[3], 0.0, result[0], result[2], apart, count)
    return True
