"""Elementwise kernels: arithmetic, comparisons, logic and Where, each a ufunc writing into its output."""
from . import kernel

UFUNCS = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Equal": "equal", "Less": "less",
          "Greater": "greater", "Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Neg": "negative",
          "Abs": "absolute", "Reciprocal": "reciprocal", "Not": "logical_not"}


@kernel(*UFUNCS)
def ufunc(xp, step, ins, outs, ws):
    getattr(xp, UFUNCS[step.op])(*ins, out=outs[0])


@kernel("Div")
def div(xp, step, ins, outs, ws):
    """Integer Div truncates toward zero, as in C."""
    a, b = ins
    if outs[0].dtype.kind in "iu":
        xp.copyto(outs[0], xp.trunc(xp.true_divide(a, b)), casting="unsafe")
    else:
        xp.true_divide(a, b, out=outs[0])


@kernel("Pow")
def power(xp, step, ins, outs, ws):
    a, b = ins
    if b.dtype == a.dtype:
        xp.power(a, b, out=outs[0])
    else:
        xp.copyto(outs[0], xp.power(a, b), casting="unsafe")


@kernel("Mod")
def mod(xp, step, ins, outs, ws):
    from . import attr
    (xp.fmod if attr(step, "fmod") else xp.mod)(*ins, out=outs[0])


@kernel("Where")
def where(xp, step, ins, outs, ws):
    """y everywhere, then x where c holds: no temporary, and right when the output is y itself."""
    c, x, y = ins
    xp.copyto(outs[0], y)
    xp.copyto(outs[0], x, where=xp.broadcast_to(c, outs[0].shape))
