"""GPU overrides: fused CuPy kernels for ops whose NumPy form needs temporaries, which would allocate
device memory while a plan runs."""
from ..kernels import attr
from ..kernels.optim import in_place

ELEMENTWISE = {  # op: (extra parameters, body on double v, read from x)
    "LeakyRelu": ("float64 alpha", "v < 0 ? alpha * v : v"),
    "HardSigmoid": ("float64 alpha, float64 beta", "min(max(alpha * v + beta, 0.0), 1.0)"),
    "HardSwish": ("", "v * min(max(v / 6 + 0.5, 0.0), 1.0)"),
    "Gelu": ("", "0.5 * v * (1 + erf(v * 0.7071067811865476))"),
    "GeluTanh": ("", "0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))"),
}
PARAMS = {"LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta")}


def overrides(cupy):
    """{op: kernel} replacing the shared table's entries on the GPU."""
    fused = {name: cupy.ElementwiseKernel(", ".join(filter(None, ("T x", extra))), "T y",
                                          f"double v = (double)x; y = (T)({body});", f"memplan_{name.lower()}")
             for name, (extra, body) in ELEMENTWISE.items()}
    sum_exp = cupy.ReductionKernel("T y", "T s", "exp((double)y)", "a + b", "s = (T)a", "0", "memplan_sum_exp")

    def elementwise(xp, step, ins, outs, ws):
        name = "GeluTanh" if step.op == "Gelu" and attr(step, "approximate") == "tanh" else step.op
        fused[name](ins[0], *(attr(step, p) for p in PARAMS.get(step.op, ())), outs[0])

    def log_softmax(xp, step, ins, outs, ws):
        """x - max - log(sum exp(x - max)), the per-row max and sum in the workspace."""
        x, y = ins[0], outs[0]
        if not x.size:
            return
        a = attr(step, "axis") % x.ndim
        r = ws[:y.dtype.itemsize * (x.size // max(x.shape[a], 1))].view(y.dtype).reshape(
            x.shape[:a] + (1,) + x.shape[a + 1:])
        xp.max(x, axis=a, keepdims=True, out=r)
        xp.subtract(x, r, out=y)
        sum_exp(y, axis=a, keepdims=True, out=r)
        xp.log(r, out=r)
        xp.subtract(y, r, out=y)

    return {**dict.fromkeys(("LeakyRelu", "HardSigmoid", "HardSwish", "Gelu"), elementwise),
            "LogSoftmax": log_softmax, **_optimizers(cupy)}


def _optimizers(cupy):
    """memplan.SGD and memplan.Adam as one kernel each, updating parameter and state in place; the
    hyperparameter tensors are read on the device, so a step never waits for the host."""
    sgd = cupy.ElementwiseKernel(
        "S lr, T g, float64 decay, float64 momentum, bool nesterov", "T x, T buf",
        "double d = (double)g + decay * (double)x; if (momentum != 0) { double b = momentum * (double)buf + d;"
        " buf = (T)b; d = nesterov ? d + momentum * b : b; } x = (T)((double)x - (double)lr * d);", "memplan_sgd")
    adam = cupy.ElementwiseKernel(
        "S lr, S t, T g, float64 b1, float64 b2, float64 eps, float64 decay, bool decoupled", "T x, T m, T v",
        "double p = (double)x, d = (double)g; if (decoupled) p *= 1 - (double)lr * decay; else d += decay * p;"
        " double mm = (double)m + (d - (double)m) * (1 - b1), vv = b2 * (double)v + (1 - b2) * d * d;"
        " m = (T)mm; v = (T)vv; double c1 = 1 - pow(b1, (double)t), c2 = 1 - pow(b2, (double)t);"
        " x = (T)(p - (double)lr / c1 * mm / (sqrt(vv) / sqrt(c2) + eps));", "memplan_adam")

    def run_sgd(xp, step, ins, outs, ws):
        x, buf = (*in_place(xp, ins, outs, 1), outs[0])[:2]
        sgd(ins[0], ins[2], attr(step, "weight_decay"), attr(step, "momentum"), bool(attr(step, "nesterov")), x, buf)

    def run_adam(xp, step, ins, outs, ws):
        in_place(xp, ins, outs, 2)
        adam(ins[0], ins[1], ins[3], *(attr(step, k) for k in ("beta1", "beta2", "epsilon", "weight_decay")),
             bool(attr(step, "decoupled")), *outs)

    return {"memplan.SGD": run_sgd, "memplan.Adam": run_adam}

