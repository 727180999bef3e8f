"""GPU overrides: fused CuPy kernels for ops whose NumPy form needs temporaries, which would allocate
device memory while a plan runs: the `cuda` bodies of op entries, and the kernels below and in cupy_fused.py,
each registered with `@override("cupy", "Op")` on the function that makes it from the cupy module."""
import math
import zlib
from functools import lru_cache

from ..kernels import OVERRIDES, loss, nn, override
from ..kernels.optim import in_place
from . import cupy_fused  # noqa: F401  (registers the fused ops' forms)
from .cuda_copies import transfer


def fuser(cupy):
    """fuse(schema, step): the step's kernel from its op entry's `cuda` body (None without one), bound
    once: one ElementwiseKernel per body, over `v` (the input as a double) and the op's numeric
    attributes as float64 parameters, which are the step's."""
    @lru_cache(maxsize=None)
    def compile_body(body, params):
        signature = ", ".join(("T x", *(f"float64 {p}" for p in params)))
        return cupy.ElementwiseKernel(signature, "T y", f"double v = (double)x; y = (T)({body});",
                                      f"memplan_fused_{zlib.crc32(body.encode()):08x}")

    def fuse(schema, step):
        if schema.cuda is None:
            return None
        arguments = schema.arguments(step)
        numeric = {k: v for k, v in arguments.items() if isinstance(v, (int, float))}
        body = schema.cuda(**arguments) if callable(schema.cuda) else schema.cuda
        fused, values = compile_body(body, tuple(numeric)), tuple(numeric.values())
        return lambda xp, step, ins, outs, ws: fused(ins[0], *values, outs[0])

    return fuse


def overrides(cupy):
    """{(domain, op): kernel} replacing the shared table's entries on the GPU: each registered form, made."""
    return {key: make(cupy) for key, make in OVERRIDES["cupy"].items()}


@lru_cache(maxsize=None)
def _sum_exp(cupy):
    """sum(exp(y)) along the axes asked for, as one reduction."""
    return cupy.ReductionKernel("T y", "T s", "exp((double)y)", "a + b", "s = (T)a", "0", "memplan_sum_exp")


@override("cupy", "LogSoftmax")
def _log_softmax(cupy):
    sum_exp = _sum_exp(cupy)

    def run(xp, step, ins, outs, ws):
        """x - max - log(sum exp(x - max)), the per-row max and sum in the workspace's `rows`."""
        x, y = ins[0], outs[0]
        if not x.size:
            return
        a, r = step.attrs["axis"] % x.ndim, ws["rows"]
        xp.max(x, axis=a, keepdims=True, out=r)
        xp.subtract(x, r, out=y)
        sum_exp(y, axis=a, keepdims=True, out=r)
        xp.log(r, out=r)
        xp.subtract(y, r, out=y)

    return run


@override("cupy", "SwapOut", "SwapIn", domain="memplan")
def _swap(cupy):
    """A copy between the device arena and the pinned host arena, on the compute stream (ordered with the kernels
    that make and read its tensors)."""
    def run(xp, step, ins, outs, ws):
        transfer(ins[0], outs[0], cupy.cuda.get_current_stream())

    return run


@override("cupy", "WinogradConv", "BatchedConv", domain="memplan")
def _as_fused_conv(cupy):
    """Winograd's and the batched convs run as the FusedConv they were made from (cuDNN's own algorithms)."""
    return nn.as_fused_conv


@override("cupy", "Trilu")
def _trilu(cupy):
    """Trilu in one launch (the NumPy kernel zeroes row by row): each element kept or zeroed by its
    row and column in the last two dims; right in place, since each reads only its own input."""
    keep = cupy.ElementwiseKernel(
        "raw T x, int64 rows, int64 cols, int64 k, bool upper", "T y",
        "long long c = i % cols, r = (i / cols) % rows; y = (upper ? c - r >= k : c - r <= k) ? x[i] : (T)0;",
        "memplan_trilu")

    def run(xp, step, ins, outs, ws):
        y = outs[0]
        if y.size:
            keep(ins[0], *y.shape[-2:], step.attrs["k"], bool(step.attrs["upper"]), y)

    return run


@override("cupy", "Dropout", domain="memplan")
def _dropout(cupy):
    """memplan.Dropout's hash (planner.ops.misc.dropout_keep) as one kernel, the key made from the
    step on the device."""
    body = ("unsigned int h = (unsigned int)i ^ (unsigned int)(seed * 0x9E3779B9ull + (unsigned long long)step"
            " * 0x85EBCA6Bull); h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;"
            " bool keep = h >= threshold; y = keep ? (T)((double)x * scale) : (T)0;")
    params = "T x, S step, uint64 seed, uint32 threshold, float64 scale"
    with_mask = cupy.ElementwiseKernel(params, "T y, bool mask", body + " mask = keep;", "memplan_dropout_mask")
    without = cupy.ElementwiseKernel(params, "T y", body, "memplan_dropout")

    def run(xp, step, ins, outs, ws):
        ratio = step.attrs["ratio"]
        args = (*ins, step.attrs["seed"], min(int(ratio * 2**32), 2**32 - 1), 1 / (1 - ratio))
        mask = outs[1] if len(outs) > 1 else None
        with_mask(*args, outs[0], mask) if mask is not None else without(*args, outs[0])

    return run


@lru_cache(maxsize=None)
def _take_labels(cupy):
    """take(xp, step, log_prob, labels, class_weights, ws): each position's loss (-log-probability at its label,
    times its weight) and weight into the workspace's `losses` and `weights`, in one kernel that allocates
    nothing."""
    take = cupy.ElementwiseKernel(
        "raw T log_prob, I label, raw T w, int64 classes, int64 inner, int64 ignore, bool has_ignore, bool has_w",
        "T loss, T weight",
        "bool skip = has_ignore && label == ignore; long long c = skip ? 0 : (long long)label;"
        " c = c < 0 ? 0 : (c >= classes ? classes - 1 : c);"  # a label out of range reads no memory past the scores
        " weight = skip ? (T)0 : (has_w ? w[c] : (T)1);"
        " loss = -log_prob[((i / inner) * classes + c) * inner + i % inner] * weight;", "memplan_take_log_prob")

    def take_labels(xp, step, log_prob, labels, class_weights, ws):
        ignore = step.attrs["ignore_index"]
        take(log_prob, labels, log_prob if class_weights is None else class_weights, log_prob.shape[1],
             math.prod(labels.shape[1:]), 0 if ignore is None else ignore, ignore is not None,
             class_weights is not None, ws["losses"], ws["weights"])

    return take_labels


@override("cupy", "SoftmaxCrossEntropyLoss")
def _cross_entropy(cupy):
    sum_exp, take_labels = _sum_exp(cupy), _take_labels(cupy)

    def run(xp, step, ins, outs, ws):
        """Into the log_prob output when there is one; else the positions' log-sum-exp by chunks (the
        shared kernel's), the scores at the labels taken, and the two added."""
        scores, labels, class_weights = [*ins, None][:3]
        if loss.stored(outs):
            rows, log_prob = ws["rows"], outs[1]
            xp.max(scores, axis=1, keepdims=True, out=rows)
            xp.subtract(scores, rows, out=log_prob)
            sum_exp(log_prob, axis=1, keepdims=True, out=rows)
            xp.log(rows, out=rows)
            xp.subtract(log_prob, rows, out=log_prob)
            take_labels(xp, step, log_prob, labels, class_weights, ws)
        else:
            loss.log_sum_exp(xp, scores, ws)
            take_labels(xp, step, scores, labels, class_weights, ws)
            loss.add_log_sum_exp(xp, ws)
        loss.reduce(xp, step, ws, outs[0])

    return run


@override("cupy", "NegativeLogLikelihoodLoss")
def _negative_log_likelihood(cupy):
    take_labels = _take_labels(cupy)

    def run(xp, step, ins, outs, ws):
        log_prob, labels, class_weights = [*ins, None][:3]
        take_labels(xp, step, log_prob, labels, class_weights, ws)
        loss.reduce(xp, step, ws, outs[0])

    return run


@override("cupy", "SGD", domain="memplan")
def _sgd(cupy):
    """memplan.SGD (with and without momentum) as one kernel updating parameter and state in place; the learning
    rate is read on the device, so a step never waits for the host."""
    sgd = cupy.ElementwiseKernel(
        "S lr, T g, float64 decay", "T x", "x = (T)((double)x - (double)lr * ((double)g + decay * (double)x));",
        "memplan_sgd")
    momentum_sgd = cupy.ElementwiseKernel(
        "S lr, T g, float64 decay, float64 momentum, bool nesterov", "T x, T buf",
        "double d = (double)g + decay * (double)x, b = momentum * (double)buf + d; buf = (T)b;"
        " x = (T)((double)x - (double)lr * (nesterov ? d + momentum * b : b));", "memplan_momentum_sgd")

    def run(xp, step, ins, outs, ws):
        in_place(xp, ins, outs, 1)
        if len(outs) == 1:
            sgd(ins[0], ins[2], step.attrs["weight_decay"], *outs)
        else:
            momentum_sgd(ins[0], ins[2], step.attrs["weight_decay"], step.attrs["momentum"],
                         bool(step.attrs["nesterov"]), *outs)

    return run


@override("cupy", "Adam", domain="memplan")
def _adam(cupy):
    """memplan.Adam as one kernel updating parameter and state in place, the learning rate and step read on the
    device."""
    adam = cupy.ElementwiseKernel(
        "S lr, S t, T g, float64 b1, float64 b2, float64 eps, float64 decay, bool decoupled", "T x, T m, T v",
        "double p = (double)x, d = (double)g; if (decoupled) p *= 1 - (double)lr * decay; else d += decay * p;"
        " double mm = (double)m + (d - (double)m) * (1 - b1), vv = b2 * (double)v + (1 - b2) * d * d;"
        " m = (T)mm; v = (T)vv; double c1 = 1 - pow(b1, (double)t), c2 = 1 - pow(b2, (double)t);"
        " x = (T)(p - (double)lr / c1 * mm / (sqrt(vv) / sqrt(c2) + eps));", "memplan_adam")

    def run(xp, step, ins, outs, ws):
        in_place(xp, ins, outs, 2)
        adam(ins[0], ins[1], ins[3], *(step.attrs[k] for k in ("beta1", "beta2", "epsilon", "weight_decay")),
             bool(step.attrs["decoupled"]), *outs)

    return run
