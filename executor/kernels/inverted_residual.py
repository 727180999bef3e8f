"""memplan.InvertedResidual (planner/ops/inverted_residual.py) over NumPy or CuPy arrays, job by job in the
first lane's scratch: the job's input pixels channels-last, one GEMM widening them into the rows the depthwise
conv reads, its rows off the image zero, the depthwise conv of each image tap by tap over every channel at once
(each tap over the output columns whose source column lies in the image), one GEMM narrowing the job's
outputs, written back into Y with the bias, Z and the activation. The compiled kernel (executor/jit) runs the
jobs on every core; this one is what CuPy and the NumPy backend without numba run."""
from planner.ops.inverted_residual import STAGES, job_size

from . import kernel
from .nn import activate, span


def jobs(step, ws, n, out_height):
    """(first image, end image, first row, end row) of each job, in order."""
    images, rows = job_size(ws["widened"].shape, step.attrs["strides"][0])
    for i0 in range(0, n, images):
        for r0 in range(0, out_height, rows):
            yield i0, min(n, i0 + images), r0, min(out_height, r0 + rows)


def stages(step):
    """(activation, params) of each convolution, in order."""
    return [(step.attrs[f"{stage}activation"], step.attrs[f"{stage}activation_params"]) for stage in STAGES]


def _finish(xp, y, bias, z, activation):
    """y = activation(y + bias + z), bias (omitted: None) broadcasting over y, z None or y's shape."""
    if bias is not None:
        xp.add(y, bias, out=y)
    if z is not None:
        xp.add(y, z, out=y)
    activate(xp, y, *activation)


@kernel("InvertedResidual", domain="memplan")
def inverted_residual(xp, step, ins, outs, ws):
    """Y = the block of X, job by job as the module says."""
    x, w1, b1, w2, b2, w3, b3, z = [*ins, *[None] * 8][:8]
    y, stride = outs[0], step.attrs["strides"][0]
    (n, c, height, width), widened, filters = x.shape, w2.shape[0], y.shape[1]
    out_width, (widen, depthwise, project) = y.shape[3], stages(step)
    taps = ws["taps"].reshape(3, 3, widened)
    xp.copyto(taps, w2.reshape(widened, 3, 3).transpose(1, 2, 0))
    columns = [(e, found) for e in range(3) if (found := span(e - 1, stride, width, 0, out_width))]
    for i0, i1, r0, r1 in jobs(step, ws, n, y.shape[2]):
        count, band, top = i1 - i0, r1 - r0, r0 * stride - 1
        t0, t1, held = max(0, top), min(height, (r1 - 1) * stride + 2), (band - 1) * stride + 3
        rows = ws["widened"][0].reshape(-1)[:held * count * width * widened].reshape(held, count, width, widened)
        rows[:t0 - top].fill(0)
        rows[t1 - top:].fill(0)
        inside, source = rows[t0 - top:t1 - top], x[i0:i1, :, t0:t1].transpose(2, 0, 3, 1)
        if w1 is None:
            xp.copyto(inside, source)
        else:
            pixels = inside.size // widened
            gathered = ws["columns"][0, :pixels * c].reshape(source.shape)
            xp.copyto(gathered, source)
            xp.matmul(gathered.reshape(pixels, c), w1.reshape(widened, c).T, out=inside.reshape(pixels, widened))
            _finish(xp, inside, b1, None, widen)
        outputs = ws["depthwise"][0, :count, :band * out_width * widened].reshape(count, band, out_width, widened)
        product = ws["product"][:band]
        for k in range(count):
            image = outputs[k]
            image.fill(0)
            for a in range(3):
                for e, (at, source_columns) in columns:
                    window = rows[a:a + stride * (band - 1) + 1:stride, k, source_columns]
                    xp.multiply(window, taps[a, e], out=product[:, at])
                    block = image[:, at]  # one view object for input and output: CuPy copies an input it sees overlap
                    xp.add(block, product[:, at], out=block)
        _finish(xp, outputs, b2, None, depthwise)
        projected = ws["projected"][0, :filters * outputs.size // widened].reshape(filters, -1)
        xp.matmul(w3.reshape(filters, widened), outputs.reshape(-1, widened).T, out=projected)
        block = y[i0:i1, :, r0:r1]
        xp.copyto(block, projected.reshape(filters, count, band, out_width).transpose(1, 0, 2, 3))
        _finish(xp, block, None if b3 is None else b3.reshape(-1, 1, 1), None if z is None else z[i0:i1, :, r0:r1],
                project)
