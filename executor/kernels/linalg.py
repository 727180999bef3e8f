"""Matrix products: Gemm, MatMul and Einsum, written straight into their outputs."""
import numpy as np

from planner.ops import into

from . import kernel


@kernel("Gemm")
def gemm(xp, step, ins, outs, ws):
    """Y = alpha * A' B' + beta * C, computed as beta * (alpha / beta * A' B' + C) so that the GEMM
    writes Y and the scalings and C's broadcast add happen in place."""
    a, b, c = [*ins, None][:3]
    y = outs[0]
    alpha, beta = step.attrs["alpha"], step.attrs["beta"]
    into.matmul(xp, a.T if step.attrs["transA"] else a, b.T if step.attrs["transB"] else b, y)
    if c is None or beta == 0:
        if alpha != 1:
            xp.multiply(y, alpha, out=y)
        return
    if alpha != beta:
        xp.multiply(y, alpha / beta, out=y)
    xp.add(y, c, out=y)
    if beta != 1:
        xp.multiply(y, beta, out=y)


@kernel("MatMul")
def matmul(xp, step, ins, outs, ws):
    """numpy.matmul semantics. A batch of rows times one matrix or vector (a linear layer) is one
    GEMM or GEMV over the flattened rows, which on CuPy also avoids the batched call's pointer array
    (other broadcasts still make CuPy allocate one)."""
    a, b = ins
    y = outs[0]
    if a.ndim > 2 and b.ndim <= 2:
        a, y = a.reshape(-1, a.shape[-1]), y.reshape(-1, *b.shape[1:])
    if a.ndim == 1 or b.ndim == 1:
        xp.matmul(a, b, out=y)
    else:
        into.matmul(xp, a, b, y)


@kernel("Einsum")
def einsum(xp, step, ins, outs, ws):
    """xp.einsum into the output; dtypes einsum has no loop for (bfloat16) are summed in float32.
    CuPy's einsum takes no `out`: there the result is a temporary, copied in."""
    y, equation = outs[0], step.attrs["equation"]
    if xp.__name__ == "cupy":
        xp.copyto(y, xp.einsum(equation, *ins))
    elif y.dtype.kind == "V":
        xp.einsum(equation, *ins, out=y, dtype=np.float32, casting="unsafe")
    else:
        xp.einsum(equation, *ins, out=y)
