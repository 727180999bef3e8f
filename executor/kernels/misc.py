"""Kernels of ops that make or convert values: Cast, Range, ConstantOfShape, Trilu, Dropout."""
from . import attr, evaluated, kernel


@kernel("Cast")
def cast(xp, step, ins, outs, ws):
    """A plain conversion; float8 and other ml_dtypes targets follow the schema's rules (saturation)."""
    if outs[0].dtype.kind in "biuf" and outs[0].dtype.itemsize >= 2 or outs[0].dtype.kind in "biu":
        xp.copyto(outs[0], ins[0], casting="unsafe")
    else:
        evaluated(xp, step, ins, outs)


@kernel("Range", "ConstantOfShape")
def constant(xp, step, ins, outs, ws):
    evaluated(xp, step, ins, outs)


@kernel("Trilu")
def trilu(xp, step, ins, outs, ws):
    xp.copyto(outs[0], (xp.triu if attr(step, "upper") else xp.tril)(ins[0], attr(step, "k")))


@kernel("Dropout")
def dropout(xp, step, ins, outs, ws):
    evaluated(xp, step, ins, outs)
