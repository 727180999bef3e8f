"""Activations, one entry each (see planner/ops/elementwise.py): elementwise nonlinearities, which may
write over their input, Clip; composites built from other ops (`decompose`); and Softmax.

Ops that need x and a function of x at once (LeakyRelu, HardSwish, Gelu) work through a scratch of at
most CHUNK elements, in chunks, so that they run in place without a temporary the plan cannot see.
"""
import math

import numpy as np

from .registry import register, schema
from .base import Layout, Schema, axis, per_input_element, same_as_input
from .elementwise import Elementwise, unary

CHUNK = 1 << 14
"""Elements of the scratch of the ops that hold x and a function of x at once."""


def erf(xp):
    """erf from SciPy on the host or CuPy's on the GPU: NumPy has none."""
    if xp.__name__ == "numpy":
        from scipy.special import erf
    else:
        from cupyx.scipy.special import erf
    return erf


def chunked(body):
    """The `fn` of an op computing `body(xp, x, t, y, **attrs)` over chunks of x and the output y, with
    `t` a chunk of scratch: the workspace's, or a temporary when folding, where there is none."""
    def fn(xp, x, out=None, chunk=None, **attrs):
        out = xp.empty_like(x) if out is None else out
        if not x.size:
            return out
        flat_x, flat_y = x.reshape(-1), out.reshape(-1)
        scratch = xp.empty(min(x.size, CHUNK), x.dtype) if chunk is None else chunk
        for start in range(0, x.size, CHUNK):
            xc, yc = flat_x[start:start + CHUNK], flat_y[start:start + CHUNK]
            body(xp, xc, scratch[:xc.size], yc, **attrs)
        return out
    return fn


def one_chunk(ins, outs):
    """The scratch of a `chunked` op: one chunk of the input's dtype."""
    return [("chunk", (min(math.prod(ins[0].shape), CHUNK),), ins[0].dtype)]


def _leaky_relu(xp, x, t, y, alpha):
    """max(x, 0) + alpha min(x, 0), right for every alpha."""
    xp.minimum(x, 0, out=t)
    xp.multiply(t, alpha, out=t)
    xp.maximum(x, 0, out=y)
    xp.add(y, t, out=y)


def _hard_swish(xp, x, t, y):
    """x hard_sigmoid(x) with alpha 1/6, beta 1/2."""
    xp.divide(x, 6, out=t)
    xp.add(t, 0.5, out=t)
    xp.clip(t, 0, 1, out=t)
    xp.multiply(x, t, out=y)


ERFC_FIT = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
            1.48851587, -0.82215223, 0.17087277)
"""erfc(z) = s exp(-z^2 + sum c_k s^k), s = 1 / (1 + z / 2), z >= 0, within a fraction 1.2e-7 of it
everywhere (Numerical Recipes' Chebyshev fit, erfcc)."""


def normal_cdf(xp, x, out, spare):
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2 into `out`, with `spare` scratch of x's shape. float32 on NumPy
    from ERFC_FIT in two dozen ufunc passes, a third of the time of SciPy's erf (12 ns an element), within
    7e-7 of Phi relative to it for |x| < 3 and 3e-6 for |x| < 9 (exp's rounding of -x^2/2 in float32, where
    Phi is below 1e-18); else by erf."""
    if xp.__name__ != "numpy" or x.dtype != np.float32:
        xp.divide(x, math.sqrt(2), out=out)
        erf(xp)(out, out=out)
        xp.add(out, 1, out=out)
        xp.multiply(out, 0.5, out=out)
        return
    xp.abs(x, out=spare)
    xp.multiply(spare, 0.5 / math.sqrt(2), out=spare)
    xp.add(spare, 1, out=spare)
    xp.reciprocal(spare, out=spare)  # s, of z = |x| / sqrt 2
    out.fill(ERFC_FIT[-1])
    for c in ERFC_FIT[-2::-1]:
        xp.multiply(out, spare, out=out)
        xp.add(out, c, out=out)
    xp.exp(out, out=out)
    xp.multiply(out, spare, out=out)
    xp.multiply(x, x, out=spare)
    xp.multiply(spare, -0.5, out=spare)
    xp.exp(spare, out=spare)
    xp.multiply(out, spare, out=out)  # erfc(z): Phi is half of it below 0, 1 less half of it above
    xp.sign(x, out=spare)
    xp.multiply(spare, -0.5, out=spare)  # 0.5 - step(x), step 0 below 0, 1/2 at 0, 1 above: exact
    xp.multiply(out, spare, out=out)
    xp.subtract(0.5, spare, out=spare)
    xp.add(out, spare, out=out)  # Phi = step + erfc(z) (0.5 - step), adding 0 on the lower tail


def gelu(xp, x, t, y, approximate="none", spare=None):
    """x/2 (1 + erf(x / sqrt 2)), or with tanh(sqrt(2/pi) (x + 0.044715 x^3)) when approximate="tanh".
    Given `spare` scratch (not y), the exact form takes `normal_cdf`."""
    if approximate != "tanh" and spare is not None:
        normal_cdf(xp, x, t, spare)
        xp.multiply(x, t, out=y)
        return
    if approximate == "tanh":
        xp.power(x, 3, out=t)
        xp.multiply(t, 0.044715, out=t)
        xp.add(x, t, out=t)
        xp.multiply(t, math.sqrt(2 / math.pi), out=t)
        xp.tanh(t, out=t)
    else:
        xp.divide(x, math.sqrt(2), out=t)
        erf(xp)(t, out=t)
    xp.add(t, 1, out=t)
    xp.multiply(x, 0.5, out=y)
    xp.multiply(y, t, out=y)


def sigmoid(xp, x, out=None):
    """1 / (1 + exp(-x)), one ufunc at a time in the output."""
    out = xp.negative(x, out=out)
    xp.exp(out, out=out)
    xp.add(out, 1, out=out)
    return xp.reciprocal(out, out=out)


def _hard_sigmoid(xp, x, out=None, alpha=0.2, beta=0.5):
    """clip(alpha x + beta, 0, 1), in the output."""
    out = xp.multiply(x, alpha, out=out)
    xp.add(out, beta, out=out)
    return xp.clip(out, 0, 1, out=out)


def _relu_grad(b, node, x, y, dy):
    return b.op("Where", b.op("Greater", y, b.const(0, x)), dy, b.const(0, x))  # y, not x: x may die


def _leaky_relu_grad(b, node, x, y, dy, alpha):
    zero = b.const(0, x)
    scaled = b.op("Mul", dy, b.const(alpha, x))
    return b.op("Where", b.op("Less", x, zero), scaled, dy)


def _hard_sigmoid_grad(b, node, x, y, dy, alpha, beta):
    """alpha on the ramp, where 0 < y < 1."""
    zero = b.const(0, x)
    scaled = b.op("Mul", dy, b.const(alpha, x))
    inside = b.op("Where", b.op("Less", y, b.const(1, x)), scaled, zero)
    return b.op("Where", b.op("Greater", y, zero), inside, zero)


def _hard_swish_grad(b, node, x, y, dy):
    """x / 3 + 1/2 on (-3, 3), 0 below, 1 above."""
    zero = b.const(0, x)
    ramp = b.op("Mul", dy, b.op("Add", b.op("Mul", x, b.const(1 / 3, x)), b.const(0.5, x)))
    return b.op("Where", b.op("Less", x, b.const(-3, x)), zero,
                b.op("Where", b.op("Greater", x, b.const(3, x)), dy, ramp))


def _erf_grad(b, node, x, y, dy):
    """d erf(x) = 2 / sqrt(pi) exp(-x^2) dx."""
    bell = b.op("Exp", b.op("Neg", b.op("Mul", x, x)))
    return b.op("Mul", dy, b.op("Mul", bell, b.const(2 / math.sqrt(math.pi), x)))


def _gelu_grad(b, node, x, y, dy, approximate):
    """Exact Gelu's derivative is Phi(x) + x phi(x), with Phi = (1 + erf(x / sqrt 2)) / 2 and phi =
    exp(-x^2 / 2) / sqrt(2 pi). The tanh Gelu, with t = tanh(c (x + k x^3)), c = sqrt(2 / pi),
    k = 0.044715: (1 + t + x (1 - t^2) c (1 + 3 k x^2)) / 2."""
    if approximate == "tanh":
        c, k, square = math.sqrt(2 / math.pi), 0.044715, b.op("Mul", x, x)
        t = b.op("Tanh", b.op("Mul", x, b.op("Add", b.op("Mul", square, b.const(k * c, x)), b.const(c, x))))
        slope = b.op("Mul", b.op("Mul", x, b.op("Sub", b.const(1, x), b.op("Mul", t, t))),
                     b.op("Add", b.op("Mul", square, b.const(3 * k * c, x)), b.const(c, x)))
        half = b.op("Mul", b.op("Add", b.op("Add", t, b.const(1, x)), slope), b.const(0.5, x))
        return b.op("Mul", dy, half)
    cdf = b.op("Mul", b.op("Add", b.op("Erf", b.op("Mul", x, b.const(1 / math.sqrt(2), x))), b.const(1, x)),
               b.const(0.5, x))
    pdf = b.op("Mul", b.op("Exp", b.op("Mul", b.op("Mul", x, x), b.const(-0.5, x))),
               b.const(1 / math.sqrt(2 * math.pi), x))
    return b.op("Mul", dy, b.op("Add", cdf, b.op("Mul", x, pdf)))


def _torch_gelu(torch, x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


GELU_CUDA = {"none": "0.5 * v * (1 + erf(v * 0.7071067811865476))",
             "tanh": "0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))"}

unary("Relu", lambda xp, x, out=None: xp.maximum(x, 0, out=out), _relu_grad, torch="relu")
unary("Sigmoid", sigmoid, lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Mul", y, b.op("Sub", b.const(1, x), y))),
      torch="sigmoid")
unary("Tanh", "tanh", lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Sub", b.const(1, x), b.op("Mul", y, y))),
      torch="tanh")
unary("Erf", lambda xp, x, out=None: erf(xp)(x, out=out), _erf_grad, torch="erf")
unary("HardSigmoid", _hard_sigmoid, _hard_sigmoid_grad, defaults={"alpha": 0.2, "beta": 0.5},
      torch=lambda torch, x, alpha, beta: torch.clamp(x * alpha + beta, 0, 1),
      cuda="min(max(alpha * v + beta, 0.0), 1.0)")
unary("LeakyRelu", chunked(_leaky_relu), _leaky_relu_grad, scratch=one_chunk, defaults={"alpha": 0.01},
      torch=lambda torch, x, alpha: torch.nn.functional.leaky_relu(x, alpha), cuda="v < 0 ? alpha * v : v")
unary("HardSwish", chunked(_hard_swish), _hard_swish_grad, scratch=one_chunk,
      torch=lambda torch, x: torch.nn.functional.hardswish(x), cuda="v * min(max(v / 6 + 0.5, 0.0), 1.0)")
unary("Gelu", chunked(gelu), _gelu_grad, scratch=one_chunk, defaults={"approximate": "none"}, torch=_torch_gelu,
      cuda=lambda approximate: GELU_CUDA[approximate])
unary("Softplus", lambda xp, x, out=None: xp.logaddexp(x, 0, out=out),
      lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Sigmoid", x)), torch=lambda torch, x: torch.nn.functional.softplus(x),
      autocast="float32")


class Clip(Elementwise):
    """Clip; its bounds are attributes before opset 11 and optional inputs after. Bounds stay Python
    numbers in the kernel: a device scalar would allocate."""

    arity = 1

    attr_inputs = (("min", 1, 11), ("max", 2, 11))

    def infer(self, node, ins):
        return same_as_input(node, ins[:1])


def _clip(xp, x, out=None, min=None, max=None):
    if out is None:
        min, max = (None if v is None else np.asarray(v, x.dtype) for v in (min, max))
    if min is None and max is None:
        out = xp.array(x, copy=True) if out is None else out
        if out is not x:
            xp.copyto(out, x)
        return out
    if max is None:
        return xp.maximum(x, min, out=out)
    if min is None:
        return xp.minimum(x, max, out=out)
    return xp.clip(x, min, max, out=out)


def _clip_grad(b, node, x, y, dy, min, max):
    """dY where the input lies inside the bounds, 0 where Clip held it at one."""
    if min is not None:
        dy = b.op("Where", b.op("Less", x, b.const(min, x)), b.const(0, x), dy)
    if max is not None:
        dy = b.op("Where", b.op("Greater", x, b.const(max, x)), b.const(0, x), dy)
    return dy


register(Clip("Clip", _clip, _clip_grad, defaults={"min": None, "max": None},
              torch=lambda torch, x, min, max: x if min is None and max is None else torch.clamp(x, min, max)))

@schema("Softmax", "LogSoftmax")
class Softmax(Schema):
    """Softmax and LogSoftmax along one axis (opset 13 semantics; the frontend rewrites older ones)."""

    split = "softmax"
    autocast = "float32"
    ranks = "same"
    defaults = {"axis": -1}
    flops = per_input_element(5)

    def infer(self, node, ins):
        axis(self.attr(node, "axis"), ins[0].rank)
        return same_as_input(node, ins)

    def gradient(self, b, node, dys):
        """Softmax: y (dy - sum(dy y)); LogSoftmax: dy - exp(y) sum(dy), sums along the axis."""
        dy, y = dys[0], node.outputs[0]
        a = [self.attr(node, "axis")]
        if node.op == "Softmax":
            dot = b.op("ReduceSum", b.op("Mul", dy, y), axes=a, keepdims=1)
            return [b.op("Mul", y, b.op("Sub", dy, dot))]
        return [b.op("Sub", dy, b.op("Mul", b.op("Exp", y), b.op("ReduceSum", dy, axes=a, keepdims=1)))]

    def workspace(self, node, ins, outs, limit):
        """`rows`, one value per row (the input with its `axis` kept as 1): the row's max, then the row's
        sum (LogSoftmax finds its max again in the output's first column; see its kernel), in the
        accumulation dtype (float32 for 16-bit inputs)."""
        x = ins[0]
        if not math.prod(x.shape):
            return Layout()
        a = axis(self.attr(node, "axis"), x.rank)
        return Layout.pack(("rows", (*x.shape[:a], 1, *x.shape[a + 1:]), self.accumulation(x.dtype)))

    def torch(self, torch, x, axis):
        f = torch.nn.functional
        return (f.softmax if self.op == "Softmax" else f.log_softmax)(x, axis)
