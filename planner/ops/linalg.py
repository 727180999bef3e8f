"""Matrix products: Gemm, MatMul (NumPy matmul semantics) and Einsum."""
import re

from . import schema
from .base import Schema, broadcast, no_gradient
from ..errors import ShapeError


def _same_dtype(ins):
    dtypes = {i.dtype for i in ins if i is not None}
    if len(dtypes) > 1:
        raise ShapeError(f"inputs have different dtypes {sorted(map(str, dtypes))}")
    return ins[0].dtype


@schema("Gemm")
class Gemm(Schema):
    """Gemm: alpha * A' B' + beta * C, with A' = A or its transpose (transA), likewise B';
    C is optional and broadcasts one way to the (M, N) result."""

    defaults = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}

    def infer(self, node, ins):
        a, b, c = [*ins, None][:3]
        if a.rank != 2 or b.rank != 2:
            raise ShapeError(f"A {a.shape} and B {b.shape} must be matrices")
        m, k = a.shape[::-1] if self.attr(node, "transA") else a.shape
        k2, n = b.shape[::-1] if self.attr(node, "transB") else b.shape
        if k != k2:
            raise ShapeError(f"A {a.shape} and B {b.shape} do not agree on the inner dim (transA, transB)")
        if c is not None and broadcast((m, n), c.shape) != (m, n):
            raise ShapeError(f"C {c.shape} does not broadcast to the result ({m}, {n})")
        return [((m, n), _same_dtype(ins))]

    def gradient(self, b, node, dys):
        """Y = alpha A'B' + beta C: A'-bar = alpha dY B'^T, B'-bar = alpha A'^T dY, each transposed back
        when the input was; C-bar is beta dY summed to C's shape. All as Gemms."""
        dy, (a, w, *c) = dys[0], node.inputs
        ta, tb, alpha = self.attr(node, "transA"), self.attr(node, "transB"), self.attr(node, "alpha")
        da = b.op("Gemm", w, dy, transA=tb, transB=1, alpha=alpha) if ta else \
            b.op("Gemm", dy, w, transB=1 - tb, alpha=alpha)
        dw = b.op("Gemm", dy, a, transA=1, transB=ta, alpha=alpha) if tb else \
            b.op("Gemm", a, dy, transA=1 - ta, alpha=alpha)
        grads = [da, dw]
        if c and c[0]:
            beta = self.attr(node, "beta")
            scaled = dy if beta == 1 else b.op("Mul", dy, b.const(beta, a))
            grads.append(b.unbroadcast(scaled, b.shape(node.outputs[0]), b.shape(c[0])))
        return grads


@schema("MatMul")
class MatMul(Schema):
    """MatMul as numpy.matmul: a 1-D operand is a row (A) or column (B) vector, batch dims broadcast."""

    def infer(self, node, ins):
        a, b = ins[0].shape, ins[1].shape
        if not a or not b:
            raise ShapeError(f"MatMul of {a} and {b}: scalars are not allowed")
        a2 = (1, *a) if len(a) == 1 else a
        b2 = (*b, 1) if len(b) == 1 else b
        if a2[-1] != b2[-2]:
            raise ShapeError(f"shapes {a} and {b} do not agree on the inner dim")
        rows = a2[-2:-1] if len(a) > 1 else ()
        cols = b2[-1:] if len(b) > 1 else ()
        return [((*broadcast(a2[:-2], b2[:-2]), *rows, *cols), _same_dtype(ins))]

    def gradient(self, b, node, dys):
        """dA = dY B^T and dB = A^T dY over the last two dims, summed over broadcast batch dims."""
        dy, (x, w), y = dys[0], node.inputs, node.outputs[0]
        sx, sw = b.shape(x), b.shape(w)
        if len(sx) < 2 or len(sw) < 2:
            return [no_gradient(node)] * 2
        dx = b.op("MatMul", dy, b.op("Transpose", w, perm=_swap_last(len(sw))))
        dw = b.op("MatMul", b.op("Transpose", x, perm=_swap_last(len(sx))), dy)
        out = b.shape(y)
        return [b.unbroadcast(dx, out[:-1] + sx[-1:], sx), b.unbroadcast(dw, out[:-2] + sw[-2:], sw)]


def _swap_last(rank):
    return [*range(rank - 2), rank - 1, rank - 2]


def _einsum_shape(equation, shapes):
    """Output shape of an einsum equation (explicit or implicit output, '...' broadcast dims)."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes) or not all(re.fullmatch(r"[a-zA-Z]*(\.\.\.)?[a-zA-Z]*", t) for t in terms):
        raise ShapeError(f"equation {equation!r} does not describe {len(shapes)} inputs")
    sizes, ellipses = {}, []
    for term, shape in zip(terms, shapes):
        head, dots, tail = term.partition("...")
        n = len(shape) - len(head) - len(tail)
        if n < 0 or (n and not dots):
            raise ShapeError(f"term {term!r} of {equation!r} does not match an input of shape {shape}")
        ellipses.append(shape[len(head):len(head) + n])
        for letter, size in zip(head + tail, shape[:len(head)] + shape[len(head) + n:]):
            if sizes.setdefault(letter, size) != size:
                raise ShapeError(f"index {letter!r} of {equation!r} is both {sizes[letter]} and {size}")
    batch = broadcast(*ellipses)
    if not arrow:
        letters = "".join(sorted(c for c in sizes if lhs.count(c) == 1))
        return (*batch, *(sizes[c] for c in letters))
    head, dots, tail = rhs.partition("...")
    letters = head + tail
    if len(set(letters)) != len(letters) or not set(letters) <= set(sizes) or "." in letters:
        raise ShapeError(f"output {rhs!r} of {equation!r} repeats an index, or names one no input has")
    return (*(sizes[c] for c in head), *(batch if dots else ()), *(sizes[c] for c in tail))


@schema("Einsum")
class Einsum(Schema):
    def infer(self, node, ins):
        return [(_einsum_shape(self.attr(node, "equation"), [i.shape for i in ins]), _same_dtype(ins))]
