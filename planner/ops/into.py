"""Array operations written into a given output with nothing allocated, on NumPy and on CuPy, where CuPy's own
form would make a temporary: a GEMM into a block of rows of a larger matrix (a chunk of an image's output rows,
a tile of scores), whose rows cuBLAS reads by their stride (an executor's CuPy, whose matmul takes strides,
executor/backends/cublas.py, gets every product as it is); an index range without a scan's scratch; an add where
a mask holds (CuPy's ufuncs take no `where`). A GEMM the executor installs for an array module (`install`: MKL's
on the host, executor/mkl.py) takes the products it can first, so that the op library needs no BLAS binding of
its own."""
from functools import cache

import numpy as np

NO_TRANS, TRANS = 111, 112
"""CBLAS's flags for a matrix read as it is or transposed (`matrix`)."""
_GEMMS = {}
"""{array module: gemm(a, b, out) -> whether it wrote out = a @ b}, as `install` set them."""


def install(xp, gemm):
    """Hand `matmul`'s products of `xp` arrays to `gemm(a, b, out)` first, which returns False (nothing written)
    for those it does not take; None hands them all to the module's own matmul again."""
    if gemm is None:
        _GEMMS.pop(xp, None)
    else:
        _GEMMS[xp] = gemm


def matmul(xp, a, b, out):
    """out = a @ b. A stack of matrices `a` (contiguous) times one matrix `b` is one GEMM over the stacked
    rows (CuPy's broadcasting matmul allocates a pointer array). On CuPy a 2-D float32/float64 product whose
    operands have contiguous rows or columns (a transpose) and whose output has contiguous rows goes to
    cuBLAS with the row strides as leading dimensions: CuPy's matmul computes a strided output into a
    temporary and copies it. A GEMM `install`ed for `xp` takes the product first where it can (on the host,
    MKL's where the executor runs it); NumPy's matmul the rest."""
    if a.ndim > 2 and b.ndim == 2 and a.flags.c_contiguous and out.flags.c_contiguous:
        a, out = a.reshape(-1, a.shape[-1]), out.reshape(-1, out.shape[-1])
    gemm = _GEMMS.get(xp)
    if gemm is not None and gemm(a, b, out):
        return
    if xp is np:
        np.matmul(a, b, out=out)
        return
    if getattr(xp, "strided_gemm", False) or out.ndim != 2 or (out.flags.c_contiguous and a.flags.c_contiguous
                                                               and b.flags.c_contiguous):
        xp.matmul(a, b, out=out)
        return
    from cupy_backends.cuda.libs import cublas
    gemm = {np.dtype(np.float32): cublas.sgemm, np.dtype(np.float64): cublas.dgemm}.get(out.dtype)
    left, right, result = gemm_operand(a), gemm_operand(b), gemm_operand(out)
    same = a.dtype == b.dtype == out.dtype
    if gemm is None or None in (left, right, result) or result[0] != "N" or not same:
        xp.matmul(a, b, out=out)
        return
    if not out.size:
        return
    (m, k), n = a.shape, b.shape[1]
    one, zero = np.ones((), out.dtype), np.zeros((), out.dtype)
    op = {"N": cublas.CUBLAS_OP_N, "T": cublas.CUBLAS_OP_T}
    handle = xp.cuda.device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:  # row-major out = a b is column-major out^T = b^T a^T
        gemm(handle, op[right[0]], op[left[0]], n, m, k, one.ctypes.data, b.data.ptr, right[1], a.data.ptr, left[1],
             zero.ctypes.data, out.data.ptr, result[1])
    finally:
        cublas.setPointerMode(handle, mode)


def matrix(shape, strides, itemsize):
    """(transpose flag, leading dimension) of a row-major matrix of `shape` and byte `strides`: NO_TRANS when
    its rows are contiguous, TRANS when its columns are (a transposed view); None when neither."""
    (rows, cols), (down, across) = shape, strides
    if (across == itemsize or cols == 1) and (rows == 1 or down % itemsize == 0 and down // itemsize >= cols):
        return NO_TRANS, max(1, cols, down // itemsize if rows > 1 else 0)
    if (down == itemsize or rows == 1) and (cols == 1 or across % itemsize == 0 and across // itemsize >= rows):
        return TRANS, max(1, rows, across // itemsize if cols > 1 else 0)
    return None


def gemm_operand(x):
    """(cuBLAS op, leading dimension) of the last two dims of a row-major operand for the column-major product
    (row-major out = a b is column-major out^T = b^T a^T): "N" for contiguous rows, "T" for contiguous columns
    (a transpose), as the row-major flags of `matrix`; None for neither."""
    layout = matrix(x.shape[-2:], x.strides[-2:], x.itemsize)
    return layout and ({NO_TRANS: "N", TRANS: "T"}[layout[0]], layout[1])


def iota(xp, out):
    """out[i] = i for a 1-D integer `out` (NumPy: a running sum of ones; CuPy: one elementwise kernel, where
    cumsum takes scratch)."""
    if xp is np:
        out.fill(1)
        np.cumsum(out, out=out)
        np.subtract(out, 1, out=out)
        return
    _iota(xp)(out)


@cache
def _iota(cupy):
    """The CuPy kernel writing each element's index (compiled once per dtype by CuPy)."""
    return cupy.ElementwiseKernel("", "T y", "y = i", "memplan_iota")


def add_where(xp, out, value, where):
    """out += value where the bool `where` (broadcast to out) holds, in place, nothing allocated."""
    if xp is np:
        np.add(out, value, out=out, where=where)
        return
    _add_where(xp)(where, out.dtype.type(value), out)


@cache
def _add_where(cupy):
    """The CuPy kernel of `add_where` (compiled once per dtype by CuPy)."""
    return cupy.ElementwiseKernel("bool h, T v", "T y", "if (h) y = y + v", "memplan_add_where")
