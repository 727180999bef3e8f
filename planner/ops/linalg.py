"""Matrix products: Gemm, MatMul (NumPy matmul semantics) and Einsum."""
import math
import re

from .registry import schema
from .base import Schema, broadcast, no_gradient, same_dtype
from ..errors import ShapeError


@schema("Gemm")
class Gemm(Schema):
    """Gemm: alpha * A' B' + beta * C, with A' = A or its transpose (transA), likewise B';
    C is optional and broadcasts one way to the (M, N) result."""

    split = "gemm"
    autocast = "low"
    mirror = False
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
        return [((m, n), same_dtype(ins))]

    def flops(self, node, ins, outs):
        """2 M N K, and M N more to add C."""
        (m, n), k = outs[0][0], ins[0].shape[0 if self.attr(node, "transA") else 1]
        return 2 * m * n * k + (m * n if len(ins) > 2 and ins[2] is not None else 0)

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

    def torch(self, torch, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
        """alpha A' B' + beta C."""
        a, b = a.T if transA else a, b.T if transB else b
        return alpha * (a @ b) if c is None else torch.addmm(c, a, b, beta=beta, alpha=alpha)


@schema("MatMul")
class MatMul(Schema):
    """MatMul as numpy.matmul: a 1-D operand is a row (A) or column (B) vector, batch dims broadcast."""

    split = "matmul"
    autocast = "low"
    mirror = False
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
        return [((*broadcast(a2[:-2], b2[:-2]), *rows, *cols), same_dtype(ins))]

    def flops(self, node, ins, outs):
        """2 K per output element, K the inner dim."""
        return 2 * math.prod(outs[0][0]) * ins[0].shape[-1]

    def gradient(self, b, node, dys):
        """dA = dY B^T and dB = A^T dY over the last two dims, summed over broadcast batch dims; a 1-D
        operand is taken as the one-row (A) or one-column (B) matrix it stands for. A matrix B (a Linear
        layer's weight) takes Gemms over A's rows: no per-batch dB to sum, no transposed copy of B."""
        dy, (x, w) = dys[0], node.inputs
        sx, sw = b.shape(x), b.shape(w)
        mx, mw = ((1, *sx) if len(sx) == 1 else sx), ((*sw, 1) if len(sw) == 1 else sw)
        out = (*broadcast(mx[:-2], mw[:-2]), mx[-2], mw[-1])
        if mx != sx or mw != sw:
            dy, x, w = (b.op("Reshape", t, shape=list(s)) for t, s in ((dy, out), (x, mx), (w, mw)))
        if len(mw) == 2:  # a weight shared by every row (a Linear layer): one Gemm each, no transposed copy
            rows = (math.prod(mx[:-1]), mx[-1]), (math.prod(out[:-1]), mw[-1])
            flat_x, flat_dy = (t if len(mx) == 2 else b.op("Reshape", t, shape=list(r)) for t, r in zip((x, dy), rows))
            dx, dw = b.op("Gemm", flat_dy, w, transB=1), b.op("Gemm", flat_x, flat_dy, transA=1)
            dx = dx if len(mx) == 2 else b.op("Reshape", dx, shape=list(mx))
        else:
            dx = b.op("MatMul", dy, b.op("Transpose", w, perm=_swap_last(len(mw))))
            dw = b.op("MatMul", b.op("Transpose", x, perm=_swap_last(len(mx))), dy)
            dx, dw = b.unbroadcast(dx, out[:-1] + mx[-1:], mx), b.unbroadcast(dw, out[:-2] + mw[-2:], mw)
        return [t if m == s else b.op("Reshape", t, shape=list(s)) for t, m, s in ((dx, mx, sx), (dw, mw, sw))]

    def torch(self, torch, a, b):
        return torch.matmul(a, b)


def _swap_last(rank):
    return [*range(rank - 2), rank - 1, rank - 2]


def _parse(equation, shapes):
    """An einsum equation read against its inputs' shapes: (input terms, output term, {index: size},
    each input's '...' dims, their broadcast). An implicit output is made explicit: '...' (when an
    input has it), then the indices appearing once, sorted."""
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
    if not arrow:
        rhs = "..." * ("..." in lhs) + "".join(sorted(c for c in sizes if lhs.count(c) == 1))
    letters = rhs.replace("...", "", 1)
    if len(set(letters)) != len(letters) or not set(letters) <= set(sizes) or "." in letters:
        raise ShapeError(f"output {rhs!r} of {equation!r} repeats an index, or names one no input has")
    return terms, rhs, sizes, ellipses, broadcast(*ellipses)


def _einsum_shape(equation, shapes):
    """Output shape of an einsum equation (explicit or implicit output, '...' broadcast dims)."""
    _, rhs, sizes, _, batch = _parse(equation, shapes)
    head, dots, tail = rhs.partition("...")
    return (*(sizes[c] for c in head), *(batch if dots else ()), *(sizes[c] for c in tail))


@schema("Einsum")
class Einsum(Schema):
    autocast = "low"
    mirror = False
    split = "einsum"

    def infer(self, node, ins):
        return [(_einsum_shape(self.attr(node, "equation"), [i.shape for i in ins]), same_dtype(ins))]

    def subscripts(self, node, shapes):
        """(the input terms, the output term) of the node's equation read against its inputs' `shapes`, an
        implicit output made explicit."""
        terms, out, *_ = _parse(self.attr(node, "equation"), shapes)
        return terms, out

    def flops(self, node, ins, outs):
        """Evaluated naively: over every combination of the indices (and broadcast dims), one multiply
        per operand after the first and one add, so 2 (operands - 1) each (1 for a single operand)."""
        _, _, sizes, _, batch = _parse(self.attr(node, "equation"), [i.shape for i in ins])
        return math.prod(sizes.values()) * math.prod(batch) * max(2 * (len(ins) - 1), 1)

    def gradient(self, b, node, dys):
        """Each operand's gradient is an Einsum of dY with the other operands onto the operand's term.
        Indices only that operand has (summed away) come back by Expand; its '...' dims are summed down
        where they were broadcast. Not for a term repeating an index (a diagonal)."""
        shapes = [b.shape(i) for i in node.inputs]
        terms, out, sizes, ellipses, batch = _parse(self.attr(node, "equation"), shapes)
        ell, grads = "..." * ("..." in out), []
        for k, (term, shape, dims) in enumerate(zip(terms, shapes, ellipses)):
            head, _, tail = term.partition("...")
            if len(set(head + tail)) < len(head + tail):
                return [no_gradient(node)] * len(terms)
            others = terms[:k] + terms[k + 1:]
            only = set(head + tail) - set(out + "".join(others))
            head2, tail2 = ("".join(c for c in t if c not in only) for t in (head, tail))
            g = b.op("Einsum", dys[0], *node.inputs[:k], *node.inputs[k + 1:],
                     equation=f"{','.join([out, *others])}->{head2}{ell}{tail2}")
            lead = len(batch) - len(dims)
            axes = [len(head2) + j for j, n in enumerate(batch) if j < lead or dims[j - lead] == 1 and n != 1]
            if ell and axes:
                g = b.op("ReduceSum", g, axes=axes, keepdims=1)
            if only or lead:
                g = b.op("Reshape", g, shape=[*(1 if c in only else sizes[c] for c in head), *dims,
                                               *(1 if c in only else sizes[c] for c in tail)])
            grads.append(b.op("Expand", g, shape=list(shape)) if only else g)
        return grads

    def torch_node(self, torch, run, node, ins):
        return torch.einsum(self.attr(node, "equation"), *ins)
