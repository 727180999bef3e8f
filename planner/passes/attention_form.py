"""How an exported attention reads, for the attention fusion: from a Softmax over the last axis up through
its scores to MatMul(Q, K^T) and down through its probabilities to MatMul(P, V). The scores may be scaled
(Mul or Div by one-value constants, on them or on Q and K^T), soft-capped (Mul(Tanh(Div(x, c)), c), Gemma 2),
then biased and masked by Adds and Wheres in any order (`Term`s); the probabilities may be guarded
(Where(IsNaN(p), 0, p), SDPA's dynamo export) and dropped (Dropout); either side may be 3-D batched
products, (B H, S, T), reshaped to 4-D (B, H, S, T) and back around the masks (BLOOM, DeBERTa). What it
reads is structure only; `fuse_attention` judges the values."""
import math
from dataclasses import dataclass, field

import numpy as np

from .pattern import constant

SCALES = ("Mul", "Div")


@dataclass(frozen=True)
class Term:
    """One Add or Where on the scores, in the order they apply: `kind` "add" (the tensor `value` added) or
    "set" (where `cond` is `attends`, the scores stay; elsewhere they become the tensor `value`); `shape` the
    scores' at that point."""

    kind: str
    value: str
    cond: str | None
    attends: bool
    shape: tuple
    node: object


@dataclass
class Attention:
    """One attention as exported: Q, K^T and V (as the products read them), the scores' scale and softcap,
    the terms, (B, H) where a 4-D form shows them, the Dropout on the probabilities, whether they are guarded,
    the nodes read ({name: Node}) and the root (MatMul(P, V)), whose output is `out_shape`."""

    q: str = ""
    kt: str = ""
    v: str = ""
    scale: float = 1.0
    softcap: float = 0.0
    terms: list = field(default_factory=list)
    heads: tuple | None = None
    dropout: object = None
    guarded: bool = False
    nodes: dict = field(default_factory=dict)
    root: object = None

    def take(self, node):
        self.nodes[node.name] = node
        return node


def read(graph, softmax):
    """The Attention whose probabilities `softmax` makes, or None where its scores or probabilities are not
    read as attention (see the module's docstring)."""
    shape = graph.tensors[softmax.outputs[0]].shape
    axis = softmax.attrs.get("axis", -1)
    if softmax.domain or len(shape) not in (3, 4) or axis not in (-1, len(shape) - 1):
        return None
    found = Attention()
    found.take(softmax)
    if not _probabilities(graph, softmax.outputs[0], found) or not _scores(graph, softmax.inputs[0], found, 0):
        return None
    found.terms.reverse()
    return found


def _sole(graph, name):
    readers = graph.consumers.get(name, ())
    return readers[0] if len(readers) == 1 else None


def _scalar(graph, name):
    value = constant(graph, name)
    return None if value is None or value.size != 1 else float(value.ravel()[0])


def _probabilities(graph, p, found):
    """Follows the probabilities `p` down to MatMul(P, V), noting the guard, the Dropout and the reshapes."""
    while True:
        readers = graph.consumers.get(p, ())
        if len(readers) == 2 and not found.guarded:
            guard = _guard(graph, p, readers)
            if guard is None:
                return False
            found.guarded = True
            for node in readers:
                found.take(node)
            p = guard.outputs[0]
            continue
        node = _sole(graph, p)
        if node is None or node.domain:
            return False
        found.take(node)
        if node.op == "MatMul" and node.inputs[0] == p:
            found.v, found.root = node.inputs[1], node
            return _heads(found, graph.tensors[p].shape, graph.tensors[node.inputs[1]].shape)
        if node.op == "Dropout" and found.dropout is None:
            found.dropout = node
        elif node.op != "Reshape" or not _layout(found, graph.tensors[p].shape, graph.tensors[node.outputs[0]].shape):
            return False
        p = node.outputs[0]


def _guard(graph, p, readers):
    """The Where of Where(IsNaN(p), 0, p) among the two readers of `p`, or None."""
    isnan = next((r for r in readers if r.op == "IsNaN" and not r.domain), None)
    where = next((r for r in readers if r.op == "Where" and not r.domain), None)
    if isnan is None or where is None or where.inputs[0] != isnan.outputs[0] or where.inputs[2] != p \
            or _sole(graph, isnan.outputs[0]) is not where or _scalar(graph, where.inputs[1]) != 0.0:
        return None
    return where


def _heads(found, p, v):
    """Whether V suits probabilities of shape `p`: of p's rank, its leading dims those of p or, for heads, 1."""
    return len(v) == len(p) and v[-2] == p[-1] and (v[:-2] == p[:-2] or len(p) == 4 and v[0] == p[0] and v[1] == 1)


def _layout(found, before, after):
    """Whether a Reshape from `before` to `after` only splits (B H) into (B, H) or merges them, (B, H) agreeing
    with any seen before; notes (B, H)."""
    if before[-2:] != after[-2:] or sorted((len(before), len(after))) != [3, 4]:
        return False
    four, three = (after, before) if len(after) == 4 else (before, after)
    if four[0] * four[1] != three[0] or found.heads not in (None, four[:2]):
        return False
    found.heads = four[:2]
    return True


def _scores(graph, name, found, phase):
    """Follows the scores `name` up to MatMul(Q, K^T): terms in phase 0, the softcap ends it (phase 1), the
    scale (phase 2) comes last; reshapes anywhere."""
    node = graph.producers.get(name)
    if node is None or node.domain or _sole(graph, name) is None:
        return False
    shape = graph.tensors[name].shape
    if node.op == "MatMul":
        found.take(node)
        return _products(graph, node, found)
    if node.op == "Reshape":
        found.take(node)
        return _layout(found, graph.tensors[node.inputs[0]].shape, shape) and \
            _scores(graph, node.inputs[0], found, phase)
    if node.op in SCALES:
        factor = scaled(graph, node)
        if factor is None:
            return False
        cap = _softcap(graph, node, found) if phase == 0 else None
        if cap is not None:
            return _scores(graph, cap, found, 1)
        found.take(node)
        found.scale *= factor[1]
        return _scores(graph, factor[0], found, 2)
    if phase or node.op not in ("Add", "Where"):
        return False
    found.take(node)
    sides = ((0, 1), (1, 0)) if node.op == "Add" else ((1, 2), (2, 1))
    for chain, other in sides:
        if graph.tensors[node.inputs[chain]].shape != shape:
            continue
        if node.op == "Add":
            term = Term("add", node.inputs[other], None, True, shape, node)
        else:
            term = Term("set", node.inputs[other], node.inputs[0], chain == 1, shape, node)
        mark = (len(found.terms), dict(found.nodes), found.heads, found.scale, found.softcap)
        found.terms.append(term)
        if _scores(graph, node.inputs[chain], found, 0):
            return True
        del found.terms[mark[0]:]
        found.nodes, found.heads, found.scale, found.softcap = mark[1], mark[2], mark[3], mark[4]
        found.take(node)
    return False


def scaled(graph, node):
    """(x, factor) where `node` is x times or over a one-value constant (factor: what x is multiplied by) and
    x has the output's shape; else None."""
    if node.op not in SCALES or node.domain:
        return None
    for x, c in ((0, 1), (1, 0)) if node.op == "Mul" else ((0, 1),):
        factor = _scalar(graph, node.inputs[c])
        if factor and math.isfinite(factor) and graph.tensors[node.inputs[x]].shape == graph.tensors[node.outputs[0]].shape:
            return node.inputs[x], factor if node.op == "Mul" else 1 / factor
    return None


def _softcap(graph, mul, found):
    """Where `mul` is c * Tanh(x / c) (or Tanh(x * (1/c))), notes softcap c and returns x; else None."""
    outer = scaled(graph, mul)
    tanh = None if outer is None else graph.producers.get(outer[0])
    if tanh is None or tanh.op != "Tanh" or tanh.domain or outer[1] <= 0 or _sole(graph, outer[0]) is None:
        return None
    inner = graph.producers.get(tanh.inputs[0])
    factor = None if inner is None or _sole(graph, tanh.inputs[0]) is None else scaled(graph, inner)
    if factor is None or not math.isclose(factor[1], 1 / outer[1], rel_tol=1e-6):
        return None
    for n in (mul, tanh, inner):
        found.take(n)
    found.softcap = outer[1]
    return factor[0]


def _products(graph, matmul, found):
    """Notes Q and K^T of the scores' MatMul, each without a one-value scale it alone reads (which joins the
    scale): Q (.., S, D) and K^T (.., D, T) of the scores' rank, K^T's leading dims Q's or, for heads, 1."""
    sides = []
    for name in matmul.inputs:
        node = graph.producers.get(name)
        factor = None if node is None or _sole(graph, name) is not matmul else scaled(graph, node)
        if factor is not None:
            found.take(node)
            found.scale *= factor[1]
            name = factor[0]
        sides.append(name)
    found.q, found.kt = sides
    q, kt = (graph.tensors[n].shape for n in sides)
    return len(q) == len(kt) and q[-1] == kt[-2] and \
        (q[:-2] == kt[:-2] or len(q) == 4 and q[0] == kt[0] and kt[1] == 1) and bool(np.prod(q))
