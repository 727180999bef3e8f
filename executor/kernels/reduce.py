"""Reduction kernels: ReduceSum, ReduceMean and ReduceMax over the step's axes, straight into the output."""
from planner import ops

from . import evaluated, kernel

REDUCERS = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max"}


@kernel(*REDUCERS)
def reduce(xp, step, ins, outs, ws):
    """The output is seen with the reduced axes kept (size 1), so one `out=` call fills it. An empty
    input (max's -inf, mean's NaN) and an integer mean (whose sum would wrap in the output's dtype)
    take the schema's NumPy form on the host."""
    x, y = ins[0], outs[0]
    axes = ops.of(step).reduced_axes(step, x.ndim)
    if axes is None:
        xp.copyto(y, x)
    elif x.size == 0 or step.op == "ReduceMean" and y.dtype.kind in "biu":
        evaluated(xp, step, ins, outs)
    else:
        kept = y if step.attrs["keepdims"] else y.reshape([1 if k in axes else d for k, d in enumerate(x.shape)])
        getattr(xp, REDUCERS[step.op])(x, axis=axes, keepdims=True, out=kept)
