"""memplan's own convolution kernels on CuPy. Depthwise convolutions (group = input channels, each output channel
reading one input channel) with FusedConv's bias, residual and activation in the same kernel: one thread per
output element summing its window (cuDNN's fp32 depthwise engines without TF32 are several times slower than
this memory-bound loop, and MobileNets and ConvNeXts are made of these convs). And FusedConv's epilogue as one
elementwise pass over Y, for a cuDNN conv run alone."""
from functools import lru_cache

import numpy as np

from ..kernels import nn
from .cupy_fused import C_TYPES

DEPTHWISE = r"""
extern "C" __global__ void memplan_depthwise(
    const T* x, const T* w, const T* b, const T* z, T* y, long long total, int C, int M, int H, int W,
    int OH, int OW, int KH, int KW, int sh, int sw, int ph, int pw, int dh, int dw, int has_bias, int has_z,
    A p0, A p1)
{
    long long at = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (at >= total) return;
    int ow = at % OW, oh = (at / OW) % OH;
    long long image = at / ((long long)OW * OH);
    int oc = image % (C * M);
    const T* xs = x + (image / (C * M) * C + oc / M) * (long long)H * W;
    const T* ws = w + (long long)oc * KH * KW;
    A v = 0;
    for (int i = 0; i < KH; ++i) {
        int ih = oh * sh - ph + i * dh;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < KW; ++j) {
            int iw = ow * sw - pw + j * dw;
            if (iw >= 0 && iw < W) v += (A)xs[(long long)ih * W + iw] * (A)ws[i * KW + j];
        }
    }
    if (has_bias) v += (A)b[oc];
    if (has_z) v += (A)z[at];
    y[at] = (T)(ACTIVATION);
}
"""
"""`M`: output channels per input channel; `p0`, `p1`: the activation's parameters (Clip's bounds, HardSigmoid's
alpha and beta)."""

ACTIVATIONS = {"": "v", "Relu": "v < 0 ? (A)0 : v", "Clip": "v < p0 ? p0 : (v > p1 ? p1 : v)",
               "Sigmoid": "(A)1 / ((A)1 + exp(-v))", "Tanh": "tanh(v)",
               "HardSigmoid": "p0 * v + p1 < 0 ? (A)0 : (p0 * v + p1 > 1 ? (A)1 : p0 * v + p1)"}
"""FusedConv's activations (planner/ops/fused_conv.py's, which the op's check holds steps to) of the sum `v` (NaN
stays NaN, as NumPy's maximum and clip keep it)."""


def as_2d(flat, values, fill):
    """A 1-D conv's window values (strides, pads, sizes) as a 2-D conv's of height 1 when `flat`, `fill` the
    height's; else `values` as a list."""
    return [fill, *values] if flat else list(values)


def activation_of(step, wide):
    """(FusedConv's activation name, "" for none; its two parameters as the NumPy scalar type `wide`, zeros where it
    takes none)."""
    params = [wide(p) for p in (step.attrs.get("activation_params") or ())] + [wide(0)] * 2
    return step.attrs.get("activation") or "", params[:2]


def depthwise(cupy):
    """bind(step, ins, outs): the kernel of a Conv or FusedConv step that is a depthwise conv this kernel runs (1-D
    or 2-D, float32 or float64, group = input channels, contiguous views), else None."""
    @lru_cache(maxsize=None)
    def compiled(dtype, activation):
        t = C_TYPES[dtype]
        source = f"typedef {t} T; typedef {t} A;\n#define ACTIVATION {ACTIVATIONS[activation]}\n" + DEPTHWISE
        return cupy.RawKernel(source, "memplan_depthwise")

    def bind(step, ins, outs):
        x, w, b, z = [*ins, None, None][:4]
        y = outs[0]
        if not (x.dtype in C_TYPES and x.dtype == w.dtype == y.dtype and x.ndim in (3, 4) and w.shape[1] == 1
                and int(step.attrs.get("group", 1)) == x.shape[1] > 1 and w.shape[0] % x.shape[1] == 0
                and all(a.flags.c_contiguous for a in (x, w, y, b, z) if a is not None)):
            return None
        win = nn.conv_window(step, x, w, y)
        flat = x.ndim == 3
        window = [*as_2d(flat, x.shape[2:], 1), *as_2d(flat, y.shape[2:], 1), *as_2d(flat, w.shape[2:], 1),
                  *as_2d(flat, win.strides, 1), *as_2d(flat, win.begin, 0), *as_2d(flat, win.dilations, 1)]
        activation, params = activation_of(step, x.dtype.type)
        total = y.size
        arguments = (x, w, x if b is None else b, y if z is None else z, y, np.int64(total), np.int32(x.shape[1]),
                     np.int32(w.shape[0] // x.shape[1]), *map(np.int32, window), np.int32(b is not None),
                     np.int32(z is not None), *params)
        launch = compiled(x.dtype, activation)

        def run(xp, step, ins, outs, ws):
            if total:
                launch(((total + 255) // 256,), (256,), arguments)
        return run

    return bind


def epilogue(cupy):
    """after(step, b, z, y): FusedConv's bias, residual and activation applied to a conv's output `y` in one
    elementwise pass, as a kernel (xp, step, ins, outs, ws); None when `y` or `z` is not contiguous."""
    @lru_cache(maxsize=None)
    def compiled(activation, wide):
        return cupy.ElementwiseKernel(
            f"raw T b, raw T z, int64 inner, int64 channels, bool has_bias, bool has_z, {wide.name} p0, "
            f"{wide.name} p1", "T y",
            f"typedef {C_TYPES[wide]} A; A v = (A)y; if (has_bias) v += (A)b[i / inner % channels]; "
            f"if (has_z) v += (A)z[i]; y = (T)({ACTIVATIONS[activation]});",
            f"memplan_conv_epilogue_{activation.lower() or 'none'}")

    def after(step, b, z, y):
        if not y.flags.c_contiguous or (z is not None and not z.flags.c_contiguous):
            return None
        wide = np.dtype(np.float64 if y.dtype == np.float64 else np.float32)
        activation, params = activation_of(step, wide.type)
        arguments = (y if b is None else b, y if z is None else z, int(np.prod(y.shape[2:], dtype=np.int64)),
                     y.shape[1], b is not None, z is not None, *params)
        run = compiled(activation, wide)

        def kernel(xp, step, ins, outs, ws):
            run(*arguments, outs[0])
        return kernel

    return after
