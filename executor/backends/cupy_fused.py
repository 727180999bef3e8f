"""GPU forms of the planner's fused ops, one kernel launch each where the shared kernels walk tiles from the
host or chain NumPy calls: memplan.ScaledDotProductAttention of the plain form (a few threads of a warp per
query row, FlashAttention's online softmax over the keys, nothing in the scratch; other forms run the tiled
kernel), memplan.AddLayerNormalization (a block per row) and memplan.BiasActivation with its gradient (one
elementwise pass)."""
from dataclasses import replace
from functools import lru_cache

import numpy as np

from planner import ops
from planner.ops.activation import GELU_CUDA
from planner.ops.attention_tiles import Form
from planner.ops.fused_norm import rows_and_columns

from ..kernels import override

HEAD_SIZES = 256
"""The largest head size the attention kernel holds in registers; larger heads keep the tiled kernel."""

ATTENTION = r"""
#define DL ((D + LANES - 1) / LANES)
#define EL ((DV + LANES - 1) / LANES)
extern "C" __global__ void memplan_attention(
    const T* q, const T* k, const T* v, const T* bias, T* y, W* lse, int B, int H, int G, int S, int N,
    W scale, W lowest, W minus_inf, int causal, int has_bias, int has_lse,
    long long q0, long long q1, long long q2, long long q3, long long k0, long long k1, long long k2, long long k3,
    long long v0, long long v1, long long v2, long long v3, long long b0, long long b1, long long b2, long long b3,
    long long y0, long long y1, long long y2, long long y3, long long l0, long long l1, long long l2)
{
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / LANES;
    if (row >= (long long)B * H * S) return;
    int lane = threadIdx.x % LANES;
    unsigned group = LANES == 32 ? 0xffffffffu : ((1u << LANES) - 1) << (threadIdx.x % 32 / LANES * LANES);
    long long i = row % S, h = (row / S) % H, b = row / ((long long)S * H), hk = h / G;
    W qr[DL], acc[EL];
    const T* qp = q + b * q0 + h * q1 + i * q2;
    for (int t = 0; t < DL; ++t) qr[t] = t * LANES + lane < D ? (W)qp[(t * LANES + lane) * q3] * scale : 0;
    for (int t = 0; t < EL; ++t) acc[t] = 0;
    W m = lowest, l = 0;
    long long last = causal ? min((long long)N, max(0LL, i + N - S + 1)) : N;
    for (long long j = 0; j < last; ++j) {
        const T* kp = k + b * k0 + hk * k1 + j * k2;
        W s = 0;
        for (int t = 0; t < DL; ++t) if (t * LANES + lane < D) s += qr[t] * (W)kp[(t * LANES + lane) * k3];
        for (int o = LANES / 2; o > 0; o /= 2) s += __shfl_xor_sync(group, s, o);
        if (has_bias) s += (W)bias[b * b0 + h * b1 + i * b2 + j * b3];
        if (s == minus_inf) continue;  // a hidden key
        W top = s > m ? s : m, alpha = exp(m - top), p = exp(s - top);
        l = l * alpha + p;
        const T* vp = v + b * v0 + hk * v1 + j * v2;
        for (int t = 0; t < EL; ++t)
            if (t * LANES + lane < DV) acc[t] = acc[t] * alpha + p * (W)vp[(t * LANES + lane) * v3];
        m = top;
    }
    T* yp = y + b * y0 + h * y1 + i * y2;
    for (int t = 0; t < EL; ++t) if (t * LANES + lane < DV) yp[(t * LANES + lane) * y3] = (T)(l > 0 ? acc[t] / l : 0);
    if (has_lse && lane == 0) lse[b * l0 + h * l1 + i * l2] = l > 0 ? m + log(l) : minus_inf;
}
"""
"""Each query row is LANES neighbouring threads of a warp, each holding every LANES-th element of the row's query
and output and the score summed across them by shuffles (the xor butterfly leaves every lane the same sum, so
they all take the same branches). `lowest`: the accumulation type's lowest finite value, where the running
max starts; a score of -inf is a hidden key; a row that sees no key gives zeros and an LSE of -inf, as the
tiled kernel's."""

THREADS = 1 << 17
"""About the threads that fill a GPU (an H100's 132 multiprocessors hold 2,048 each): a row takes as many lanes,
up to a warp, as bring the launch to this, so that few rows (batch 1) still run in parallel."""

C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
"""The C types of the dtypes memplan's CUDA kernels take."""


@override("cupy", "ScaledDotProductAttention", domain="memplan")
def attention(cupy):
    """memplan.ScaledDotProductAttention as one kernel over every query row of every head, for float32 and
    float64 with head sizes up to HEAD_SIZES; the tiled kernel otherwise."""
    @lru_cache(maxsize=None)
    def compiled(dtype, d, dv, lanes):
        t = C_TYPES[dtype]
        return cupy.RawKernel(f"typedef {t} T; typedef {t} W;\n#define D {d}\n#define DV {dv}\n#define LANES {lanes}\n"
                              + ATTENTION, "memplan_attention")

    def run(xp, step, ins, outs, ws):
        q, k, v, bias = [*ins, None][:4]
        y, lse = [*outs, None][:2]
        batch, heads, s, d = q.shape
        dv = v.shape[-1]
        form = Form.of(step.attrs)
        seen = bias is None and (not form.causal or k.shape[2] >= s)  # every row sees a key: zero and NaN rows agree
        if q.dtype not in C_TYPES or max(d, dv) > HEAD_SIZES or not d or not y.size or any(x is not None for x in ins[4:]) \
                or not (form.plain or seen and replace(form, empty_rows="zero").plain):
            ops.of(step).kernel(xp, step, ins, outs, ws)
            return
        kind = q.dtype.type
        scale = float(step.attrs.get("scale") or 0.0) or 1 / np.sqrt(max(d, 1))
        n = k.shape[2]
        b = None if bias is None else cupy.broadcast_to(bias, (batch, heads, s, n))
        rows = batch * heads * s
        lanes = min(32, _power_of_two(THREADS // rows), _power_of_two(max(d, dv)))
        strides = [*elements(q), *elements(k), *elements(v), *(elements(b) if b is not None else [0] * 4),
                   *elements(y), *(elements(lse) if lse is not None else [0] * 3)]
        lowest = np.finfo(kind).min
        compiled(q.dtype, d, dv, lanes)(
            ((rows * lanes + 127) // 128,), (128,),
            (q, k, v, q if b is None else b, y, y if lse is None else lse, np.int32(batch), np.int32(heads),
             np.int32(heads // k.shape[1]), np.int32(s), np.int32(n), kind(scale), kind(lowest), kind(-np.inf),
             np.int32(bool(step.attrs.get("causal"))), np.int32(b is not None), np.int32(lse is not None),
             *(np.int64(x) for x in strides)))

    return run


def _power_of_two(n):
    """The least power of two at least n (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def elements(a):
    """The strides of `a` in elements."""
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


@lru_cache(maxsize=None)
def _bias_activation(cupy, body, gradient):
    """One elementwise pass of y = act(x + bias) (`gradient`: dx = dy act'(x + bias)) by its CUDA `body`, the bias
    (X's trailing dims) read at the element's place in its last dims."""
    ins = "T dy, T x" if gradient else "T x"
    value = f"(double)dy * ({body})" if gradient else body
    return cupy.ElementwiseKernel(f"{ins}, raw T b, int64 n, float64 alpha", "T y",
                                  f"double v = (double)x + (n ? (double)b[i % n] : 0.0); y = (T)({value});",
                                  "memplan_bias_activation_grad" if gradient else "memplan_bias_activation")


def _body(table, step):
    """The step's activation (or its slope) in `table`, for its `approximate` where it has several."""
    entry = table[step.attrs["activation"]]
    return entry[step.attrs["approximate"]] if isinstance(entry, dict) else entry


@override("cupy", "BiasActivation", domain="memplan")
def bias_activation(cupy):
    """memplan.BiasActivation in one elementwise pass."""
    def forward(xp, step, ins, outs, ws):
        x, bias = [*ins, None][:2]
        _bias_activation(cupy, _body(VALUES, step), False)(x, x if bias is None else bias,
                                                           0 if bias is None else bias.size,
                                                           float(step.attrs["alpha"]), outs[0])

    return forward


@override("cupy", "BiasActivationGrad", domain="memplan")
def bias_activation_gradient(cupy):
    """memplan.BiasActivationGrad in one elementwise pass."""
    def backward(xp, step, ins, outs, ws):
        dy, x, bias = [*ins, None][:3]
        _bias_activation(cupy, _body(SLOPES, step), True)(dy, x, x if bias is None else bias,
                                                          0 if bias is None else bias.size,
                                                          float(step.attrs["alpha"]), outs[0])

    return backward


LAYER_NORM = r"""
__device__ A block_sum(A v, A* shared)
{
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();  // the shared sums of the previous call are read
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < blockDim.x / 32 ? shared[threadIdx.x % 32] : (A)0;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void memplan_add_layer_norm(
    const T* x, const T* skip, const T* scale, const T* bias, T* y, T* total, int cols, A epsilon, int rms,
    int has_skip, int has_bias, int has_total)
{
    __shared__ A shared[32];
    long long at = (long long)blockIdx.x * cols;
    const T *xr = x + at, *sr = skip + at;
    T *yr = y + at, *tr = total + at;
    A sum = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        A v = (A)xr[c] + (has_skip ? (A)sr[c] : (A)0);
        if (has_total) {
            tr[c] = (T)v;
            v = (A)tr[c];
        }
        sum += v;
    }
    A mean = rms ? (A)0 : block_sum(sum, shared) / cols, squares = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        A v = (has_total ? (A)tr[c] : (A)xr[c] + (has_skip ? (A)sr[c] : (A)0)) - mean;
        squares += v * v;
    }
    A inv = (A)1 / sqrt(block_sum(squares, shared) / cols + epsilon);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        A v = (has_total ? (A)tr[c] : (A)xr[c] + (has_skip ? (A)sr[c] : (A)0)) - mean;
        yr[c] = (T)(v * inv * (A)scale[c] + (has_bias ? (A)bias[c] : (A)0));
    }
}
"""
"""One block per row; each thread reads and writes only its own columns, so Y or Sum may be X or skip (the op's
in-place pairs). The statistics are summed in double; X + skip is rounded to X's dtype first, as the shared
kernel's Sum holds it."""


@override("cupy", "AddLayerNormalization", domain="memplan")
def add_layer_norm(cupy):
    """memplan.AddLayerNormalization in one launch for float32 and float64 rows of contiguous arrays whose scale
    and bias have every normalised element; the shared chunked kernel otherwise."""
    @lru_cache(maxsize=None)
    def compiled(dtype):
        return cupy.RawKernel(f"typedef {C_TYPES[dtype]} T; typedef double A;\n" + LAYER_NORM,
                              "memplan_add_layer_norm")

    def run(xp, step, ins, outs, ws):
        x, skip, scale, bias = [*ins, None, None][:4]
        y, total = [*outs, None][:2]
        rows, cols, _ = rows_and_columns(x.shape, step.attrs["axis"] % x.ndim)
        arrays = [a for a in (x, skip, scale, bias, y, total) if a is not None]
        if (x.dtype not in C_TYPES or any(not a.flags.c_contiguous for a in arrays) or scale.size != cols
                or (bias is not None and bias.size != cols) or not x.size):
            ops.of(step).kernel(xp, step, ins, outs, ws)
            return
        threads = min(1024, max(32, -(-cols // 4 // 32) * 32))
        compiled(x.dtype)((rows,), (threads,),
                          (x, x if skip is None else skip, scale, scale if bias is None else bias, y,
                           y if total is None else total, np.int32(cols), np.float64(step.attrs["epsilon"]),
                           np.int32(step.attrs["rms"]), np.int32(skip is not None), np.int32(bias is not None),
                           np.int32(total is not None)))

    return run
