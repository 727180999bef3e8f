"""Binary elementwise ops with NumPy broadcasting, one entry each: arithmetic, comparisons, logic and
bitwise operations (see planner/ops/elementwise.py for what an entry holds)."""
import numpy as np

from .elementwise import binary, unary
from ..dtypes import to_onnx


def _div(xp, a, b, out=None, remainder=None):
    """ONNX integer Div truncates toward zero, as in C: a - fmod(a, b) is an exact multiple of b, so
    flooring its quotient is exact for every integer width (a float quotient is not, past 2^53). The
    multiple is made in the `remainder` scratch, since the output may be a or b themselves."""
    if a.dtype.kind not in "iu":
        return xp.true_divide(a, b, out=out)
    if remainder is None:
        return xp.floor_divide(a - xp.fmod(a, b), b, out=out)
    xp.fmod(a, b, out=remainder)
    xp.subtract(a, remainder, out=remainder)
    return xp.floor_divide(remainder, b, out=out)


def _integer_remainder(ins, outs):
    """Integer Div's scratch: the output-sized multiple of b it divides exactly."""
    shape, dtype = outs[0]
    return [("remainder", shape, dtype)] if np.dtype(dtype).kind in "iu" else None


def _pow(xp, a, b, out=None):
    """The exponent may have another dtype: the power is taken in the common one and cast to the base's."""
    if out is None:
        return xp.power(a, b).astype(a.dtype)
    return xp.power(a, b, out=out, casting="unsafe")


def _mod(xp, a, b, out=None, fmod=0):
    """fmod=1: the remainder takes the dividend's sign (C's fmod); fmod=0: the divisor's (Python's %)."""
    return (xp.fmod if fmod else xp.mod)(a, b, out=out)


def _shift(xp, a, b, out=None, direction="LEFT"):
    return (xp.left_shift if direction == "LEFT" else xp.right_shift)(a, b, out=out)


def _add_grad(b, node, x, w, y, dy):
    return dy, dy


def _sub_grad(b, node, x, w, y, dy):
    return dy, b.op("Neg", dy)


def _mul_grad(b, node, x, w, y, dy):
    return b.op("Mul", dy, w), b.op("Mul", dy, x)


def _div_grad(b, node, x, w, y, dy):
    """y = x / w: dx = dy / w, dw = -dy * y / w."""
    return b.op("Div", dy, w), b.op("Neg", b.op("Div", b.op("Mul", dy, y), w))


def _pow_grad(b, node, x, p, y, dy):
    """y = x^p: dx = dy p x^(p-1) = dy p y / x; dp = dy y log x (for a positive base)."""
    same = b.dtype(p) == b.dtype(x)
    exponent = p if same else b.op("Cast", p, to=to_onnx(b.dtype(x)))
    dx = b.op("Mul", dy, b.op("Mul", exponent, b.op("Pow", x, b.op("Sub", exponent, b.const(1, x)))))
    dp = b.op("Mul", dy, b.op("Mul", y, b.op("Log", x))) if same else None
    return dx, dp


def _mod_grad(b, node, x, w, y, dy, fmod):
    """y = x - w n, with n the whole quotient (truncated for fmod, floored otherwise) and flat where
    differentiable: dx = dY, dw = -dY n = -dY (x - y) / w."""
    return dy, b.op("Neg", b.op("Mul", dy, b.op("Div", b.op("Sub", x, y), w)))


def _torch_div(torch, a, b):
    """Integer Div truncates toward zero."""
    return torch.div(a, b, rounding_mode=None if a.is_floating_point() else "trunc")


def _torch_mod(torch, a, b, fmod=0):
    return (torch.fmod if fmod else torch.remainder)(a, b)


def _torch_shift(torch, a, b, direction="LEFT"):
    return (torch.bitwise_left_shift if direction == "LEFT" else torch.bitwise_right_shift)(a, b)


binary("Add", "add", _add_grad, torch="add", numbers=True)
binary("Sub", "subtract", _sub_grad, torch="sub", numbers=True)
binary("Mul", "multiply", _mul_grad, torch="mul", numbers=True)
binary("Div", _div, _div_grad, torch=_torch_div, scratch=_integer_remainder, numbers=True)
binary("Pow", _pow, _pow_grad, torch=lambda torch, a, b: torch.pow(a, b).to(a.dtype), same_dtype=False,
       inplace=((0, 0),), autocast="float32", numbers=True, setting_inputs={1: "the exponent of a Pow"})
binary("Mod", _mod, _mod_grad, torch=_torch_mod, defaults={"fmod": 0}, numbers=True)

binary("Equal", "equal", torch="eq", result=np.bool_, inplace=(), numbers=True)
binary("Less", "less", torch="lt", result=np.bool_, inplace=(), numbers=True)
binary("Greater", "greater", torch="gt", result=np.bool_, inplace=(), numbers=True)
binary("LessOrEqual", "less_equal", torch="le", result=np.bool_, inplace=(), numbers=True)
binary("GreaterOrEqual", "greater_equal", torch="ge", result=np.bool_, inplace=(), numbers=True)

binary("And", "logical_and", torch="logical_and")
binary("Or", "logical_or", torch="logical_or")
binary("Xor", "logical_xor", torch="logical_xor")
unary("Not", "logical_not", torch="logical_not")

binary("BitwiseAnd", "bitwise_and", torch="bitwise_and")
binary("BitwiseOr", "bitwise_or", torch="bitwise_or")
binary("BitwiseXor", "bitwise_xor", torch="bitwise_xor")
unary("BitwiseNot", "invert", torch="bitwise_not")
binary("BitShift", _shift, torch=_torch_shift, defaults={"direction": "LEFT"})
