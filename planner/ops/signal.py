"""Signal ops: the windows (HannWindow, HammingWindow, BlackmanWindow) and MelWeightMatrix, whose sizes
are known when planning so that they fold to constants; DFT and STFT, planned as MatMuls by constant
cos/sin matrices (so that they run and differentiate as MatMul, Gather and Transpose do); and Det, by
an LU factorisation in its workspace."""
import math

import numpy as np

from .registry import register
from .base import Layout, Schema, axis as to_axis, constant_shape, no_flops
from .composite import Composite
from ..dtypes import from_onnx
from ..errors import ShapeError


def scalar(value, name):
    """The one integer of an input known when planning (a scalar or one-element tensor)."""
    values = np.ravel(value)
    if values.size != 1:
        raise ShapeError(f"{name} must be one value, got {list(values)}")
    return values[0].item()


def int_const(b, value, like):
    """An int64 constant, for a Builder that makes constants like a tensor: like a cast zero of `like`'s
    dtype, which nothing reads and planning drops."""
    return b.const(value, b.cast(b.const(0, like), np.int64))


class Generated(Schema):
    """An op whose inputs are all known when planning and whose output it computes on the host with
    `values(**attributes)`, of the shape `shape(**attributes)` gives without making it: folded to a
    constant, or (past the folding limit) computed by its kernel and copied to the device."""

    flops = staticmethod(no_flops)

    def __init__(self, op, shape, values, inputs, since=17):
        self.op, self.shape, self.values, self.since = op, shape, values, since
        self.attr_inputs = tuple((name, k, since) for k, name in enumerate(inputs))
        self.defaults = {**dict.fromkeys(inputs), "output_datatype": 1, **({"periodic": 1} if len(inputs) == 1 else {})}

    def arguments(self, node):
        args = super().arguments(node)
        for name, _, _ in self.attr_inputs:
            if args[name] is None:
                raise ShapeError(f"input {name} is required")
            args[name] = scalar(args[name], name)
        return args

    def infer(self, node, ins):
        return [(self.shape(**self.arguments(node)), from_onnx(self.attr(node, "output_datatype")))]

    def evaluate(self, node):
        return [self.values(**self.arguments(node)).astype(from_onnx(self.attr(node, "output_datatype")))]

    def kernel(self, xp, step, ins, outs, ws):
        self.evaluate_into(xp, step, ins, outs)


def _window_shape(size, periodic, output_datatype):
    """The shape (size,) of a window."""
    if size < 0:
        raise ShapeError(f"size {size} is negative")
    return (size,)


def _cosine_window(*coefficients):
    """values(size, periodic, output_datatype) of a window sum_k a_k cos(2 pi k n / N), N the size
    (periodic) or the size less one (symmetric)."""
    def values(size, periodic, output_datatype):
        angle = 2 * np.pi * np.arange(size) / (size if periodic else size - 1)
        return sum(a * np.cos(k * angle) for k, a in enumerate(coefficients))
    return values


def _mel_shape(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, output_datatype):
    """The shape (dft_length // 2 + 1, num_mel_bins) of MelWeightMatrix, its arguments checked."""
    if num_mel_bins < 0 or dft_length < 1 or sample_rate <= 0 or not 0 <= lower_edge_hertz < upper_edge_hertz:
        raise ShapeError(f"num_mel_bins {num_mel_bins} must be at least 0, dft_length {dft_length} positive, sample_rate "
                         f"{sample_rate} too, and 0 <= lower_edge_hertz {lower_edge_hertz} < upper_edge_hertz "
                         f"{upper_edge_hertz}")
    return (dft_length // 2 + 1, num_mel_bins)


def _mel_weights(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, output_datatype):
    """(dft_length // 2 + 1, num_mel_bins) triangular filters, evenly spaced in mel between the edges
    (the ONNX reference's construction)."""
    low, high = (2595 * np.log10(1 + f / 700) for f in (lower_edge_hertz, upper_edge_hertz))
    mels = np.arange(num_mel_bins + 2) * ((high - low) / (num_mel_bins + 2)) + low
    edges = (((dft_length + 1) * (700 * (10 ** (mels / 2595) - 1))) // sample_rate).astype(int)
    out = np.zeros(_mel_shape(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                              output_datatype))
    for i, (left, centre, right) in enumerate(zip(edges, edges[1:], edges[2:])):
        if centre == left:
            out[centre, i] = 1
        else:
            out[left:centre + 1, i] = (np.arange(left, centre + 1) - left) / (centre - left)
        if right > centre:
            out[centre:right, i] = (right - np.arange(centre, right)) / (right - centre)
    return out


def dft_matrix(channels, n, length, inverse, onesided):
    """The real matrix (channels * n, 2 * bins), or (channels * n, length) for the inverse of a one-sided
    spectrum, mapping a signal's real parts then imaginary parts (n of each, truncated or zero-padded to
    `length`) to its transform's real parts then imaginary parts."""
    k = np.arange(n)[:, None]
    if inverse and onesided:  # irfft: bins past length // 2 are the others' conjugates
        used = (k <= length // 2).astype(np.float64)
        twice = np.where((k == 0) | (2 * k == length), 1.0, 2.0) * used / length
        angle = 2 * np.pi * (k * np.arange(length)[None] % length) / length
        return np.concatenate([twice * np.cos(angle), -twice * np.sin(angle)][:channels])
    bins = length // 2 + 1 if onesided else length
    used = (k < length).astype(np.float64) / (length if inverse else 1)
    angle = 2 * np.pi * (k * np.arange(bins)[None] % length) / length
    cos, sin = used * np.cos(angle), (1 if not inverse else -1) * used * np.sin(angle)
    real = np.concatenate([cos, -sin], axis=1)
    return np.concatenate([real, np.concatenate([sin, cos], axis=1)][:channels])


def transformed(b, x, shape, a, matrix, out_channels, like):
    """`x` (of `shape`, its last dim real/imaginary) times `matrix` along axis `a`: the other dims first,
    then channels and the axis flattened into one for the MatMul, then put back."""
    rank, channels = len(shape), shape[-1]
    others = [d for d in range(rank - 1) if d != a]
    flat = b.op("Reshape", b.op("Transpose", x, perm=[*others, rank - 1, a]),
                shape=[*(shape[d] for d in others), channels * shape[a]])
    y = b.op("MatMul", flat, b.const(matrix, like))
    bins = matrix.shape[1] // out_channels
    y = b.op("Reshape", y, shape=[*(shape[d] for d in others), out_channels, bins])
    back = [rank - 1 if d == a else others.index(d) for d in range(rank - 1)]
    return b.op("Transpose", y, perm=[*back, rank - 2])


class DFT(Composite):
    """DFT along `axis` of a real (last dim 1) or complex (last dim 2) signal, zero-padded or truncated
    to dft_length; `onesided` keeps the bins up to length // 2 (the inverse then reads such a half and
    gives a real signal); `inverse` divides by the length. Opset 17 takes `axis` as an attribute
    (default 1), opset 20 as an input (default -2)."""

    arity = None
    ranks = "same"

    def __init__(self, since, axis, attr_inputs):
        super().__init__("DFT", None, {"dft_length": None, "axis": axis, "inverse": 0, "onesided": 0}, since=since)
        self.attr_inputs, self.parts = attr_inputs, self.build

    def sizes(self, node, shape):
        """(axis, signal length, dft length, output length along the axis, output channels)."""
        a = to_axis(scalar(self.attr(node, "axis"), "axis"), len(shape))
        if len(shape) < 2 or shape[-1] not in (1, 2) or a == len(shape) - 1:
            raise ShapeError(f"the input must be (..., signal..., 1 or 2), the axis {a} not its last, got {shape}")
        inverse, onesided, n = self.attr(node, "inverse"), self.attr(node, "onesided"), shape[a]
        length = self.attr(node, "dft_length")
        length = scalar(length, "dft_length") if length is not None else 2 * (n - 1) if inverse and onesided else n
        if length < 1:
            raise ShapeError(f"dft_length {length} must be positive")
        if inverse and onesided:
            return a, n, length, length, 1
        return a, n, length, length // 2 + 1 if onesided else length, 2

    def infer(self, node, ins):
        shape = ins[0].shape
        a, _, _, bins, channels = self.sizes(node, shape)
        return [(tuple(bins if d == a else s for d, s in enumerate(shape[:-1])) + (channels,), ins[0].dtype)]

    def build(self, b, node, x, dft_length, axis, inverse, onesided):
        shape = b.shape(x)
        a, n, length, bins, channels = self.sizes(node, shape)
        constant_shape(node, "its DFT matrix", shape[-1] * n, bins * channels)
        return transformed(b, x, shape, a, dft_matrix(shape[-1], n, length, inverse, onesided), channels, x)


class STFT(Composite):
    """STFT (opset 17): the DFT of each frame of the signal (batch, length, 1 or 2), frame_length samples
    every frame_step, times the window where given: (batch, frames, bins, 2), bins frame_length // 2 + 1
    when onesided. Planned as a Gather of the frames, the window's Mul and the DFT's MatMul."""

    arity = None
    ranks = None
    attr_inputs = (("frame_step", 1, 17), ("frame_length", 3, 17))

    def __init__(self):
        super().__init__("STFT", None, {"frame_step": None, "frame_length": None, "onesided": 1}, since=17)

    def sizes(self, node, signal, window):
        """(frames, frame length, bins)."""
        if len(signal) != 3 or signal[-1] not in (1, 2):
            raise ShapeError(f"the signal must be (batch, length, 1 or 2), got {signal}")
        step, length = self.attr(node, "frame_step"), self.attr(node, "frame_length")
        if step is None:
            raise ShapeError("input frame_step is required")
        step = scalar(step, "frame_step")
        length = scalar(length, "frame_length") if length is not None else window[0] if window else signal[1]
        if window is not None and tuple(window) != (length,):
            raise ShapeError(f"the window must be ({length},), one value per sample of a frame, got {tuple(window)}")
        if step < 1 or not 1 <= length <= signal[1]:
            raise ShapeError(f"frame_step {step} must be positive and frame_length {length} from 1 to the signal's "
                             f"length {signal[1]}")
        return 1 + (signal[1] - length) // step, length, length // 2 + 1 if self.attr(node, "onesided") else length

    def infer(self, node, ins):
        signal, window = ins[0], (ins[2] if len(ins) > 2 else None)
        frames, _, bins = self.sizes(node, signal.shape, window and window.shape)
        return [((signal.shape[0], frames, bins, 2), signal.dtype)]

    def decompose(self, b, node):
        """As Composite's, the window cast along with the signal; the frames picked by a Gather."""
        signal, window = node.inputs[0], (node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None)
        dtype = b.dtype(signal)
        wide = self.accumulation(dtype)
        if wide != dtype:
            signal, window = b.cast(signal, wide), window and b.cast(window, wide)
        shape = b.shape(signal)
        frames, length, bins = self.sizes(node, shape, window and b.shape(window))
        constant_shape(node, "the indices of its frames", frames, length)
        constant_shape(node, "its DFT matrix", shape[-1] * length, 2 * bins)
        starts = np.arange(frames)[:, None] * scalar(self.attr(node, "frame_step"), "frame_step") + np.arange(length)
        picked = b.op("Gather", signal, int_const(b, starts, signal), axis=1)
        if window:
            picked = b.op("Mul", picked, b.op("Reshape", window, shape=[1, 1, length, 1]))
        matrix = dft_matrix(shape[-1], length, length, 0, self.attr(node, "onesided"))
        y = transformed(b, picked, (shape[0], frames, length, shape[-1]), 2, matrix, 2, signal)
        return [b.cast(y, dtype) if wide != dtype else y]


class Det(Schema):
    """Det: the determinant of each M x M matrix of the input's last two dims, by Gaussian elimination
    with partial pivoting over the whole batch at once: each column's pivot row is swapped in through a
    one-hot row selector (no fancy indexing, so nothing is allocated), then eliminated below."""

    op = "Det"
    mirror = False

    def infer(self, node, ins):
        x = ins[0]
        if x.rank < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"the input must be (..., M, M), square matrices, got {x.shape}")
        return [(x.shape[:-2], x.dtype)]

    def flops(self, node, ins, outs):
        """About (2/3) M^3 per matrix, as LU takes."""
        m = ins[0].shape[-1]
        return 2 * m ** 3 // 3 * math.prod(ins[0].shape[:-2])

    def workspace(self, node, ins, outs, limit):
        """`lu` the matrices being eliminated and `update` one step's change, (B, M, M); `select` the pivot
        rows one-hot, `row`, `swap` and `mark` (B, M); `pivot` (B,) and `ramp` 0..M-1; `det`, `value`
        and `flag` (B,). Not chunked: the elimination needs every matrix whole."""
        shape, work = ins[0].shape, self.accumulation(ins[0].dtype)
        b, m = math.prod(shape[:-2]), shape[-1]
        if not b * m:
            return Layout()
        return Layout.pack(("lu", (b, m, m), work), ("update", (b, m, m), work), ("select", (b, m), work),
                           ("row", (b, m), work), ("swap", (b, m), work), ("mark", (b, m), np.bool_),
                           ("pivot", (b,), np.int64), ("ramp", (m,), np.int64), ("det", (b,), work),
                           ("value", (b,), work), ("flag", (b,), np.bool_))

    def kernel(self, xp, step, ins, outs, ws):
        x, y = ins[0], outs[0]
        if not y.size:
            return
        m = x.shape[-1]
        if not m:
            y.fill(1)
            return
        lu, update, select, row, swap = ws["lu"], ws["update"], ws["select"], ws["row"], ws["swap"]
        pivot, ramp, det, value, flag, mark = ws["pivot"], ws["ramp"], ws["det"], ws["value"], ws["flag"], ws["mark"]
        xp.copyto(lu, x.reshape(lu.shape))
        ramp.fill(1)
        xp.cumsum(ramp, out=ramp)
        xp.subtract(ramp, 1, out=ramp)
        det.fill(1)
        for k in range(m):
            xp.absolute(lu[:, k:, k], out=swap[:, k:])
            xp.argmax(swap[:, k:], axis=1, out=pivot)
            xp.add(pivot, k, out=pivot)
            xp.equal(ramp[None, :], pivot[:, None], out=mark)
            xp.copyto(select, mark)
            xp.multiply(select[:, :, None], lu, out=update)
            xp.sum(update, axis=1, out=row)  # the pivot row
            xp.subtract(lu[:, k], row, out=swap)
            xp.multiply(select[:, :, None], swap[:, None, :], out=update)
            xp.add(lu, update, out=lu)  # row k into the pivot's place
            xp.copyto(lu[:, k], row)
            xp.not_equal(pivot, k, out=flag)
            xp.copyto(value, flag)
            xp.multiply(value, -2, out=value)
            xp.add(value, 1, out=value)
            xp.multiply(det, value, out=det)  # a swap flips the sign
            xp.multiply(det, lu[:, k, k], out=det)
            if k == m - 1:
                break
            xp.equal(lu[:, k, k], 0, out=flag)  # a zero pivot (the column is zero: det is 0) divides by 1
            xp.add(lu[:, k, k], flag, out=value)
            below = swap[:, :m - k - 1]
            xp.divide(lu[:, k + 1:, k], value[:, None], out=below)
            change = update[:, :m - k - 1, :m - k]
            xp.multiply(below[:, :, None], lu[:, k, None, k:], out=change)
            xp.subtract(lu[:, k + 1:, k:], change, out=lu[:, k + 1:, k:])
        xp.copyto(y.reshape(-1), det, casting="unsafe")

    def evaluate(self, node, x):
        return [np.linalg.det(x.astype(np.float64)).astype(x.dtype)]

    def gradient(self, b, node, dys):
        """d det(A) / dA[i, j] is the cofactor (-1)^(i + j) det(A without row i and column j): the minors
        gathered from the flattened matrices (M^2 of size (M - 1)^2 each), their Det, signed, times dY."""
        x = node.inputs[0]
        shape = b.shape(x)
        m = shape[-1]
        if not m:
            return [b.op("Mul", x, b.const(0, x))]  # an empty gradient
        constant_shape(node, "the indices of its gradient's minors", m, m, (m - 1) ** 2)
        others = np.arange(m - 1)[None] + (np.arange(m - 1)[None] >= np.arange(m)[:, None])  # row i: all but i
        keep = (others[:, None, :, None] * m + others[None, :, None, :]).reshape(m, m, (m - 1) ** 2)
        flat = b.op("Reshape", x, shape=[*shape[:-2], m * m])
        minors = b.op("Gather", flat, int_const(b, keep.astype(np.int64), x), axis=len(shape) - 2)
        minors = b.op("Reshape", minors, shape=[*shape[:-2], m, m, m - 1, m - 1])
        signs = (-1.0) ** np.add.outer(np.arange(m), np.arange(m))
        cofactors = b.op("Mul", b.op("Det", minors), b.const(signs, x))
        return [b.op("Mul", cofactors, b.op("Unsqueeze", dys[0], axes=[-2, -1]))]

    def torch(self, torch, x):
        return torch.linalg.det(x)


register(DFT(17, 1, (("dft_length", 1, 17),)))
register(DFT(20, -2, (("dft_length", 1, 17), ("axis", 2, 20))))
register(STFT())
register(Det())
register(Generated("HannWindow", _window_shape, _cosine_window(0.5, -0.5), ["size"]))
register(Generated("HammingWindow", _window_shape, _cosine_window(25 / 46, -21 / 46), ["size"]))
register(Generated("BlackmanWindow", _window_shape, _cosine_window(0.42, -0.5, 0.08), ["size"]))
register(Generated("MelWeightMatrix", _mel_shape, _mel_weights,
                   ["num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"]))
