"""DeformConv: a convolution whose taps each output position moves by its own offsets (and scales by an
optional mask), sampling the input multilinearly, zero outside it, as GridSample with align_corners does."""
import itertools
import math

import numpy as np

from .registry import schema
from .base import Layout, Schema, constant_shape, same_dtype
from .sampling import front, take_columns, work_dtype
from ..errors import ShapeError, UnsupportedOpError


@schema("DeformConv", since=19)
class DeformConv(Schema):
    """DeformConv (opsets 19, 22): Y[n, o] = B[o] + sum over the channels c of o's group and the taps k of
    W[o, c, k] * mask[n, g, k] * X[n, c] sampled at p * strides - pads + k * dilations + offset[n, g, k],
    g the offset group of c; offset is (N, offset_group * taps * r, out...), mask (N, offset_group * taps,
    out...).

    The kernel takes a chunk of output positions at a time: per axis, the taps' sample positions and
    their floors, then per corner of the sample cell one gather of its offset group's channels, weighted,
    into the columns (channels, taps, positions) that each group's weights multiply. Its gradient is that
    of its parts (`decompose`: GridSample, Mul, MatMul), for X, W, offset, B and mask."""

    autocast = "low"
    mirror = False
    defaults = {"dilations": None, "group": 1, "kernel_shape": None, "offset_group": 1, "pads": None,
                "strides": None}

    def geometry(self, node, x_shape, w_shape):
        """(kernel, strides, dilations, pads, output's spatial shape), the defaults filled in."""
        r = len(x_shape) - 2
        kernel = tuple(self.attr(node, "kernel_shape") or w_shape[2:])
        strides = tuple(self.attr(node, "strides") or (1,) * r)
        dilations = tuple(self.attr(node, "dilations") or (1,) * r)
        pads = tuple(self.attr(node, "pads") or (0,) * 2 * r)
        if (len(strides), len(dilations), len(pads)) != (r, r, 2 * r) or kernel != tuple(w_shape[2:]):
            raise ShapeError(f"kernel_shape {kernel}, strides {strides}, dilations {dilations} or pads {pads} do "
                             f"not match X {tuple(x_shape)} and W {tuple(w_shape)}")
        if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
            raise ShapeError(f"strides {strides} and dilations {dilations} must be positive, pads {pads} not negative")
        out = tuple((i + b + e - (k - 1) * d - 1) // s + 1
                    for i, b, e, k, d, s in zip(x_shape[2:], pads, pads[r:], kernel, dilations, strides))
        if min(out) < 1:
            raise ShapeError(f"the kernel {kernel} dilated by {dilations} does not fit X {tuple(x_shape)} padded by "
                             f"{pads}")
        return kernel, strides, dilations, pads, out

    def infer(self, node, ins):
        x, w, offset, bias, mask = [*ins, None, None][:5]
        if x.rank < 3 or w.rank != x.rank:
            raise ShapeError(f"X {x.shape} must be (N, C, spatial...) and W {w.shape} (M, C / group, kernel...)")
        group, offset_group = self.attr(node, "group"), self.attr(node, "offset_group")
        (n, c), m = x.shape[:2], w.shape[0]
        if group < 1 or offset_group < 1 or c != w.shape[1] * group or m % group or c % offset_group:
            raise ShapeError(f"X's {c} channels must be W's {w.shape[1]} per group times group {group}, W's {m} "
                             f"outputs a multiple of it, and the channels a multiple of offset_group {offset_group}")
        kernel, _, _, _, out = self.geometry(node, x.shape, w.shape)
        taps = offset_group * math.prod(kernel)
        if offset.shape != (n, taps * len(kernel), *out):
            raise ShapeError(f"offset {offset.shape} must be {(n, taps * len(kernel), *out)}")
        if mask is not None and mask.shape != (n, taps, *out):
            raise ShapeError(f"mask {mask.shape} must be {(n, taps, *out)}")
        if bias is not None and bias.shape != (m,):
            raise ShapeError(f"B {bias.shape} must have one value per output channel {m}")
        if c and n * m * math.prod(out) and not math.prod(x.shape[2:]):
            raise ShapeError(f"X {x.shape} has no pixels to sample (onnxruntime refuses it too)")
        return [((n, m, *out), same_dtype(ins))]

    def workspace(self, node, ins, outs, limit):
        """Per chunk of output positions (the most `limit` holds): `base` their positions per axis; per
        axis, tap and position the sample's `pos`ition (then its fraction past the floor), `near` (one
        minus it) and `index` (its floor); per tap and position the cell corner's `corner`, `flat` index,
        weight `w` and `inside`; `gather` (and `term` for narrow floats) one offset group's channels at
        one corner; `cols` (C, taps, positions) and `acc` one group's outputs, in the work dtype. Whole:
        `ramp` 0, 1, ..., `at` integer scratch, `taps` each tap's place per axis, and `weights` W in
        the work dtype for narrow floats."""
        (shape, dtype), (x, w) = outs[0], ins[:2]
        if not math.prod(shape):
            return Layout()
        kernel, _, _, _, out = self.geometry(node, x.shape, w.shape)
        r, k, c, m = len(kernel), math.prod(kernel), x.shape[1], w.shape[0]
        per_group, outputs = c // self.attr(node, "offset_group"), m // self.attr(node, "group")
        work = work_dtype(self, dtype)
        narrow, size = work != dtype, work.itemsize
        weights = m * w.shape[1] * k * size if narrow else 0
        per_position = (r * k * (2 * size + 8) + k * (16 + size + 1) + per_group * k * (dtype.itemsize + narrow * size)
                        + c * k * size + outputs * size + r * size + 8)
        chunk = max(1, min(math.prod(out), (limit - weights - 16 * k) // per_position))
        return Layout.pack(
            ("ramp", (max(chunk, k),), np.int64), ("at", (max(chunk, k),), np.int64), ("taps", (r, k), work),
            ("base", (r, chunk), work), ("pos", (r, k, chunk), work), ("near", (r, k, chunk), work),
            ("index", (r, k, chunk), np.int64), ("corner", (k, chunk), np.int64), ("flat", (k, chunk), np.int64),
            ("w", (k, chunk), work), ("inside", (k, chunk), np.bool_), ("gather", (per_group, k * chunk), dtype),
            ("term", (per_group, k * chunk), work) if narrow else None, ("cols", (c, k, chunk), work),
            ("acc", (outputs, chunk), work), ("weights", (m, w.shape[1] * k), work) if narrow else None)

    def flops(self, node, ins, outs):
        """The products with W (2 per weight and output), and 3 per corner of each sample of each channel."""
        (n, m, *out), w, x = outs[0][0], ins[1].shape, ins[0].shape
        samples = n * x[1] * math.prod(w[2:]) * math.prod(out)
        return 2 * n * m * math.prod(out) * math.prod(w[1:]) + 3 * 2 ** len(out) * samples

    def kernel(self, xp, step, ins, outs, ws):
        x, w, offset, bias, mask = [*ins, None, None][:5]
        y = outs[0]
        if not y.size:
            return
        kernel, strides, dilations, pads, out = self.geometry(step, x.shape, w.shape)
        r, (n, c), spatial = len(kernel), x.shape[:2], x.shape[2:]
        groups, group = step.attrs["offset_group"], step.attrs["group"]
        k, positions, m, per_group = math.prod(kernel), math.prod(out), w.shape[0], w.shape[1]
        outputs, chunk = m // group, ws["base"].shape[1]
        ramp, at, taps = ws["ramp"], ws["at"], ws["taps"]
        ramp.fill(1)
        xp.cumsum(ramp, out=ramp)
        xp.subtract(ramp, 1, out=ramp)
        for d in range(r):
            self.coordinate(xp, ramp[:k], at[:k], 0, math.prod(kernel[d + 1:]), kernel[d], dilations[d], 0, taps[d])
        weights = w.reshape(m, per_group * k)
        if "weights" in ws:
            xp.copyto(ws["weights"], weights)
            weights = ws["weights"]
        offsets = offset.reshape(n, groups, k, r, positions)
        masks = None if mask is None else mask.reshape(n, groups, k, positions)
        images, ys = x.reshape(n, groups, c // groups, math.prod(spatial)), y.reshape(n, m, positions)
        for p0 in range(0, positions, chunk):
            p = min(chunk, positions - p0)
            base = front(ws["base"], (r, p))
            for d in range(r):
                self.coordinate(xp, ramp[:p], at[:p], p0, math.prod(out[d + 1:]), out[d], strides[d], -pads[d], base[d])
            cols, acc = front(ws["cols"], (c, k, p)), front(ws["acc"], (outputs, p))
            for b in range(n):
                for g in range(groups):
                    self.sample(xp, ws, images[b, g], offsets[b, g, :, :, p0:p0 + p],
                                None if masks is None else masks[b, g, :, p0:p0 + p], base, spatial,
                                cols[g * (c // groups):(g + 1) * (c // groups)].reshape(c // groups, k * p))
                for q in range(group):
                    rows = slice(q * outputs, (q + 1) * outputs)
                    xp.matmul(weights[rows], cols[q * per_group:(q + 1) * per_group].reshape(per_group * k, p), out=acc)
                    if bias is not None:
                        xp.add(acc, bias[rows, None], out=acc)
                    xp.copyto(ys[b, rows, p0:p0 + p], acc, casting="unsafe")

    @staticmethod
    def coordinate(xp, ramp, at, start, inner, size, scale, shift, out):
        """out = ((start + ramp) // inner % size) * scale + shift: one axis's place of flat positions."""
        xp.add(ramp, start, out=at)
        xp.floor_divide(at, inner, out=at)
        xp.remainder(at, size, out=at)
        xp.multiply(at, scale, out=at)
        xp.add(at, shift, out=at)
        xp.copyto(out, at, casting="unsafe")

    @staticmethod
    def sample(xp, ws, image, offsets, mask, base, spatial, cols):
        """cols (channels, taps * positions) = mask times `image` (channels, pixels) sampled at base + tap +
        offset, each of the 2^r corners of a sample's cell weighted by the product of its axes' fractions
        (0 for a corner outside)."""
        r, (k, _, p) = len(spatial), offsets.shape
        pos, near, index = (front(ws[name], (r, k, p)) for name in ("pos", "near", "index"))
        corner, flat, weight, inside = (front(ws[name], (k, p)) for name in ("corner", "flat", "w", "inside"))
        gather = front(ws["gather"], cols.shape)
        term = gather if "term" not in ws else front(ws["term"], cols.shape)
        for d in range(r):
            xp.add(offsets[:, d], base[d], out=pos[d])
            xp.add(pos[d], ws["taps"][d][:, None], out=pos[d])
            xp.floor(pos[d], out=weight)
            xp.copyto(index[d], weight, casting="unsafe")
            xp.subtract(pos[d], weight, out=pos[d])
            xp.subtract(1, pos[d], out=near[d])
        for number, bits in enumerate(itertools.product((0, 1), repeat=r)):
            for d, bit in enumerate(bits):
                stride = math.prod(spatial[d + 1:])
                xp.add(index[d], bit, out=corner)
                xp.less(corner.view(np.uint64), spatial[d], out=inside)  # 0 <= corner < size
                factor = pos[d] if bit else near[d]
                if d:
                    xp.multiply(weight, factor, out=weight)
                else:
                    xp.copyto(weight, factor)
                xp.multiply(weight, inside, out=weight)
                xp.clip(corner, 0, spatial[d] - 1, out=corner)
                if d:
                    xp.multiply(corner, stride, out=corner)
                    xp.add(flat, corner, out=flat)
                else:
                    xp.multiply(corner, stride, out=flat)
            if mask is not None:
                xp.multiply(weight, mask, out=weight)
            take_columns(xp, image, flat.reshape(-1), gather)
            xp.multiply(gather, weight.reshape(-1), out=term)
            if number:
                xp.add(cols, term, out=cols)
            else:
                xp.copyto(cols, term)

    def decompose(self, b, node):
        """Each tap's samples are one GridSample (linear, zeros, align_corners: pixel coordinates) of each
        offset group's channels at positions normalized by (size - 1), times the mask; then one batched
        MatMul per group with W, plus B. What the gradient goes through. An axis of one pixel gets a
        second of zeros, so that its positions normalize."""
        x, w, offset, bias, mask = [*node.inputs, "", ""][:5]
        n, c, *spatial = b.shape(x)
        kernel, strides, dilations, pads, out = self.geometry(node, b.shape(x), b.shape(w))
        r, k, positions = len(kernel), math.prod(kernel), math.prod(out)
        groups, group, m = self.attr(node, "offset_group"), self.attr(node, "group"), b.shape(w)[0]
        constant_shape(node, "the places of its taps", k, r, positions)
        taps = np.stack(np.meshgrid(*(np.arange(s) * t for s, t in zip(kernel, dilations)), indexing="ij"), -1)
        starts = np.stack(np.meshgrid(*(np.arange(o) * s - e for o, s, e in zip(out, strides, pads)), indexing="ij"),
                          -1)
        places = taps.reshape(k, r, 1) + starts.reshape(positions, r).T  # (k, r, positions)
        places = places[:, ::-1]  # GridSample's coordinates: the last axis first
        if 1 in spatial:
            lone = [d + 2 for d, size in enumerate(spatial) if size == 1]
            x = b.op("Pad", x, pads=[0] * len(lone) + [1] * len(lone), axes=lone)
            spatial = [max(size, 2) for size in spatial]
        scale = np.array([2 / (size - 1) for size in reversed(spatial)]).reshape(1, r, 1)
        coords = b.op("Slice", b.op("Reshape", offset, shape=[n, groups, k, r, positions]), starts=[r - 1],
                      ends=[-r - 1], axes=[3], steps=[-1])  # the axes reversed
        coords = b.op("Mul", b.op("Add", coords, b.const(places, offset)), b.const(scale, offset))
        grid = b.op("Transpose", b.op("Sub", coords, b.const(1, offset)), perm=[0, 1, 2, 4, 3])
        grid = b.op("Reshape", grid, shape=[n * groups, k * positions, *([1] * (r - 1)), r])
        linear = "linear" if b.graph.opsets.get("", 0) >= 20 else "bilinear"
        images = b.op("Reshape", x, shape=[n * groups, c // groups, *spatial])
        sampled = b.op("GridSample", images, grid, mode=linear, padding_mode="zeros", align_corners=1)
        sampled = b.op("Reshape", sampled, shape=[n, groups, c // groups, k, positions])
        if mask:
            sampled = b.op("Mul", sampled, b.op("Reshape", mask, shape=[n, groups, 1, k, positions]))
        cols = b.op("Reshape", sampled, shape=[n, group, c // group * k, positions])
        y = b.op("MatMul", b.op("Reshape", w, shape=[1, group, m // group, -1]), cols)
        y = b.op("Reshape", y, shape=[n, m, *out])
        if bias:
            y = b.op("Add", y, b.op("Reshape", bias, shape=[1, m, *([1] * r)]))
        return [y]

    def torch(self, torch, x, w, offset, bias=None, mask=None, *, dilations, group, kernel_shape, offset_group, pads,
              strides):
        """torchvision's deform_conv2d (2-D only), the input zero-padded first (samples outside are zero)."""
        if x.dim() != 4:
            raise UnsupportedOpError([f"DeformConv in {x.dim() - 2}-D"])
        from torchvision.ops import deform_conv2d
        pads = pads or [0] * 4
        x = torch.nn.functional.pad(x, [pads[1], pads[3], pads[0], pads[2]])
        return deform_conv2d(x, offset, w, bias, stride=tuple(strides or (1, 1)), dilation=tuple(dilations or (1, 1)),
                             mask=mask)
