"""A GEMM on CuPy into a block of rows of a larger matrix (a chunk of an image's output rows): CuPy's matmul
computes such a strided output into a temporary and copies it; cuBLAS takes the row stride as its leading
dimension and writes in place."""
import numpy as np


def gemm_rows(cupy, a, b, out):
    """out = a @ b for 2-D float32/float64 operands whose rows are contiguous (any row stride); other
    operands go to CuPy's matmul."""
    from cupy_backends.cuda.libs import cublas
    gemm = {np.dtype(np.float32): cublas.sgemm, np.dtype(np.float64): cublas.dgemm}.get(out.dtype)
    rows = all(x.ndim == 2 and x.dtype == out.dtype and x.strides[1] == x.itemsize for x in (a, b, out))
    if gemm is None or not rows:
        cupy.matmul(a, b, out=out)
        return
    if not out.size:
        return
    (m, k), n = a.shape, b.shape[1]
    one, zero = np.ones((), out.dtype), np.zeros((), out.dtype)
    handle = cupy.cuda.device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:  # row-major out = a b is column-major out^T = b^T a^T
        gemm(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k, one.ctypes.data, b.data.ptr, _ld(b),
             a.data.ptr, _ld(a), zero.ctypes.data, out.data.ptr, _ld(out))
    finally:
        cublas.setPointerMode(handle, mode)


def _ld(x):
    """The leading dimension cuBLAS reads a row-major matrix by: its row stride in elements."""
    return max(x.strides[0] // x.itemsize, x.shape[1], 1)
