"""Unary math ops, one entry each: `unary(op, ufunc or fn, gradient, rules)` (see planner/ops/
elementwise.py). Piecewise-constant ops (Floor, Ceil, Round, Sign) pass no gradient back, which
is PyTorch's zero gradient; predicates (IsNaN, IsInf) make bools."""
import numpy as np

from .elementwise import unary


def _square_plus(b, x, k):
    """x^2 + k."""
    return b.op("Add", b.op("Mul", x, x), b.const(k, x))


def _one_minus_square(b, x):
    """1 - x^2."""
    return b.op("Sub", b.const(1, x), b.op("Mul", x, x))


def _is_inf(xp, x, out=None, detect_negative=1, detect_positive=1):
    """Infinities of the signs asked for, each test one ufunc into the output."""
    if detect_negative and detect_positive:
        return xp.isinf(x, out=out)
    if detect_negative or detect_positive:
        return xp.equal(x, -np.inf if detect_negative else np.inf, out=out)
    out = xp.empty(x.shape, bool) if out is None else out
    out.fill(False)
    return out


def _torch_is_inf(torch, x, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative or detect_positive:
        return (torch.isneginf if detect_negative else torch.isposinf)(x)
    return torch.zeros_like(x, dtype=torch.bool)


unary("Neg", "negative", lambda b, n, x, y, dy: b.op("Neg", dy), torch="neg")
unary("Abs", "absolute", lambda b, n, x, y, dy: b.op("Where", b.op("Less", x, b.const(0, x)), b.op("Neg", dy), dy),
      torch="abs")
unary("Reciprocal", "reciprocal", lambda b, n, x, y, dy: b.op("Neg", b.op("Mul", dy, b.op("Mul", y, y))),
      torch="reciprocal", autocast="float32")
unary("Sqrt", "sqrt", lambda b, n, x, y, dy: b.op("Div", b.op("Mul", dy, b.const(0.5, x)), y),
      torch="sqrt", autocast="float32")
unary("Exp", "exp", lambda b, n, x, y, dy: b.op("Mul", dy, y), torch="exp", autocast="float32")
unary("Log", "log", lambda b, n, x, y, dy: b.op("Div", dy, x), torch="log", autocast="float32")

unary("Sin", "sin", lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Cos", x)), torch="sin")
unary("Cos", "cos", lambda b, n, x, y, dy: b.op("Neg", b.op("Mul", dy, b.op("Sin", x))), torch="cos")
unary("Tan", "tan", lambda b, n, x, y, dy: b.op("Mul", dy, _square_plus(b, y, 1)), torch="tan", autocast="float32")
unary("Asin", "arcsin", lambda b, n, x, y, dy: b.op("Div", dy, b.op("Sqrt", _one_minus_square(b, x))),
      torch="asin", autocast="float32")
unary("Acos", "arccos", lambda b, n, x, y, dy: b.op("Neg", b.op("Div", dy, b.op("Sqrt", _one_minus_square(b, x)))),
      torch="acos", autocast="float32")
unary("Atan", "arctan", lambda b, n, x, y, dy: b.op("Div", dy, _square_plus(b, x, 1)), torch="atan")
unary("Sinh", "sinh", lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Cosh", x)), torch="sinh", autocast="float32")
unary("Cosh", "cosh", lambda b, n, x, y, dy: b.op("Mul", dy, b.op("Sinh", x)), torch="cosh", autocast="float32")
unary("Asinh", "arcsinh", lambda b, n, x, y, dy: b.op("Div", dy, b.op("Sqrt", _square_plus(b, x, 1))), torch="asinh")
unary("Acosh", "arccosh", lambda b, n, x, y, dy: b.op("Div", dy, b.op("Sqrt", _square_plus(b, x, -1))),
      torch="acosh")
unary("Atanh", "arctanh", lambda b, n, x, y, dy: b.op("Div", dy, _one_minus_square(b, x)), torch="atanh")

unary("Floor", "floor", lambda b, n, x, y, dy: None, torch="floor")
unary("Ceil", "ceil", lambda b, n, x, y, dy: None, torch="ceil")
unary("Round", "rint", lambda b, n, x, y, dy: None, torch="round")
unary("Sign", "sign", lambda b, n, x, y, dy: None, torch="sign")

unary("IsNaN", "isnan", torch="isnan", result=np.bool_, inplace=())
unary("IsInf", _is_inf, torch=_torch_is_inf, result=np.bool_, inplace=(),
      defaults={"detect_negative": 1, "detect_positive": 1})
