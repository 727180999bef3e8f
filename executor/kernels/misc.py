"""Kernels of ops that make or convert values: Cast, Range, ConstantOfShape, Trilu, Dropout, memplan.Dropout."""
from planner import ops
from planner.ops.misc import dropout_keep

from . import attr, evaluated, kernel


@kernel("Cast")
def cast(xp, step, ins, outs, ws):
    """A plain conversion to NumPy's own dtypes; ml_dtypes' targets (float8 with saturation, int4, ...)
    follow the schema's rules."""
    if outs[0].dtype.type.__module__ == "numpy":
        xp.copyto(outs[0], ins[0], casting="unsafe")
    else:
        evaluated(xp, step, ins, outs)


@kernel("Range")
def arange(xp, step, ins, outs, ws):
    """Computed on the host by the schema (its length was fixed when planning)."""
    evaluated(xp, step, ins, outs)


@kernel("ConstantOfShape")
def constant_of_shape(xp, step, ins, outs, ws):
    """The output filled with the one-element `value`."""
    outs[0].fill(attr(step, "value").reshape(-1)[0])


@kernel("Trilu")
def trilu(xp, step, ins, outs, ws):
    """The upper (or lower) triangle from diagonal k of the last two dims, zeros elsewhere."""
    xp.copyto(outs[0], (xp.triu if attr(step, "upper") else xp.tril)(ins[0], attr(step, "k")))


@kernel("Dropout")
def dropout(xp, step, ins, outs, ws):
    """In inference the data passes through (usually as a view, already in place) with an all-true
    mask; the random training form is the schema's, drawn on the host from `seed`."""
    if not ops.of(step).is_view(step):
        evaluated(xp, step, ins, outs)
        return
    y, mask = [*outs, None][:2]
    if y is not None and y is not ins[0]:
        xp.copyto(y, ins[0])
    if mask is not None:
        mask.fill(True)


@kernel("Dropout", domain="memplan")
def step_dropout(xp, step, ins, outs, ws):
    """The step's mask from the hash (one fused kernel on the GPU: backends/cupy_kernels.py)."""
    x, t = ins
    y, mask = [*outs, None][:2]
    ratio = attr(step, "ratio")
    keep = dropout_keep(xp, x.size, attr(step, "seed"), float(t), ratio).reshape(x.shape)
    if mask is not None:
        xp.copyto(mask, keep)
    xp.multiply(x, keep, out=y)
    xp.multiply(y, y.dtype.type(1 / (1 - ratio)), out=y)

