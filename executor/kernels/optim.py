"""Optimizer kernels (memplan.SGD, memplan.Adam; rules in planner/ops/optim.py). The new parameter and
state are planned into the old ones' bytes, so each output is usually its input itself. NumPy's form
makes parameter-sized temporaries; the GPU runs one fused kernel (backends/cupy_kernels.py)."""
from . import kernel


def in_place(xp, ins, outs, first):
    """The outputs, holding the values of the inputs they replace (a copy only when not planned in place)."""
    for src, out in zip(ins[first:first + 1] + ins[first + 2:], outs):
        if out is not src:
            xp.copyto(out, src)
    return outs


@kernel("SGD", domain="memplan")
def sgd(xp, step, ins, outs, ws):
    lr, grad = float(ins[0]), ins[2]
    x, *buf = in_place(xp, ins, outs, 1)
    decay, momentum = step.attrs["weight_decay"], step.attrs["momentum"]
    g = grad + x.dtype.type(decay) * x if decay else grad
    if buf:
        buf = buf[0]
        xp.multiply(buf, x.dtype.type(momentum), out=buf)
        xp.add(buf, g, out=buf)
        g = g + x.dtype.type(momentum) * buf if step.attrs["nesterov"] else buf
    xp.subtract(x, x.dtype.type(lr) * g, out=x)


@kernel("Adam", domain="memplan")
def adam(xp, step, ins, outs, ws):
    lr, t, grad = float(ins[0]), float(ins[1]), ins[3]
    x, m, v = in_place(xp, ins, outs, 2)
    b1, b2, eps, decay = (step.attrs[k] for k in ("beta1", "beta2", "epsilon", "weight_decay"))
    f = x.dtype.type
    g = grad
    if decay and step.attrs["decoupled"]:
        xp.multiply(x, f(1 - lr * decay), out=x)
    elif decay:
        g = grad + f(decay) * x
    m += (g - m) * f(1 - b1)
    xp.multiply(v, f(b2), out=v)
    v += f(1 - b2) * g * g
    denom = xp.sqrt(v) / f((1 - b2 ** t) ** 0.5) + f(eps)
    x -= f(lr / (1 - b1 ** t)) * m / denom


@kernel("Assign", domain="memplan")
def assign(xp, step, ins, outs, ws):
    xp.copyto(outs[0], ins[0])

