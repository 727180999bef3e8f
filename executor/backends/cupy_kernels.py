"""GPU overrides: fused CuPy kernels for ops whose NumPy form needs temporaries, which would allocate
device memory while a plan runs."""
from ..kernels import attr

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
            "LogSoftmax": log_softmax}
