"""Relative-position terms of attention scores as DeBERTa exports them, for the attention fusion: a bias made
of GatherElements over the last axis of a (.., lines, R) table by a constant index that depends only on the
distance between query and key (scaled by constants, the second one transposed), which the fused op gathers
tile by tile instead of holding the (S, T) terms (planner/ops/fused_attention.py: rows and cols)."""
from dataclasses import dataclass

import numpy as np

from .attention_form import scaled
from .pattern import constant


@dataclass(frozen=True)
class Gather:
    """table[.., x, index[x - y + Y - 1]] of an (X, Y) gather, times `scale`; `crossed`: the scores take it
    transposed (x the key, y the query)."""

    table: str
    index: np.ndarray
    scale: float
    crossed: bool


def gathers(graph, name, value=constant, scale=1.0, crossed=False):
    """The Gathers whose sum is tensor `name` (Adds of them, or of one and zeros, each perhaps scaled by one-value
    constants and transposed in its last two dims), or None where it is anything else; `value(graph, name)` gives a constant
    index's values (None where it has none)."""
    node = graph.producers.get(name)
    if node is None or node.domain:
        return None
    if node.op == "Add":
        zero = [i for i in node.inputs if (lambda c: c is not None and not c.any())(constant(graph, i))]
        if len(zero) == 1:  # TorchScript's score = 0 before the terms are added
            other = node.inputs[1 - node.inputs.index(zero[0])]
            if graph.tensors[other].shape == graph.tensors[name].shape:
                return gathers(graph, other, value, scale, crossed)
        parts = [gathers(graph, i, value, scale, crossed) for i in node.inputs]
        return None if None in parts or graph.tensors[node.inputs[0]].shape != graph.tensors[node.inputs[1]].shape \
            else parts[0] + parts[1]
    factor = scaled(graph, node)
    if factor is not None:
        return gathers(graph, factor[0], value, scale * factor[1], crossed)
    rank = len(graph.tensors[name].shape)
    if node.op == "Transpose" and list(node.attrs.get("perm") or []) == [*range(rank - 2), rank - 1, rank - 2]:
        return gathers(graph, node.inputs[0], value, scale, not crossed)
    if node.op != "GatherElements" or node.attrs.get("axis", 0) not in (-1, rank - 1):
        return None
    index = value(graph, _unexpanded(graph, node.inputs[1]))
    table = graph.tensors[node.inputs[0]].shape
    distance = None if index is None or len(table) != rank else toeplitz(index, table[-1])
    return None if distance is None else [Gather(node.inputs[0], distance, scale, crossed)]


def _unexpanded(graph, name):
    """The tensor an index is Expanded from over its leading dims (its (X, Y) slices, copied), or itself."""
    node = graph.producers.get(name)
    while node is not None and node.op == "Expand" and not node.domain and \
            graph.tensors[node.inputs[0]].shape[-2:] == graph.tensors[name].shape[-2:]:
        name = node.inputs[0]
        node = graph.producers.get(name)
    return name


def toeplitz(index, width):
    """f, of X + Y - 1 values in [0, width), where every (X, Y) slice of `index` is f[x - y + Y - 1] (negative
    indices counting from the end, as GatherElements reads them); else None."""
    if index.ndim < 2 or not index.size:
        return None
    x, y = index.shape[-2:]
    slices = index.reshape(-1, x, y)
    first = slices[0]
    if not (slices == first).all():
        return None
    f = np.concatenate([first[0, ::-1], first[1:, 0]]).astype(np.int64)
    f = np.where(f < 0, f + width, f)
    if f.min() < 0 or f.max() >= width:
        return None
    read = np.where(first < 0, first + width, first)
    return f if (read == f[np.arange(x)[:, None] - np.arange(y)[None, :] + y - 1]).all() else None
