"""The GEMM that compiled kernels call inside their parallel loops: MKL's cblas_sgemm where planner.ops.mkl
loads it (single-threaded on InvertedResidual's thin shapes, 1.0 to 2.5x as fast as SciPy's OpenBLAS,
benchmarks/RESULTS.md), else a numba cfunc of the same signature that runs numba's np.dot (SciPy's BLAS).
Kernels take it as an argument, a ctypes function: a ctypes global would be compiled into the kernel as an
address, and numba would not cache it."""
import ctypes
from functools import cache

import numpy as np
from numba import carray, cfunc, njit, types

from planner.ops import mkl

SGEMM = ctypes.CFUNCTYPE(None, *[ctypes.c_int] * 6, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int)
"""cblas_sgemm(order, trans A, trans B, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)."""
ROW_MAJOR, NO_TRANS, TRANS = mkl.ROW_MAJOR, mkl.NO_TRANS, mkl.TRANS

_i, _f, _p = types.intc, types.float32, types.voidptr


@cfunc(types.void(_i, _i, _i, _i, _i, _i, _f, _p, _i, _p, _i, _f, _p, _i), cache=True)
def _numpy_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """cblas_sgemm by numba's np.dot for what `dot` passes (row-major, alpha 1, beta 0, operands whose leading
    dimension is their width): the GEMM where MKL is not installed."""
    out = carray(c, (m, n), np.float32)
    if trans_a == NO_TRANS and trans_b == NO_TRANS:  # one call per layout: np.dot of arrays of mixed layouts copies
        np.dot(carray(a, (m, k), np.float32), carray(b, (k, n), np.float32), out)
    elif trans_a == NO_TRANS:
        np.dot(carray(a, (m, k), np.float32), carray(b, (n, k), np.float32).T, out)
    elif trans_b == NO_TRANS:
        np.dot(carray(a, (k, m), np.float32).T, carray(b, (k, n), np.float32), out)
    else:
        np.dot(carray(a, (k, m), np.float32).T, carray(b, (n, k), np.float32).T, out)


def sgemm():
    """MKL's cblas_sgemm as a ctypes function where it runs (planner.ops.mkl.available), else `_numpy_sgemm`."""
    return _mkl_sgemm() if mkl.available() else _fallback()


@cache
def _mkl_sgemm():
    return SGEMM(("cblas_sgemm", mkl.library()))


@cache
def _fallback():
    return SGEMM(_numpy_sgemm.address)


@njit(inline="always")
def _layout(x):
    """(transpose flag, leading dimension) of a C- or F-contiguous 2-D float32 array."""
    if x.flags.c_contiguous:
        return NO_TRANS, max(1, x.shape[1])
    return TRANS, max(1, x.shape[0])


@njit(inline="always")
def dot(gemm, a, b, out):
    """out = a @ b by `gemm` (an `sgemm()`) for 2-D float32 arrays, a and b each C- or F-contiguous (a
    transpose), out C-contiguous."""
    (m, k), n = a.shape, b.shape[1]
    trans_a, lda = _layout(a)
    trans_b, ldb = _layout(b)
    gemm(ROW_MAJOR, trans_a, trans_b, m, n, k, np.float32(1), a.ctypes.data, lda, b.ctypes.data, ldb, np.float32(0),
         out.ctypes.data, max(1, n))
