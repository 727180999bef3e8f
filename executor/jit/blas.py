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


@njit(inline="always", fastmath=True)
def _dot_into(a, b, c, ldc):
    """The m rows of n at c, ldc apart, = a @ b. np.dot writes only contiguous outputs, so rows lying apart
    (columns of a wider matrix, which `dot` passes only to MKL's GEMM) are summed here, slowly but right."""
    m, n = a.shape[0], b.shape[1]
    if ldc <= n or m <= 1:
        np.dot(a, b, carray(c, (m, n), np.float32))
        return
    rows = carray(c, ((m - 1) * ldc + n,), np.float32)
    for i in range(m):
        row = rows[i * ldc:i * ldc + n]
        row[:] = 0
        for p in range(a.shape[1]):
            for j in range(n):
                row[j] += a[i, p] * b[p, j]


@cfunc(types.void(_i, _i, _i, _i, _i, _i, _f, _p, _i, _p, _i, _f, _p, _i), cache=True)
def _numpy_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """cblas_sgemm by numba's np.dot for what `dot` passes (row-major, alpha 1, beta 0, operands whose leading
    dimension is their width): the GEMM where MKL is not installed."""
    if trans_a == NO_TRANS and trans_b == NO_TRANS:  # one call per layout: np.dot of arrays of mixed layouts copies
        _dot_into(carray(a, (m, k), np.float32), carray(b, (k, n), np.float32), c, ldc)
    elif trans_a == NO_TRANS:
        _dot_into(carray(a, (m, k), np.float32), carray(b, (n, k), np.float32).T, c, ldc)
    elif trans_b == NO_TRANS:
        _dot_into(carray(a, (k, m), np.float32).T, carray(b, (k, n), np.float32), c, ldc)
    else:
        _dot_into(carray(a, (k, m), np.float32).T, carray(b, (n, k), np.float32).T, c, ldc)


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
    transpose), out's rows contiguous (C-contiguous, or columns of a wider matrix: its row stride is ldc)."""
    (m, k), n = a.shape, b.shape[1]
    trans_a, lda = _layout(a)
    trans_b, ldb = _layout(b)
    gemm(ROW_MAJOR, trans_a, trans_b, m, n, k, np.float32(1), a.ctypes.data, lda, b.ctypes.data, ldb, np.float32(0),
         out.ctypes.data, max(1, n, out.strides[0] // 4))


@cache
def one_thread():
    """A context manager holding the BLAS libraries `sgemm()` calls (MKL's, SciPy's) to one thread: kernels
    whose parallel lanes each call it (two lanes calling a two-thread BLAS ran 2x slower)."""
    import scipy.linalg  # noqa: F401  (loads the BLAS numba's np.dot calls, so the controller finds it)
    mkl.library()  # loads MKL where it is installed, so the controller finds it even when it is switched off now
    from threadpoolctl import ThreadpoolController
    controller = ThreadpoolController().select(user_api="blas")
    return lambda: controller.limit(limits=1)
