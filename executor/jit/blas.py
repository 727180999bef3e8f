"""The GEMM that compiled kernels call inside their parallel loops: MKL's cblas_sgemm where executor/mkl.py
loads it (single-threaded on InvertedResidual's thin shapes, 1.0 to 2.5x as fast as SciPy's OpenBLAS,
benchmarks/RESULTS.md), else a numba cfunc of the same signature that runs numba's np.dot (SciPy's BLAS).
Kernels take it as an argument, a ctypes function: a ctypes global would be compiled into the kernel as an
address, and numba would not cache it."""
import ctypes
from functools import cache

import numpy as np
from numba import carray, cfunc, njit, types

from planner.ops.into import NO_TRANS, TRANS

from .. import mkl

SGEMM = ctypes.CFUNCTYPE(None, *[ctypes.c_int] * 6, ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int)
"""cblas_sgemm(order, trans A, trans B, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)."""
ROW_MAJOR = mkl.ROW_MAJOR

_i, _f, _p = types.intc, types.float32, types.voidptr


@njit(fastmath=True, cache=True)
def _strided(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc):
    """cblas_sgemm's product element by element, for operands or an output whose rows lie apart (blocks of
    wider matrices, which the kernels pass only where MKL runs): slow, but right."""
    left = carray(a, ((m - 1) * lda + k if trans_a == NO_TRANS else (k - 1) * lda + m,), np.float32)
    right = carray(b, ((k - 1) * ldb + n if trans_b == NO_TRANS else (n - 1) * ldb + k,), np.float32)
    out = carray(c, ((m - 1) * ldc + n,), np.float32)
    for i in range(m):
        for j in range(n):
            total = np.float32(0)
            for p in range(k):
                total += (left[i * lda + p] if trans_a == NO_TRANS else left[p * lda + i]) * \
                    (right[p * ldb + j] if trans_b == NO_TRANS else right[j * ldb + p])
            out[i * ldc + j] = total


def _numpy_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """cblas_sgemm by numba's np.dot for what `dot` passes (row-major, alpha 1, beta 0): the GEMM where MKL is
    not installed (compiled by `_fallback` where it is needed, not when this module is imported)."""
    if m == 0 or n == 0:
        return
    if lda != (k if trans_a == NO_TRANS else m) or ldb != (n if trans_b == NO_TRANS else k) or ldc != n:
        _strided(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc)
        return
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
    """MKL's cblas_sgemm as a ctypes function where it runs (executor.mkl.available), else `_numpy_sgemm`."""
    return _mkl_sgemm() if mkl.available() else _fallback()


@cache
def _mkl_sgemm():
    return SGEMM(("cblas_sgemm", mkl.library()))


@cache
def _fallback():
    compiled = cfunc(types.void(_i, _i, _i, _i, _i, _i, _f, _p, _i, _p, _i, _f, _p, _i), cache=True)(_numpy_sgemm)
    return SGEMM(compiled.address)


@njit(inline="always")
def _layout(x):
    """(transpose flag, leading dimension) of a 2-D float32 array whose rows or columns are contiguous."""
    if x.flags.c_contiguous:
        return NO_TRANS, max(1, x.shape[1])
    if x.flags.f_contiguous:
        return TRANS, max(1, x.shape[0])
    if x.strides[1] == 4:
        return NO_TRANS, x.strides[0] // 4
    return TRANS, x.strides[1] // 4


@njit(inline="always")
def dot(gemm, a, b, out):
    """out = a @ b by `gemm` (an `sgemm()`) for 2-D float32 arrays whose rows or columns are contiguous (a
    transpose): whole matrices, or blocks of columns of wider ones (their row strides the leading dimensions).
    out's rows are contiguous."""
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
