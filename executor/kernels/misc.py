"""Kernels of ops that make or convert values: Cast, Range, ConstantOfShape, Trilu, Dropout, memplan.Dropout."""
from planner import ops
from planner.ops.misc import dropout_keep

from . import kernel


@kernel("Cast")
def cast(xp, step, ins, outs, ws):
    """A plain conversion to NumPy's own dtypes; ml_dtypes' targets (float8 with saturation, int4, ...)
    follow the schema's rules."""
    if outs[0].dtype.type.__module__ == "numpy":
        xp.copyto(outs[0], ins[0], casting="unsafe")
    else:
        ops.of(step).evaluate_into(xp, step, ins, outs)


@kernel("Range")
def arange(xp, step, ins, outs, ws):
    """Computed on the host by the schema (its length was fixed when planning)."""
    ops.of(step).evaluate_into(xp, step, ins, outs)


@kernel("ConstantOfShape")
def constant_of_shape(xp, step, ins, outs, ws):
    """The output filled with the one-element `value`."""
    outs[0].fill(step.attrs["value"].reshape(-1)[0])


@kernel("Trilu")
def trilu(xp, step, ins, outs, ws):
    """The input, then the other side of diagonal k zeroed row by row of the last two dims (the upper
    triangle keeps columns from row + k on, the lower up to row + k)."""
    x, y = ins[0], outs[0]
    k, upper = step.attrs["k"], step.attrs["upper"]
    if y is not x:
        xp.copyto(y, x)
    rows, cols = y.shape[-2:]
    for i in range(rows):
        edge = min(max(i + k + (0 if upper else 1), 0), cols)
        zeroed = y[..., i, :edge] if upper else y[..., i, edge:]
        zeroed.fill(0)


@kernel("Dropout")
def dropout(xp, step, ins, outs, ws):
    """In inference the data passes through (usually as a view, already in place) with an all-true
    mask; the random training form is the schema's, drawn on the host from `seed`."""
    if not ops.of(step).is_view(step):
        ops.of(step).evaluate_into(xp, step, ins, outs)
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
    ratio = step.attrs["ratio"]
    keep = dropout_keep(xp, x.size, step.attrs["seed"], float(t), ratio).reshape(x.shape)
    if mask is not None:
        xp.copyto(mask, keep)
    xp.multiply(x, keep, out=y)
    xp.multiply(y, y.dtype.type(1 / (1 - ratio)), out=y)

