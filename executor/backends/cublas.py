"""GEMMs on the GPU through cuBLAS called by `nvmath-python`, which works inside CUDA-graph capture (CuPy's
own cuBLAS calls refuse it): 2-D and strided-batched products with any row or column strides, on the current
stream, TF32 off unless asked for. cuBLAS is given no workspace, so it never allocates device memory of its
own. Without nvmath, or for a product it does not take (integer dtypes, a batch whose strides do not
collapse), `matmul` is CuPy's."""
import numpy as np

from planner.ops.into import gemm_operand

_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2}
"""cudaDataType_t of the dtypes cuBLAS multiplies (CUDA_R_32F, CUDA_R_64F, CUDA_R_16F)."""


class Gemm:
    """One cuBLAS handle (nvmath's bindings) on the stream CuPy has current at each call."""

    def __init__(self, cupy, tf32=False):
        from nvmath.bindings import cublas
        self.cupy, self.cublas = cupy, cublas
        self.handle = cublas.create()
        cublas.set_workspace(self.handle, 0, 0)
        cublas.set_pointer_mode(self.handle, cublas.PointerMode.HOST)
        # TF32: fp32 products on the tensor cores with about 10 bits of mantissa
        cublas.set_math_mode(self.handle, cublas.Math.TF32_TENSOR_OP_MATH if tf32 else cublas.Math.DEFAULT_MATH)
        self.stream = None
        self.ops = {"N": cublas.Operation.N, "T": cublas.Operation.T}
        self.scalars = {dtype: (np.ones((), _scalar(dtype)), np.zeros((), _scalar(dtype))) for dtype in _TYPES}

    def matmul(self, a, b, out):
        """out = a @ b as NumPy broadcasts it, into `out`; CuPy's matmul for what cuBLAS does not take here."""
        if not self._gemm(a, b, out):
            self.cupy.matmul(a, b, out=out)

    def _gemm(self, a, b, out):
        """out = a @ b by one cuBLAS call, or False when the operands' dtypes or strides do not allow one."""
        dtype = out.dtype
        if dtype not in _TYPES or a.dtype != dtype or b.dtype != dtype or a.ndim < 2 or b.ndim < 2:
            return False
        batch = out.shape[:-2]
        if a.shape[:-2] != batch or b.shape[:-2] != batch:
            try:
                a = self.cupy.broadcast_to(a, (*batch, *a.shape[-2:]))
                b = self.cupy.broadcast_to(b, (*batch, *b.shape[-2:]))
            except ValueError:
                return False
        (m, k), n = a.shape[-2:], b.shape[-1]
        if not out.size:
            return True
        if k == 0:
            out.fill(0)
            return True
        left, right, result = gemm_operand(a), gemm_operand(b), gemm_operand(out)
        strides = [_batch_stride(x) for x in (a, b, out)]
        if left is None or right is None or result is None or result[0] != "N" or None in strides:
            return False
        count = int(np.prod(batch, dtype=np.int64))
        if count > 1 and strides[2] == 0:
            return False
        self._on_current_stream()
        cublas, op = self.cublas, self.ops
        one, zero = (s.ctypes.data for s in self.scalars[dtype])
        # row-major out = a b is column-major out^T = b^T a^T
        head = (self.handle, op[right[0]], op[left[0]], n, m, k, one)
        if dtype == np.float16:
            kind, compute = _TYPES[dtype], cublas.ComputeType.COMPUTE_32F
            if count == 1:
                cublas.gemm_ex(*head, b.data.ptr, kind, right[1], a.data.ptr, kind, left[1], zero, out.data.ptr, kind,
                               result[1], compute, -1)
            else:
                cublas.gemm_strided_batched_ex(*head, b.data.ptr, kind, right[1], strides[1], a.data.ptr, kind,
                                               left[1], strides[0], zero, out.data.ptr, kind, result[1], strides[2],
                                               count, compute, -1)
            return True
        prefix = "s" if dtype == np.float32 else "d"
        if count == 1:
            getattr(cublas, prefix + "gemm")(*head, b.data.ptr, right[1], a.data.ptr, left[1], zero, out.data.ptr,
                                             result[1])
        else:
            getattr(cublas, prefix + "gemm_strided_batched")(*head, b.data.ptr, right[1], strides[1], a.data.ptr,
                                                             left[1], strides[0], zero, out.data.ptr, result[1],
                                                             strides[2], count)
        return True

    def _on_current_stream(self):
        stream = self.cupy.cuda.get_current_stream().ptr
        if stream != self.stream:
            self.cublas.set_stream(self.handle, stream)
            self.stream = stream


def _scalar(dtype):
    """The host type of alpha and beta: the compute type, float32 for float16's fp32 accumulation."""
    return np.float32 if dtype == np.float16 else dtype


def _batch_stride(x):
    """Elements between consecutive matrices when the batch dims of `x` collapse to one stride (0 when they are
    broadcast); None when they do not."""
    shape, strides = x.shape[:-2], [s // x.itemsize for s in x.strides[:-2]]
    dims = [(n, s) for n, s in zip(shape, strides) if n > 1]
    if not dims:
        return 0
    for (_, outer), (n, inner) in zip(dims, dims[1:]):
        if outer != inner * n:
            return None
    return dims[-1][1]
