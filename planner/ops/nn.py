"""Convolutions and pooling over the (N, C, spatial...) layout (BatchNormalization and LayerNormalization are in
normalization.py)."""
import functools
import math
from typing import NamedTuple

import numpy as np

from .registry import schema
from .base import Layout, Schema, constant_shape, per_input_element
from .reduce import max_gradient
from .shape_ops import scatter_add_flat
from .torch_forms import torch_pads, unsupported
from ..errors import ShapeError

WINDOW = {"auto_pad": "NOTSET", "strides": None, "dilations": None, "pads": None}


def _window(schema, node, spatial, kernel, ceil_mode=0, transposed=False):
    """Output spatial sizes of a sliding window (Conv, pools) or of its transpose (ConvTranspose).

    `spatial` are the input's spatial sizes and `kernel` the window's; strides, dilations, pads and
    auto_pad come from the node, and for the transpose output_padding and output_shape too.
    """
    n = len(spatial)
    strides = schema.attr(node, "strides") or [1] * n
    dilations = schema.attr(node, "dilations") or [1] * n
    pads = schema.attr(node, "pads") or [0] * 2 * n
    auto_pad = schema.attr(node, "auto_pad")
    if (len(kernel), len(strides), len(dilations), len(pads)) != (n, n, n, 2 * n):
        raise ShapeError(f"kernel {tuple(kernel)}, strides, dilations or pads do not match "
                         f"the {n} spatial dims of the input")
    extra = schema.attr(node, "output_padding") if transposed else None
    for what, values, least in (("kernel_shape", kernel, 1), ("strides", strides, 1), ("dilations", dilations, 1),
                                ("pads", pads, 0), ("output_padding", extra or (), 0)):
        if min(values, default=least) < least:
            raise ShapeError(f"{what} {tuple(values)} must be {'at least 1' if least else 'non-negative'}")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ShapeError(f"auto_pad {auto_pad!r} is not one of NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    if auto_pad != "NOTSET":
        pads = [0] * 2 * n
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if transposed:
        extra = extra or [0] * n
        full = [s * (i - 1) + e + k - pads[j] - pads[n + j]
                for j, (i, s, e, k) in enumerate(zip(spatial, strides, extra, spans))]
        if schema.attr(node, "output_shape"):
            out = list(schema.attr(node, "output_shape")[-n:])
        elif auto_pad.startswith("SAME"):
            out = [min(f, i * s) for f, i, s in zip(full, spatial, strides)]
        else:
            out = full
    elif auto_pad.startswith("SAME"):
        out = [-(-i // s) for i, s in zip(spatial, strides)]
    else:
        out = []
        for j, (i, s, k) in enumerate(zip(spatial, strides, spans)):
            size = (i + pads[j] + pads[n + j] - k + (s - 1 if ceil_mode else 0)) // s + 1
            if ceil_mode and (size - 1) * s >= i + pads[j]:
                size -= 1
            out.append(size)
    if min(out) <= 0:
        raise ShapeError(f"spatial dims {tuple(spatial)} are too small for a window of {tuple(spans)}")
    return out


class Window(NamedTuple):
    """Per spatial dim: stride, dilation, and the padding applied before and after (auto_pad resolved)."""

    strides: tuple
    dilations: tuple
    begin: tuple
    end: tuple


def window(schema, node, in_spatial, kernel, out_spatial, transposed=False):
    """The window of a Conv, ConvTranspose or pool node, its auto_pad padding (or, for a ConvTranspose
    with output_shape, all of its padding) worked out as ONNX does from the input, kernel and output
    spatial sizes."""
    n = len(kernel)
    strides = schema.attr(node, "strides") or [1] * n
    dilations = schema.attr(node, "dilations") or [1] * n
    auto_pad = schema.attr(node, "auto_pad")
    if auto_pad.startswith("SAME") or transposed and schema.attr(node, "output_shape"):
        spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        if transposed:
            extra = schema.attr(node, "output_padding") or [0] * n
            total = [s * (i - 1) + e + k - o for s, i, e, k, o in zip(strides, in_spatial, extra, spans, out_spatial)]
        else:
            total = [max(0, (o - 1) * s + k - i) for o, s, k, i in zip(out_spatial, strides, spans, in_spatial)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    elif auto_pad == "VALID":
        begin = end = [0] * n
    else:
        pads = schema.attr(node, "pads") or [0] * 2 * n
        begin, end = pads[:n], pads[n:]
    return Window(tuple(strides), tuple(dilations), tuple(begin), tuple(end))


def _overhang(win, kernel, grid, source):
    """Per spatial dim, how far the windows of a `grid` of positions reach past the end of the
    `source` they read: positive where they overhang its end padding included, negative where the
    last source positions lie beyond every window."""
    return [s * (g - 1) + (k - 1) * d + 1 - p - i
            for s, g, k, d, p, i in zip(win.strides, grid, kernel, win.dilations, win.begin, source)]


def _spread(b, dy, w, win, over, group):
    """A ConvTranspose of `dy` over the window (`over` from `_overhang`) back to its source's extent:
    the input gradient of a Conv, and of a pool with a ones kernel."""
    return b.op("ConvTranspose", dy, w, strides=list(win.strides), dilations=list(win.dilations), group=group,
                pads=[*win.begin, *(max(e, 0) for e in over)], output_padding=[max(-e, 0) for e in over])


def _correlate(b, signal, ss, kernel, ks, group, win, over, taps):
    """The weight gradient of Conv (signal X, kernel dY) and ConvTranspose (signal dY, kernel X): the sum
    over images and grid positions o of signal[c, o * stride + t * dilation - pad] * kernel[m, o], shaped
    (kernel channels, signal channels / group, *taps), `ss` and `ks` being the shapes of signal and
    kernel. A grouped Conv with images as channels, strides and dilations exchanged, cut to the taps."""
    rest, sg = list(range(3, len(ss) + 1)), ss[1] // group
    signal = b.op("Reshape", b.op("Transpose", b.op("Reshape", signal, shape=[ss[0], group, sg, *ss[2:]]),
                                  perm=[2, 1, 0, *rest]), shape=[sg, group * ss[0], *ss[2:]])
    kernel = b.op("Reshape", b.op("Transpose", b.op("Reshape", kernel, shape=[ks[0], group, ks[1] // group, *ks[2:]]),
                                  perm=[1, 2, 0, *rest]), shape=[ks[1], ks[0], *ks[2:]])
    ends = [max(e, 0) for e in over]
    out = b.op("Conv", signal, kernel, strides=list(win.dilations), dilations=list(win.strides),
               pads=[*win.begin, *ends], group=group)
    sizes = [(i + p + e - (g - 1) * s - 1) // d + 1
             for i, p, e, g, s, d in zip(ss[2:], win.begin, ends, ks[2:], win.strides, win.dilations)]
    return b.op("Transpose", _cut(b, out, sizes, taps), perm=[1, 0, *range(2, len(ss))])


def _cut(b, t, sizes, wanted):
    """`t` (N, C, spatial...) with spatial `sizes`, sliced down to the `wanted` ones."""
    if list(sizes) == list(wanted):
        return t
    return b.op("Slice", t, starts=[0] * len(sizes), ends=list(wanted), axes=list(range(2, len(sizes) + 2)))


def _spatial_input(x):
    if x.rank < 3:
        raise ShapeError(f"input of shape {x.shape} is not (N, C, spatial...)")
    return x.shape[2:]


class Chunks(NamedTuple):
    """How a convolution kernel walks its batch: `images` whole images per chunk and `rows` rows of
    each (all of them unless one image is too big), with a column buffer of `nbytes`."""

    images: int
    rows: int
    nbytes: int


def conv_chunks(batch, rows, row_bytes, limit):
    """The chunking contract of the Conv and ConvTranspose kernels, which the executor follows.

    One group's columns for one image are `rows` rows of `row_bytes` each. The kernel fills the
    buffer with as many whole images as fit in `limit` (at least one, at most the batch); when one
    image alone is larger than `limit`, it takes one image at a time and as many rows as fit (at
    least one). Groups take turns in the same buffer; the last chunk of images or rows may be
    short. So `nbytes` never exceeds `limit`, except when a single row does: then it is one
    row. Chunks are idempotent: `conv_chunks(.., limit=c.nbytes)` gives `c` again, so a kernel
    handed a buffer of exactly the planned size finds the planned chunks.
    """
    per_image = rows * row_bytes
    if per_image <= limit:
        images = max(1, min(batch, limit // per_image)) if per_image else max(1, batch)
        return Chunks(images, rows, min(images, batch) * per_image)
    take = max(1, limit // row_bytes)
    return Chunks(1, take, take * row_bytes)


PRODUCTS = 1 << 20
"""Bytes a depthwise conv's products may take beyond its columns' size: the columns of a small depthwise
layer are a few KiB, and products cut that fine (one row of one image) cost more in NumPy's per-call
overhead than in arithmetic (a 576-channel 14x14 layer at batch 8: 2,000 calls)."""


@schema("Conv")
class Conv(Schema):
    """Conv: X (N, C, ...), W (M, C/group, k...), optional bias B (M,).

    The kernel is im2col + GEMM, one group at a time: a group's columns for one image are
    C/group * prod(kernel) * prod(output spatial) elements, a row being one index of the first
    output spatial dim. ConvTranspose is GEMM + col2im with C_out/group * prod(kernel) *
    prod(input spatial) elements, rows over the first input spatial dim. Either way the column
    count is W.shape[1] * prod(kernel) per pixel of the GEMM's grid.
    """

    autocast = "low"
    ranks = "same"
    mirror = False
    defaults = {**WINDOW, "kernel_shape": None, "group": 1}
    transposed = False

    def workspace(self, node, ins, outs, limit):
        """The column buffer of one chunk, chunked to fit `limit` (see `conv_chunks` for when one row
        exceeds it): `columns`, raw bytes shaped (images, rows, bytes of a row) by the chunk; for a
        depthwise conv `product` instead, one tap's products for the chunk's outputs."""
        c = self.chunks(node, ins, outs, limit)
        if not c.nbytes:
            return Layout()
        name = "product" if self.depthwise(node, ins[1]) else "columns"
        return Layout.pack((name, (c.images, c.rows, c.nbytes // (c.images * c.rows)), np.uint8))

    def depthwise(self, node, w):
        """Whether each group reads one input channel (a depthwise conv, MobileNet's): the kernel then
        works every channel at once, tap by tap, instead of a GEMM per group, its products in no more
        scratch than the columns would take or PRODUCTS (at least one row of outputs)."""
        return not self.transposed and w.shape[1] == 1 and self.attr(node, "group") > 1

    def flops(self, node, ins, outs):
        """2 per multiply-add: each output element (input element, for ConvTranspose) meets
        W.shape[1] * prod(kernel) weights; and one per output element for the bias."""
        x, w, bias = [*ins, None][:3]
        y = outs[0][0]
        pixels = math.prod(x.shape) if self.transposed else math.prod(y)
        return 2 * pixels * math.prod(w.shape[1:]) + (math.prod(y) if bias is not None else 0)

    def gradient(self, b, node, dys):
        """Conv and ConvTranspose give each other's input gradient, with the same weights, window and
        groups; the weight gradient correlates the input with dY (`_correlate`); dB sums dY. auto_pad
        and output_padding become explicit extents, worked out from the shapes."""
        x, w, *bias = node.inputs
        dy, xs, ws, ys = dys[0], b.shape(x), b.shape(w), b.shape(node.outputs[0])
        group, n = self.attr(node, "group"), len(xs) - 2
        win = window(self, node, xs[2:], ws[2:], ys[2:], self.transposed)
        grid, source = (xs, ys) if self.transposed else (ys, xs)
        over = _overhang(win, ws[2:], grid[2:], source[2:])
        if self.transposed:
            ends = [max(e, 0) for e in over]
            dx = b.op("Conv", dy, w, strides=list(win.strides), dilations=list(win.dilations),
                      pads=[*win.begin, *ends], group=group)
            dx = _cut(b, dx, [(i + p + e - (k - 1) * d - 1) // s + 1 for i, p, e, k, d, s in
                              zip(ys[2:], win.begin, ends, ws[2:], win.dilations, win.strides)], xs[2:])
            grads = [dx, _correlate(b, dy, ys, x, xs, group, win, over, ws[2:])]
        else:
            grads = [_spread(b, dy, w, win, over, group), _correlate(b, x, xs, dy, ys, group, win, over, ws[2:])]
        if bias and bias[0]:
            grads.append(b.op("ReduceSum", dy, axes=[0, *range(2, n + 2)], keepdims=0))
        return grads

    def chunks(self, node, ins, outs, limit):
        """The Chunks the kernel uses under `limit`; nbytes == 0 means no columns at all (a pointwise
        conv runs the GEMM on the images themselves).

        `node` is anything holding the op's `attrs` (a Node, a plan Step); `ins` anything with
        .shape and .dtype (Info, arrays); `outs` (shape, dtype) pairs.
        """
        x, w = ins[0], ins[1]
        kernel, out_spatial = w.shape[2:], tuple(outs[0][0][2:])
        if self._pointwise(node, kernel, x.shape[2:], out_spatial):
            return Chunks(max(1, x.shape[0]), out_spatial[0], 0)
        grid = x.shape[2:] if self.transposed else out_spatial
        pixels, item = math.prod(grid[1:]), np.dtype(x.dtype).itemsize
        columns = conv_chunks(x.shape[0], grid[0], w.shape[1] * math.prod(kernel) * pixels * item, limit)
        if not self.depthwise(node, w):
            return columns
        return conv_chunks(x.shape[0], grid[0], w.shape[0] * pixels * item,
                           min(limit, max(columns.nbytes, PRODUCTS)))

    def _pointwise(self, node, kernel, in_spatial, out_spatial):
        """Whether each output pixel reads only the input pixel at its own place: a kernel of one tap
        (so dilation is moot), stride 1, no padding, and the output as large as the input."""
        n = len(kernel)
        pads = self.attr(node, "pads") if self.attr(node, "auto_pad") == "NOTSET" else None
        return all(k == 1 for k in kernel) and all(s == 1 for s in self.attr(node, "strides") or [1] * n) \
            and not any(pads or ()) and tuple(in_spatial) == out_spatial

    def infer(self, node, ins):
        x, w, b = [*ins, None][:3]
        spatial, group = _spatial_input(x), self.attr(node, "group")
        kernel = self.attr(node, "kernel_shape") or w.shape[2:]
        if w.rank != x.rank or tuple(kernel) != w.shape[2:]:
            raise ShapeError(f"weight of shape {w.shape} does not match input {x.shape} and kernel {tuple(kernel)}")
        if group < 1:
            raise ShapeError(f"group {group} must be at least 1")
        c_in, c_out = (w.shape[0], w.shape[1] * group) if self.transposed else (w.shape[1] * group, w.shape[0])
        if x.shape[1] != c_in or x.shape[1] % group or c_out % group:
            raise ShapeError(f"input {x.shape} and weight {w.shape} do not agree on channels for group={group}")
        if b is not None and b.shape != (c_out,):
            raise ShapeError(f"bias of shape {b.shape} must be ({c_out},)")
        out = _window(self, node, spatial, kernel, transposed=self.transposed)
        return [((x.shape[0], c_out, *out), x.dtype)]

    def torch_node(self, torch, run, node, ins):
        """F.conv*d, asymmetric padding applied beforehand."""
        f, (x, w, b) = torch.nn.functional, [*ins, None][:3]
        win = window(self, node, x.shape[2:], w.shape[2:], run.shape(node.outputs[0])[2:])
        padding = win.begin
        if win.begin != win.end:
            x, padding = f.pad(x, torch_pads(win.begin, win.end)), 0
        return getattr(f, f"conv{x.ndim - 2}d")(x, w, b, win.strides, padding, win.dilations, self.attr(node, "group"))


@schema("ConvTranspose")
class ConvTranspose(Conv):
    """ConvTranspose: X (N, C, ...), W (C, M/group, k...), optional bias B (M,)."""

    defaults = {**Conv.defaults, "output_padding": None, "output_shape": None}
    transposed = True

    def torch_node(self, torch, run, node, ins):
        """F.conv_transpose*d unpadded, then cut (or zero-extended, for output_padding) to the planned output."""
        f, (x, w, b) = torch.nn.functional, [*ins, None][:3]
        out = run.shape(node.outputs[0])[2:]
        win = window(self, node, x.shape[2:], w.shape[2:], out, transposed=True)
        y = getattr(f, f"conv_transpose{x.ndim - 2}d")(x, w, None, win.strides, 0, 0, self.attr(node, "group"),
                                                         win.dilations)
        extra = [max(0, bg + o - n) for bg, o, n in zip(win.begin, out, y.shape[2:])]
        y = f.pad(y, torch_pads([0] * len(out), extra))
        y = y[(slice(None), slice(None), *(slice(bg, bg + o) for bg, o in zip(win.begin, out)))]
        return y if b is None else y + b.reshape(-1, *[1] * len(out))


def _native(win, kernel):
    """Whether PyTorch's pools take the window's padding themselves: even, at most half the kernel."""
    return win.begin == win.end and all(2 * p <= k for p, k in zip(win.begin, kernel))


class _Pool(Schema):
    ranks = "same"

    def flops(self, node, ins, outs):
        """One per tap of each output's window."""
        return math.prod(outs[0][0]) * math.prod(self.attr(node, "kernel_shape"))

    def infer(self, node, ins):
        x = ins[0]
        out = _window(self, node, _spatial_input(x), self.attr(node, "kernel_shape"), self.attr(node, "ceil_mode"))
        return [((*x.shape[:2], *out), x.dtype)]


@schema("AveragePool")
class AveragePool(_Pool):
    defaults = {**WINDOW, "ceil_mode": 0, "count_include_pad": 0}

    def counts(self, node, win, kernel, in_spatial, out_spatial):
        """Per spatial dim, how many taps each output position averages: those on the input, and on
        the padding too when count_include_pad (never the overhang ceil_mode adds)."""
        include, counts = self.attr(node, "count_include_pad"), []
        for k, s, dil, b, e, i, o in zip(kernel, *win, in_spatial, out_spatial):
            low, high = (-b, i + e) if include else (0, i)
            start = np.arange(o) * s - b  # the taps t from 0 to k - 1 with low <= start + t * dil < high
            first, end = np.maximum(0, -((start - low) // dil)), np.minimum(k, -((start - high) // dil))
            counts.append(np.clip(end - first, 0, None))
        return counts

    def gradient(self, b, node, dys):
        """dY over each output's count, spread back over its window: a ConvTranspose with a kernel of
        ones, images and channels folded into its batch."""
        x = node.inputs[0]
        xs, ys, kernel = b.shape(x), b.shape(node.outputs[0]), self.attr(node, "kernel_shape")
        win = window(self, node, xs[2:], kernel, ys[2:])
        constant_shape(node, "the counts of its windows", *ys[2:])
        constant_shape(node, "its gradient's kernel of ones", *kernel)
        counts = functools.reduce(np.multiply, np.ix_(*self.counts(node, win, kernel, xs[2:], ys[2:])))
        folded = b.op("Mul", b.op("Reshape", dys[0], shape=[xs[0] * xs[1], 1, *ys[2:]]), b.const(1 / counts, x))
        dx = _spread(b, folded, b.const(np.ones((1, 1, *kernel)), x), win, _overhang(win, kernel, ys[2:], xs[2:]), 1)
        return [b.op("Reshape", dx, shape=list(xs))]

    def torch_node(self, torch, run, node, ins):
        """F.avg_pool*d; with padding it cannot take, the padded input's window means over those of a mask of
        the values the count includes (the divisors cancel), cut to the planned output."""
        f, x, y = torch.nn.functional, ins[0], run.shape(node.outputs[0])
        kernel = self.attr(node, "kernel_shape")
        win = window(self, node, x.shape[2:], kernel, y[2:])
        if set(win.dilations) != {1}:
            raise unsupported(f"{node.op} with dilations")
        pool = getattr(f, f"avg_pool{x.ndim - 2}d")
        ceil, include = bool(self.attr(node, "ceil_mode")), bool(self.attr(node, "count_include_pad"))
        if _native(win, kernel):
            return pool(x, kernel, win.strides, win.begin, ceil, include)
        pads = torch_pads(win.begin, win.end)
        mask = f.pad(torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device), pads, value=float(include))
        out = pool(f.pad(x, pads), kernel, win.strides, 0, ceil) / pool(mask, kernel, win.strides, 0, ceil)
        return out[(slice(None), slice(None), *(slice(0, n) for n in y[2:]))]


@schema("MaxPool")
class MaxPool(_Pool):
    """MaxPool; its optional second output holds the int64 flat indices of the maxima."""

    defaults = {**WINDOW, "ceil_mode": 0, "storage_order": 0}

    def infer(self, node, ins):
        y = super().infer(node, ins)[0]
        return [y, (y[0], np.int64)]

    def gradient(self, b, node, dys):
        """dY added at the input element each output took, by its Indices (the first maximum in window
        order wins ties): the node's own when it has them with storage_order 0, else a MaxPool's redone."""
        if dys[0] is None:
            return [None]
        x, indices = node.inputs[0], node.outputs[1:2]
        if not (indices and indices[0]) or self.attr(node, "storage_order"):
            indices = b.op("MaxPool", x, outputs=2, **{**node.attrs, "storage_order": 0})[1:]
        return [scatter_add_flat(b, indices[0], dys[0], b.shape(x), b.dtype(x))]

    def workspace(self, node, ins, outs, limit):
        """With Indices, `mask`: one bool per output value to mark where a tap holds the maximum, for as
        many whole images as fit in `limit` (at least one)."""
        if len(outs) < 2 or outs[1] is None:
            return Layout()
        shape = outs[1][0]
        per_image = math.prod(shape[1:])
        images = max(1, min(shape[0], limit // per_image if per_image else 1))
        return Layout.pack(("mask", (images, *shape[1:]), np.bool_))

    def torch_node(self, torch, run, node, ins):
        """F.max_pool*d; asymmetric or wide padding applied beforehand as -inf."""
        f, x, y = torch.nn.functional, ins[0], run.shape(node.outputs[0])
        kernel = self.attr(node, "kernel_shape")
        win = window(self, node, x.shape[2:], kernel, y[2:])
        if len(node.outputs) > 1 and node.outputs[1]:
            raise unsupported(f"{node.op} with Indices")
        padding = win.begin
        if not _native(win, kernel):
            x, padding = f.pad(x, torch_pads(win.begin, win.end), value=-math.inf), 0
        out = getattr(f, f"max_pool{x.ndim - 2}d")(x, kernel, win.strides, padding, win.dilations,
                                                   bool(self.attr(node, "ceil_mode")))
        return out[(slice(None), slice(None), *(slice(0, n) for n in y[2:]))]


@schema("GlobalAveragePool", "GlobalMaxPool")
class GlobalPool(Schema):
    """Global average or max pooling: one value per channel over all spatial dims."""

    ranks = "same"
    flops = per_input_element(1)

    def infer(self, node, ins):
        x = ins[0]
        if not math.prod(x.shape[2:]) and math.prod(x.shape[:2]):
            raise ShapeError(f"it pools each channel over spatial dims {x.shape[2:]}, which hold no values")
        return [((*x.shape[:2], *(1 for _ in _spatial_input(x))), x.dtype)]

    def gradient(self, b, node, dys):
        """Average: dY spread evenly over the spatial dims; max: see `max_gradient`."""
        x = node.inputs[0]
        shape = b.shape(x)
        if node.op == "GlobalMaxPool":
            return [max_gradient(b, x, node.outputs[0], dys[0], list(range(2, len(shape))))]
        spread = b.op("Expand", dys[0], shape=list(shape))
        return [b.op("Mul", spread, b.const(1 / math.prod(shape[2:]), x))]

    def torch_node(self, torch, run, node, ins):
        dims = tuple(range(2, ins[0].ndim))
        return ins[0].mean(dims, keepdim=True) if node.op == "GlobalAveragePool" else ins[0].amax(dims, keepdim=True)
