"""memplan.BatchedConv (planner/ops/batched_conv.py) over NumPy or CuPy arrays: per chunk of images, the
columns of every image (im2col, or the images themselves for a pointwise conv), one GEMM into `output`, and
the output written back into Y by the epilogue."""
import math

from planner.ops.into import matmul

from . import kernel
from .nn import conv_window, epilogue, fill_columns


@kernel("BatchedConv", domain="memplan")
def batched_conv(xp, step, ins, outs, ws):
    """Y = activation(conv(X, W) + B + Z), a GEMM per chunk of images."""
    _, _, b, z = [*ins, None, None][:4]
    finish = epilogue(xp, step, b, z)

    def write_back(output, y, at):
        xp.copyto(y, output.reshape(y.shape[1], y.shape[0], *y.shape[2:]).swapaxes(0, 1))
        finish(y, at)
    convolve(xp, step, ins, outs, ws, columns(xp, fill_columns), write_back)


def columns(xp, fill):
    """`gather(cols, x, step, w, y)`: the columns (C, k..., images, out...) of the images x, by `fill` (as
    nn.fill_columns) through their (images, C, k..., out...) view; for a pointwise conv, x's pixels."""
    def gather(cols, x, step, w, y):
        win = conv_window(step, x, w, y)
        if all(k == 1 for k in w.shape[2:]) and set(win.strides) == {1} and not any(win.begin + win.end) \
                and x.shape[2:] == y.shape[2:]:
            xp.copyto(cols.reshape(x.shape[1], x.shape[0], -1), x.reshape(*x.shape[:2], -1).swapaxes(0, 1))
            return
        rank = w.ndim - 2
        view = cols.transpose(1 + rank, 0, *range(1, 1 + rank), *range(2 + rank, cols.ndim))
        fill(xp, view, x, win, y.shape[2:], (0, y.shape[2]), True)
    return gather


def convolve(xp, step, ins, outs, ws, gather, write_back):
    """Per chunk of images (as many as `output` holds): `gather` the columns, one GEMM, `write_back(output,
    Y block, at)`."""
    x, w = ins[:2]
    y = outs[0]
    pixels, kernel_shape = math.prod(y.shape[2:]), w.shape[2:]
    images = max(1, ws["output"].shape[1] // max(1, pixels))
    for n0 in range(0, x.shape[0], images):
        n1 = min(x.shape[0], n0 + images)
        width = (n1 - n0) * pixels
        cols = ws["columns"][:, :width]
        gather(cols.reshape(x.shape[1], *kernel_shape, n1 - n0, *y.shape[2:]), x[n0:n1], step, w, y[n0:n1])
        output = ws["output"][:, :width]
        matmul(xp, w.reshape(w.shape[0], -1), cols, output)
        write_back(output, y[n0:n1], (slice(n0, n1),))
