"""GPU forms of the planner's fused ops, one kernel launch each where the shared kernels walk tiles from the
host: memplan.ScaledDotProductAttention (one thread per query row, FlashAttention's online softmax over the
keys, nothing in the scratch) and memplan.BiasActivation with its gradient (one elementwise pass)."""
from functools import lru_cache

import numpy as np

from planner import ops
from planner.ops.activation import GELU_CUDA

HEAD_SIZES = 256
"""The largest head size the attention kernel holds in registers; larger heads keep the tiled kernel."""

ATTENTION = r"""
extern "C" __global__ void memplan_attention(
    const T* q, const T* k, const T* v, const T* bias, T* y, W* lse, int B, int H, int G, int S, int N,
    W scale, W lowest, W minus_inf, int causal, int has_bias, int has_lse,
    long long q0, long long q1, long long q2, long long q3, long long k0, long long k1, long long k2, long long k3,
    long long v0, long long v1, long long v2, long long v3, long long b0, long long b1, long long b2, long long b3,
    long long y0, long long y1, long long y2, long long y3, long long l0, long long l1, long long l2)
{
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= (long long)B * H * S) return;
    long long i = row % S, h = (row / S) % H, b = row / ((long long)S * H), hk = h / G;
    W qr[D], acc[DV];
    const T* qp = q + b * q0 + h * q1 + i * q2;
    for (int d = 0; d < D; ++d) qr[d] = (W)qp[d * q3] * scale;
    for (int e = 0; e < DV; ++e) acc[e] = 0;
    W m = lowest, l = 0;
    long long last = causal ? min((long long)N, max(0LL, i + N - S + 1)) : N;
    for (long long j = 0; j < last; ++j) {
        const T* kp = k + b * k0 + hk * k1 + j * k2;
        W s = 0;
        for (int d = 0; d < D; ++d) s += qr[d] * (W)kp[d * k3];
        if (has_bias) s += (W)bias[b * b0 + h * b1 + i * b2 + j * b3];
        if (s == minus_inf) continue;  // a hidden key
        W top = s > m ? s : m, alpha = exp(m - top), p = exp(s - top);
        l = l * alpha + p;
        const T* vp = v + b * v0 + hk * v1 + j * v2;
        for (int e = 0; e < DV; ++e) acc[e] = acc[e] * alpha + p * (W)vp[e * v3];
        m = top;
    }
    T* yp = y + b * y0 + h * y1 + i * y2;
    for (int e = 0; e < DV; ++e) yp[e * y3] = (T)(l > 0 ? acc[e] / l : 0);
    if (has_lse) lse[b * l0 + h * l1 + i * l2] = l > 0 ? m + log(l) : minus_inf;
}
"""
"""`lowest`: the accumulation type's lowest finite value, where the running max starts; a score of -inf is a
hidden key; a row that sees no key gives zeros and an LSE of -inf, as the tiled kernel's."""

TYPES = {np.dtype(np.float32): ("float", "float", np.float32), np.dtype(np.float64): ("double", "double", np.float64)}


def attention(cupy):
    """memplan.ScaledDotProductAttention as one kernel over every query row of every head, for float32 and
    float64 with head sizes up to HEAD_SIZES; the tiled kernel otherwise."""
    @lru_cache(maxsize=None)
    def compiled(dtype, d, dv):
        t, w, _ = TYPES[dtype]
        return cupy.RawKernel(f"typedef {t} T; typedef {w} W;\n#define D {d}\n#define DV {dv}\n" + ATTENTION,
                              "memplan_attention")

    def run(xp, step, ins, outs, ws):
        q, k, v, bias = [*ins, None][:4]
        y, lse = [*outs, None][:2]
        batch, heads, s, d = q.shape
        dv = v.shape[-1]
        if q.dtype not in TYPES or max(d, dv) > HEAD_SIZES or not y.size:
            ops.of(step).kernel(xp, step, ins, outs, ws)
            return
        kind = TYPES[q.dtype][2]
        scale = float(step.attrs.get("scale") or 0.0) or 1 / np.sqrt(max(d, 1))
        n = k.shape[2]
        b = None if bias is None else cupy.broadcast_to(bias, (batch, heads, s, n))
        rows = batch * heads * s
        strides = [*_elements(q), *_elements(k), *_elements(v), *(_elements(b) if b is not None else [0] * 4),
                   *_elements(y), *(_elements(lse) if lse is not None else [0] * 3)]
        lowest = np.finfo(kind).min
        compiled(q.dtype, d, dv)(
            ((rows + 127) // 128,), (128,),
            (q, k, v, q if b is None else b, y, y if lse is None else lse, np.int32(batch), np.int32(heads),
             np.int32(heads // k.shape[1]), np.int32(s), np.int32(n), kind(scale), kind(lowest), kind(-np.inf),
             np.int32(bool(step.attrs.get("causal"))), np.int32(b is not None), np.int32(lse is not None),
             *(np.int64(x) for x in strides)))

    return run


def _elements(a):
    return [s // a.itemsize for s in a.strides]


SLOPES = {
    "Relu": "v > 0 ? 1.0 : 0.0",
    "Sigmoid": "(1.0 / (1.0 + exp(-v))) * (1.0 - 1.0 / (1.0 + exp(-v)))",
    "Tanh": "1.0 - tanh(v) * tanh(v)",
    "Gelu": {"none": "0.5 * (1 + erf(v * 0.7071067811865476)) + v * exp(-0.5 * v * v) * 0.3989422804014327",
             "tanh": "0.5 * (1 + TANH + v * (1 - TANH * TANH) * 0.7978845608028654 * (1 + 3 * 0.044715 * v * v))"
             .replace("TANH", "tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))")},
    "Swish": "(1.0 / (1.0 + exp(-alpha * v))) * (1 + alpha * v * (1 - 1.0 / (1.0 + exp(-alpha * v))))",
}
"""act'(v) of BiasActivationGrad, in double (the formulas of planner/ops/bias_activation.py's slopes)."""
VALUES = {"Relu": "v > 0 ? v : 0.0", "Sigmoid": "1.0 / (1.0 + exp(-v))", "Tanh": "tanh(v)", "Gelu": GELU_CUDA,
          "Swish": "v / (1.0 + exp(-alpha * v))"}
"""act(v) of BiasActivation, in double."""


def bias_activation(cupy):
    """{(memplan, BiasActivation): y = act(x + bias), (memplan, BiasActivationGrad): dx = dy act'(x + bias)}, each
    one elementwise pass, the bias (X's trailing dims) read at the element's place in its last dims."""
    @lru_cache(maxsize=None)
    def compiled(body, gradient):
        ins = "T dy, T x" if gradient else "T x"
        value = f"(double)dy * ({body})" if gradient else body
        return cupy.ElementwiseKernel(f"{ins}, raw T b, int64 n, float64 alpha", "T y",
                                      f"double v = (double)x + (n ? (double)b[i % n] : 0.0); y = (T)({value});",
                                      "memplan_bias_activation_grad" if gradient else "memplan_bias_activation")

    def body(table, step):
        entry = table[step.attrs["activation"]]
        return entry[step.attrs["approximate"]] if isinstance(entry, dict) else entry

    def forward(xp, step, ins, outs, ws):
        x, bias = [*ins, None][:2]
        compiled(body(VALUES, step), False)(x, x if bias is None else bias, 0 if bias is None else bias.size,
                                            float(step.attrs["alpha"]), outs[0])

    def backward(xp, step, ins, outs, ws):
        dy, x, bias = [*ins, None][:3]
        compiled(body(SLOPES, step), True)(dy, x, x if bias is None else bias, 0 if bias is None else bias.size,
                                           float(step.attrs["alpha"]), outs[0])

    return {("memplan", "BiasActivation"): forward, ("memplan", "BiasActivationGrad"): backward}
