"""Elementwise kernels: arithmetic, comparisons, logic and Where, each a ufunc writing into its output."""
from . import attr, kernel

UFUNCS = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Equal": "equal", "Less": "less",
          "Greater": "greater", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "negative",
          "Abs": "absolute", "Reciprocal": "reciprocal", "Not": "logical_not"}


@kernel(*UFUNCS)
def ufunc(xp, step, ins, outs, ws):
    """The op's ufunc, broadcasting its inputs into the output."""
    getattr(xp, UFUNCS[step.op])(*ins, out=outs[0])


@kernel("Div")
def div(xp, step, ins, outs, ws):
    """Integer Div truncates toward zero, as in C: a - fmod(a, b) is an exact multiple of b, so
    flooring its quotient is exact for every integer width (a float quotient is not, past 2^53)."""
    a, b = ins
    if outs[0].dtype.kind in "iu":
        xp.floor_divide(a - xp.fmod(a, b), b, out=outs[0])
    else:
        xp.true_divide(a, b, out=outs[0])


@kernel("Pow")
def power(xp, step, ins, outs, ws):
    """The exponent may have another dtype: the power is taken in the common one and cast to the base's."""
    xp.power(*ins, out=outs[0], casting="unsafe")


@kernel("Mod")
def mod(xp, step, ins, outs, ws):
    """fmod=1: the remainder takes the dividend's sign (C's fmod); fmod=0: the divisor's (Python's %)."""
    (xp.fmod if attr(step, "fmod") else xp.mod)(*ins, out=outs[0])


@kernel("Where")
def where(xp, step, ins, outs, ws):
    """y everywhere, then x where c holds: no temporary, and right when the output is y itself."""
    c, x, y = ins
    xp.copyto(outs[0], y)
    xp.copyto(outs[0], x, where=xp.broadcast_to(c, outs[0].shape))
