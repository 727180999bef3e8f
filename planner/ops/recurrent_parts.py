"""What LSTM, GRU and RNN (planner/ops/recurrent.py) are made of: their gate activations, each in three
forms (in place on an array, as ops of the autodiff Builder, in PyTorch), and the recurrence unrolled
over time, written once for two algebras: the Builder's ops (the decomposition that training
differentiates through) and PyTorch's (the op's torch form)."""
from dataclasses import dataclass

from .registry import get
from .shape_ops import zeros
from ..errors import ShapeError
from ..ir import Tensor


def _elu(xp, x, t, alpha, beta):
    """The in-place forms below take scratch `t` of x's shape where x and a function of it meet."""
    xp.minimum(x, 0, out=t)
    xp.expm1(t, out=t)
    xp.multiply(t, alpha, out=t)
    xp.maximum(x, 0, out=x)
    xp.add(x, t, out=x)


def _leaky_relu(xp, x, t, alpha, beta):
    xp.minimum(x, 0, out=t)
    xp.multiply(t, alpha - 1, out=t)
    xp.add(x, t, out=x)  # x - (1 - alpha) min(x, 0)


def _thresholded_relu(xp, x, t, alpha, beta):
    xp.greater(x, alpha, out=t)
    xp.multiply(x, t, out=x)


def _softsign(xp, x, t, alpha, beta):
    xp.abs(x, out=t)
    xp.add(t, 1, out=t)
    xp.divide(x, t, out=x)


def _hard_sigmoid(xp, x, t, alpha, beta):
    xp.multiply(x, alpha, out=x)
    xp.add(x, beta, out=x)
    xp.clip(x, 0, 1, out=x)


def _built(op, *names):
    """The Builder form of an activation that is one op of memplan's, taking alpha (and beta) as the
    attributes `names`."""
    return lambda b, x, alpha, beta: b.op(op, x, **dict(zip(names, (alpha, beta))))


def _composite(op):
    """The Builder form of an activation that is a composite (planner/ops/composite.py): its parts."""
    return lambda b, x, alpha, beta: get(op).parts(b, None, x, **({"alpha": alpha} if get(op).defaults else {}))


ACTIVATIONS = {
    # name, lower case: (defaults of the alpha and beta it takes; in place fn(xp, x, scratch, alpha, beta);
    #                    Builder form; PyTorch form)
    "sigmoid": ((), lambda xp, x, t, a, c: get("Sigmoid").fn(xp, x, out=x), _built("Sigmoid"),
                lambda torch, x, a, c: torch.sigmoid(x)),
    "tanh": ((), lambda xp, x, t, a, c: xp.tanh(x, out=x), _built("Tanh"), lambda torch, x, a, c: torch.tanh(x)),
    "relu": ((), lambda xp, x, t, a, c: xp.maximum(x, 0, out=x), _built("Relu"), lambda torch, x, a, c: torch.relu(x)),
    "affine": ((1.0, 0.0), lambda xp, x, t, a, c: xp.add(xp.multiply(x, a, out=x), c, out=x),
               lambda b, x, a, c: b.op("Add", b.op("Mul", x, b.const(a, x)), b.const(c, x)),
               lambda torch, x, a, c: x * a + c),
    "scaledtanh": ((1.0, 1.0), lambda xp, x, t, a, c: xp.multiply(xp.tanh(xp.multiply(x, c, out=x), out=x), a, out=x),
                   lambda b, x, a, c: b.op("Mul", b.op("Tanh", b.op("Mul", x, b.const(c, x))), b.const(a, x)),
                   lambda torch, x, a, c: torch.tanh(x * c) * a),
    "leakyrelu": ((0.01,), _leaky_relu, _built("LeakyRelu", "alpha"),
                  lambda torch, x, a, c: torch.nn.functional.leaky_relu(x, a)),
    "thresholdedrelu": ((1.0,), _thresholded_relu, _composite("ThresholdedRelu"),
                        lambda torch, x, a, c: torch.where(x > a, x, torch.zeros_like(x))),
    "hardsigmoid": ((0.2, 0.5), _hard_sigmoid, _built("HardSigmoid", "alpha", "beta"),
                    lambda torch, x, a, c: torch.clamp(x * a + c, 0, 1)),
    "elu": ((1.0,), _elu, _composite("Elu"), lambda torch, x, a, c: torch.nn.functional.elu(x, a)),
    "softsign": ((), _softsign, _composite("Softsign"), lambda torch, x, a, c: torch.nn.functional.softsign(x)),
    "softplus": ((), lambda xp, x, t, a, c: xp.logaddexp(x, 0, out=x), _built("Softplus"),
                 lambda torch, x, a, c: torch.nn.functional.softplus(x)),
}


def activations(names, alphas, betas):
    """[(name, alpha, beta)] of the node's activations. As onnxruntime reads them, the lists of alphas
    and betas are consumed in order by the activations that take them; the rest take their defaults."""
    alphas, betas, out = list(alphas or ()), list(betas or ()), []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise ShapeError(f"activation {name!r} is not one of {', '.join(ACTIVATIONS)} (any case)")
        params = [*ACTIVATIONS[key][0], 0.0, 0.0]
        for k, given in enumerate((alphas, betas)[:len(ACTIVATIONS[key][0])]):
            if given:
                params[k] = given.pop(0)
        out.append((key, float(params[0]), float(params[1])))
    return tuple(out)


class Built:
    """The algebra of the unrolled recurrence as ops of the autodiff Builder `b`; `like` is a typed
    tensor of the op's dtype, for constants."""

    def __init__(self, b, like):
        self.b, self.like = b, like

    def op(self, op, *inputs, **attrs):
        return self.b.op(op, *inputs, **attrs)

    def add(self, x, y):
        return self.op("Add", x, y)

    def sub(self, x, y):
        return self.op("Sub", x, y)

    def mul(self, x, y):
        return self.op("Mul", x, y)

    def matmul(self, x, y):
        return self.op("MatMul", x, y)

    def transpose(self, x, perm):
        return self.op("Transpose", x, perm=list(perm))

    def one_minus(self, x):
        return self.sub(self.b.const(1, self.like), x)

    def clip(self, x, bound):
        return self.op("Clip", x, min=-bound, max=bound)

    def act(self, x, name, alpha, beta):
        self.b.tensors[x] = Tensor(x, None, self.b.dtype(self.like), "activation")  # its dtype, for the consts
        return ACTIVATIONS[name][2](self.b, x, alpha, beta)

    def split(self, x, sizes, axis):
        return list(self.op("Split", x, outputs=len(sizes), axis=axis, split=list(sizes))) if len(sizes) > 1 else [x]

    def unbind(self, x, n, axis=0):
        parts = self.split(x, [1] * n, axis)
        return [self.op("Squeeze", part, axes=[axis]) for part in parts]

    def stack(self, xs, axis):
        parts = [self.op("Unsqueeze", x, axes=[axis]) for x in xs]
        return self.op("Concat", *parts, axis=axis) if len(parts) > 1 else parts[0]

    def zeros(self, shape):
        return zeros(self.b, shape, self.b.dtype(self.like))


class Torch:
    """The algebra of the unrolled recurrence in PyTorch."""

    def __init__(self, torch, like):
        self.torch, self.like = torch, like

    add = staticmethod(lambda x, y: x + y)
    sub = staticmethod(lambda x, y: x - y)
    mul = staticmethod(lambda x, y: x * y)
    one_minus = staticmethod(lambda x: 1 - x)

    def matmul(self, x, y):
        return self.torch.matmul(x, y)

    def transpose(self, x, perm):
        return x.permute(*perm)

    def clip(self, x, bound):
        return self.torch.clamp(x, -bound, bound)

    def act(self, x, name, alpha, beta):
        return ACTIVATIONS[name][3](self.torch, x, alpha, beta)

    def split(self, x, sizes, axis):
        return list(self.torch.split(x, list(sizes), axis))

    def unbind(self, x, n, axis=0):
        return list(self.torch.unbind(x, axis))

    def stack(self, xs, axis):
        return self.torch.stack(xs, axis)

    def zeros(self, shape):
        return self.torch.zeros(shape, dtype=self.like.dtype, device=self.like.device)


@dataclass(frozen=True)
class Settings:
    """One recurrent node's sizes and attributes, checked: sequence length T, batch B, input size I,
    hidden size H, directions D; per direction whether it runs backwards in time and its activations
    ((name, alpha, beta) each); the cell clip (None: none), layout 1 (batch first), and LSTM's
    input_forget and GRU's linear_before_reset."""

    T: int
    B: int
    I: int
    H: int
    D: int
    reverse: tuple
    acts: tuple
    clip: float | None
    layout: int
    input_forget: bool = False
    linear_before_reset: bool = False


def _gate(m, s, x, act):
    """An activation of the cell, its input clipped first where the node has a clip."""
    return m.act(x if s.clip is None else m.clip(x, s.clip), *act)


def _recur(m, h, rt, rb):
    """h R^T (+ Rb): the recurrent term of some gates."""
    y = m.matmul(h, rt)
    return y if rb is None else m.add(y, rb)


def lstm_cell(m, s, xw, h, c, rts, rbs, p, acts):
    """ONNX's LSTM step (gates i, o, f, c): the new (h, c)."""
    f_act, g_act, h_act = acts
    i, o, f, g = m.split(m.add(xw, _recur(m, h, rts[0], rbs[0])), [s.H] * 4, 1)
    if p is not None:
        i = m.add(i, m.mul(p[0], c))
        f = f if s.input_forget else m.add(f, m.mul(p[2], c))
    i = _gate(m, s, i, f_act)
    f = m.one_minus(i) if s.input_forget else _gate(m, s, f, f_act)
    c = m.add(m.mul(f, c), m.mul(i, _gate(m, s, g, g_act)))
    if p is not None:
        o = m.add(o, m.mul(p[1], c))
    return m.mul(_gate(m, s, o, f_act), m.act(c, *h_act)), c


def gru_cell(m, s, xw, h, c, rts, rbs, p, acts):
    """ONNX's GRU step (gates z, r, h), the reset gate applied before or after the recurrent product."""
    f_act, g_act = acts
    x_zr, x_h = m.split(xw, [2 * s.H, s.H], 1)
    z, r = m.split(_gate(m, s, m.add(x_zr, _recur(m, h, rts[0], rbs[0])), f_act), [s.H, s.H], 1)
    if s.linear_before_reset:
        candidate = m.add(x_h, m.mul(r, _recur(m, h, rts[1], rbs[1])))
    else:
        candidate = m.add(x_h, _recur(m, m.mul(r, h), rts[1], rbs[1]))
    candidate = _gate(m, s, candidate, g_act)
    return m.add(candidate, m.mul(z, m.sub(h, candidate))), None


def rnn_cell(m, s, xw, h, c, rts, rbs, p, acts):
    """ONNX's RNN step."""
    return _gate(m, s, m.add(xw, _recur(m, h, rts[0], rbs[0])), acts[0]), None


BLOCKS = {lstm_cell: (4,), gru_cell: (2, 1), rnn_cell: (1,)}
"""The column blocks of R^T (in hidden sizes) each cell multiplies h by separately."""


def unroll(m, cell, s, x, w, r, bias, h0, c0, p, want_y=True):
    """(Y (T, D, B, H) or None, Y_h (D, B, H), Y_c (D, B, H) or None) of the time-major inputs (x of
    (T, B, I), h0 and c0 of (D, B, H), each optional one None), one `cell` step after the other in the
    algebra `m`: x W^T for every step at once, then per step the recurrent terms."""
    def per_direction(t):
        return [None] * s.D if t is None else m.unbind(t, s.D)

    ys, hs, cs = [], [], []
    blocks = [k * s.H for k in BLOCKS[cell]]
    for d, (wd, rd, bd, hd, cd, pd) in enumerate(zip(*map(per_direction, (w, r, bias, h0, c0, p)))):
        xw = m.matmul(x, m.transpose(wd, (1, 0)))
        rbs = [None] * len(blocks)
        if bd is not None:
            wb, rb = m.split(bd, [sum(blocks)] * 2, 0)
            xw, rbs = m.add(xw, wb), m.split(rb, blocks, 0)
        rts = m.split(m.transpose(rd, (1, 0)), blocks, 1)
        h = m.zeros((s.B, s.H)) if hd is None else hd
        c = (m.zeros((s.B, s.H)) if cd is None else cd) if cell is lstm_cell else None
        pd = None if pd is None else m.split(pd, [s.H] * 3, 0)
        steps, out = m.unbind(xw, s.T) if s.T else [], [None] * s.T
        for t in (range(s.T - 1, -1, -1) if s.reverse[d] else range(s.T)):
            h, c = cell(m, s, steps[t], h, c, rts, rbs, pd, s.acts[d])
            out[t] = h
        ys.append(m.stack(out, 0) if s.T else m.zeros((0, s.B, s.H)))
        hs.append(h)
        cs.append(c)
    return (m.stack(ys, 1) if want_y else None, m.stack(hs, 0), m.stack(cs, 0) if cell is lstm_cell else None)


def time_major(m, s, *tensors):
    """Layout 1's (batch first) X, initial_h and initial_c as layout 0's (time first); None stays None."""
    return [t if t is None or not s.layout else m.transpose(t, (1, 0, 2)) for t in tensors]


def batch_major(m, s, y, y_h, y_c):
    """Y, Y_h and Y_c of layout 0 in the node's layout."""
    if not s.layout:
        return y, y_h, y_c
    return (None if y is None else m.transpose(y, (2, 0, 1, 3)),
            *(None if t is None else m.transpose(t, (1, 0, 2)) for t in (y_h, y_c)))
