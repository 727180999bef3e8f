"""memplan.InvertedResidual (planner/ops/inverted_residual.py) over NumPy or CuPy arrays, job by job in the
first lane's scratch: the job's input pixels channels-last, one GEMM widening them, each image's widened rows
padded and its depthwise conv tap by tap over every channel at once, one GEMM narrowing the job's outputs,
written back into Y with the bias, Z and the activation. The compiled kernel (executor/jit) runs the jobs on
every core; this one is what CuPy and the NumPy backend without numba run."""
from planner.ops.inverted_residual import STAGES, job_size

from . import kernel
from .nn import activate


def jobs(step, ws, n, out_height):
    """(first image, end image, first row, end row) of each job, in order."""
    images, rows = job_size(ws["padded"].shape, ws["depthwise"].shape, step.attrs["strides"][0])
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
    for i0, i1, r0, r1 in jobs(step, ws, n, y.shape[2]):
        count, band, top = i1 - i0, r1 - r0, r0 * stride - 1
        t0, t1 = max(0, top), min(height, (r1 - 1) * stride + 2)
        source = x[i0:i1, :, t0:t1].transpose(0, 2, 3, 1)
        if w1 is not None:
            pixels = count * (t1 - t0) * width
            columns = ws["columns"][0, :pixels * c].reshape(source.shape)
            xp.copyto(columns, source)
            source = ws["expanded"][0, :pixels * widened].reshape(*source.shape[:3], widened)
            xp.matmul(columns.reshape(pixels, c), w1.reshape(widened, c).T, out=source.reshape(pixels, widened))
            _finish(xp, source, b1, None, widen)
        padded = ws["padded"][0, :(band - 1) * stride + 3]
        outputs = ws["depthwise"][0, :count, :band * out_width * widened].reshape(count, band, out_width, widened)
        product = ws["product"][:band]
        for k in range(count):
            padded.fill(0)
            padded[t0 - top:t1 - top, 1:width + 1] = source[k]
            image = outputs[k]  # one view object for input and output: CuPy copies an input it sees overlap
            image.fill(0)
            for a in range(3):
                for e in range(3):
                    window = padded[a:a + stride * (band - 1) + 1:stride, e:e + stride * (out_width - 1) + 1:stride]
                    xp.multiply(window, taps[a, e], out=product)
                    xp.add(image, product, out=image)
        _finish(xp, outputs, b2, None, depthwise)
        projected = ws["projected"][0, :filters * outputs.size // widened].reshape(filters, -1)
        xp.matmul(w3.reshape(filters, widened), outputs.reshape(-1, widened).T, out=projected)
        block = y[i0:i1, :, r0:r1]
        xp.copyto(block, projected.reshape(filters, count, band, out_width).transpose(1, 0, 2, 3))
        _finish(xp, block, None if b3 is None else b3.reshape(-1, 1, 1), None if z is None else z[i0:i1, :, r0:r1],
                project)
