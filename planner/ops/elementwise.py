"""Elementwise ops, one entry each: the entry holds everything memplan knows of the op, so that adding
one is one line (see planner/ops/math_ops.py and "What a change touches" in docs/ARCHITECTURE.md).

An entry's `fn(xp, *arrays, out=None, **attrs)` computes the op with NumPy or CuPy (`xp`): the kernel,
writing into `out`, and the constant folder, making a new array, alike. Its dtype rule, in-place rule,
gradient, PyTorch form (`torch`) and optional fused CUDA body (`cuda`) sit beside it.
"""
import numpy as np

from .registry import register
from .base import Layout, Schema, broadcast, no_gradient, same_dtype
from ..dtypes import to_onnx
from ..errors import ShapeError


def ufunc(name):
    """The `fn` of an op that is one NumPy/CuPy ufunc (the two modules name them alike)."""
    return lambda xp, *arrays, out=None: getattr(xp, name)(*arrays, out=out)


def torch_function(name):
    """The `torch` form of an op that is one function of the torch module."""
    return lambda torch, *tensors, **attrs: getattr(torch, name)(*tensors)


class Elementwise(Schema):
    """An op computed element by element with NumPy broadcasting by `fn`.

    `result`: the output dtype where it is fixed (bool for comparisons), else the first input's;
    `same_dtype`: the inputs share one dtype; `scratch(ins, outs)`: the (name, shape, dtype) parts of
    a workspace that `fn` takes by name (None: none), for the forms that would need temporaries; `grad(b, node, *inputs, y, dy, **attributes)`: the input
    gradients (one per input, None where none flows), or None for an op memplan does not differentiate.
    """

    split = "elementwise"
    fn = None
    grad = None
    scratch = None
    ranks = "broadcast"
    same_dtype = True
    inplace = ((0, 0),)

    def __init__(self, op, fn, grad=None, torch=None, defaults=None, **rules):
        """The entry of `op`; `torch` is a torch function's name or a form `fn(torch, *tensors, **attrs)`,
        `defaults` the ONNX attributes `fn` takes, `rules` any other class attribute (result, cuda,
        inplace, scratch, domain, since, ...)."""
        self.op, self.fn, self.grad, self.defaults = op, fn, grad, defaults or {}
        self.torch = torch_function(torch) if isinstance(torch, str) else torch
        for key, value in rules.items():
            if not hasattr(self, key):
                raise TypeError(f"{op}: unknown rule {key!r}")
            setattr(self, key, value)

    def infer(self, node, ins):
        present = [i for i in ins if i is not None]
        if self.same_dtype:
            same_dtype(present)
        dtype = np.dtype(self.result) if self.result is not None else present[0].dtype
        return [(broadcast(*(i.shape for i in present)), dtype)]

    def evaluate(self, node, *arrays):
        return [self.fn(np, *arrays, **self.arguments(node))]

    def workspace(self, node, ins, outs, limit):
        parts = self.scratch(ins, outs) if self.scratch else None
        return Layout.pack(*parts) if parts else Layout()

    def kernel(self, xp, step, ins, outs, ws):
        self.fn(xp, *ins, out=outs[0], **ws, **self.arguments(step))

    @property
    def differentiable(self):
        return self.grad is not None

    def gradient(self, b, node, dys):
        if self.grad is None:
            return no_gradient(node)
        inputs, y = node.inputs, node.outputs[0]
        grads = self.grad(b, node, *inputs, y, dys[0], **self.arguments(node))
        grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
        out = b.shape(y)
        return [g and b.unbroadcast(g, out, b.shape(x)) for g, x in zip(grads, inputs)]


def unary(op, fn, grad=None, **rules):
    """Register the unary elementwise op `op` computed by `fn` (a ufunc name, or an `fn`), with its
    gradient `grad(b, node, x, y, dy, **attributes)` and other rules of Elementwise."""
    rules.setdefault("arity", 1)
    register(Elementwise(op, ufunc(fn) if isinstance(fn, str) else fn, grad, **rules))


def binary(op, fn, grad=None, **rules):
    """Register a binary elementwise op; `grad(b, node, a, c, y, dy)` returns both inputs' gradients
    at the output's shape (the entry sums them down to each input's)."""
    rules.setdefault("inplace", ((0, 0), (1, 0)))
    rules.setdefault("arity", 2)
    register(Elementwise(op, ufunc(fn) if isinstance(fn, str) else fn, grad, **rules))


def _chain(name, scale=None):
    """The `fn` of a variadic op: a binary ufunc folded over the inputs into the output (which may be
    input 0 itself), then divided by the count for Mean."""
    def fn(xp, first, *rest, out=None):
        ufunc = getattr(xp, name)
        if not rest:
            out = xp.array(first, copy=True) if out is None else out
            if out is not first:
                xp.copyto(out, first)
        else:
            out = ufunc(first, rest[0], out=out)
            for x in rest[1:]:
                ufunc(out, x, out=out)
        if scale:
            xp.divide(out, 1 + len(rest), out=out, casting="unsafe")
        return out
    return fn


def _variadic_torch(name, mean=False):
    def fn(torch, first, *rest):
        out = first
        for x in rest:
            out = getattr(torch, name)(out, x)
        return out / (1 + len(rest)) if mean else out
    return fn


def _extreme_grad(b, node, *args):
    """Min and Max: dY to the input(s) holding the extreme, split evenly among ties (as PyTorch's
    maximum and minimum do)."""
    *xs, y, dy = args
    if len(xs) == 1:
        return [dy]
    masks = [b.op("Cast", b.op("Equal", x, y), to=to_onnx(b.dtype(y))) for x in xs]
    count = b.op("Sum", *masks)
    share = b.op("Div", dy, count)
    return [b.op("Mul", share, m) for m in masks]


def variadic(op, fn_name, grad, torch, mean=False, **rules):
    """Register a variadic op (Sum, Mean, Min, Max): one or more inputs broadcast together; the output
    may overwrite input 0 only, which the fold reads before any other input is written."""
    register(Elementwise(op, _chain(fn_name, mean), grad, torch=_variadic_torch(torch, mean), inplace=((0, 0),),
                         **rules))


def _sum_grad(b, node, *args):
    *xs, y, dy = args
    return [dy] * len(xs)


def _mean_grad(b, node, *args):
    *xs, y, dy = args
    return [b.op("Div", dy, b.const(len(xs), y))] * len(xs)


variadic("Sum", "add", _sum_grad, "add")
variadic("Mean", "add", _mean_grad, "add", mean=True)
variadic("Max", "maximum", _extreme_grad, "maximum", numbers=True)
variadic("Min", "minimum", _extreme_grad, "minimum", numbers=True)


def _where(xp, c, x, y, out=None):
    """y everywhere, then x where c holds: no temporary, and right when the output is y itself."""
    if out is None:
        return xp.where(c, x, y)
    xp.copyto(out, y)
    xp.copyto(out, x, where=xp.broadcast_to(c, out.shape))
    return out


class Where(Elementwise):
    """Where: the output may overwrite `y`; the condition is bool, x and y share a dtype."""

    same_dtype = False

    def infer(self, node, ins):
        if ins[0].dtype != np.bool_:
            raise ShapeError(f"condition must be bool, not {ins[0].dtype}")
        same_dtype(ins[1:])
        return [(broadcast(*(i.shape for i in ins)), ins[1].dtype)]

    def gradient(self, b, node, dys):
        """dY where the condition picks each side, zeros elsewhere; no gradient for the condition."""
        c, x, y = node.inputs
        zero, out = b.const(0, x), b.shape(node.outputs[0])
        return [None, b.unbroadcast(b.op("Where", c, dys[0], zero), out, b.shape(x)),
                b.unbroadcast(b.op("Where", c, zero, dys[0]), out, b.shape(y))]


register(Where("Where", _where, torch="where", inplace=((2, 0),), numbers=True))
