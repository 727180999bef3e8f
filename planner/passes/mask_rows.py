"""Masks too large to fold, read a block of rows at a time: transformers' causal masks are built from index
comparisons of 1-D ranges, an (S, T) bool or float table at run time that planning cannot hold whole at long
sequences (8,192 tokens: 67 M elements). Where every op on the way from the constants is elementwise, the rows
[r0, r1) of the mask are those ops applied to the rows [r0, r1) of their inputs, so the causal band can be
checked in blocks of ROWS elements without ever making the whole table (fuse_attention reads it)."""
import math

import numpy as np

from .. import ops
from ..ops import Info
from .pattern import constant

ROWS = 1 << 23
"""Most elements of one block of rows evaluated at a time."""


def band_by_rows(graph, name, s, t, added, attends=True):
    """(window, fill) where mask `name` keeps in every (S, T) slice exactly the causal band of S queries over T
    keys (window 0), or that band cut to a sliding window: for an `added` float mask the kept keys are its zeros
    and every hidden one holds the same `fill`; for a bool mask the kept keys are its True ones (its False ones
    where not `attends`) and fill is None. None for any other mask, or one not built elementwise from constants."""
    shape = tuple(graph.tensors[name].shape)
    if len(shape) < 2 or shape[-2:] != (s, t):
        return None
    step = max(1, ROWS // max(1, math.prod(shape[:-2]) * t))
    spans = [(r0, min(s, r0 + step)) for r0 in range(0, s, step)]
    widest, fills, causal = 0, set(), True
    for r0, r1 in spans:
        attend, hidden = _attend(graph, name, shape, r0, r1, added, attends)
        if attend is None or not (attend == attend[0]).all():
            return None
        if hidden.size:
            if not hidden.min() == hidden.max():  # one fill (not NaN) for every hidden key
                return None
            fills.add(float(hidden.min()))
        widest = max(widest, int(attend[0].sum(1).max()))
        causal = causal and bool((attend[0] == _band(r0, r1, s, t, 0)).all())
    if len(fills) > 1 or (added and not fills):
        return None
    fill = fills.pop() if fills else None
    if causal:
        return 0, fill
    if widest and all((_attend(graph, name, shape, r0, r1, added, attends)[0][0] == _band(r0, r1, s, t, widest)).all()
                      for r0, r1 in spans):
        return widest, fill
    return None


def _attend(graph, name, shape, r0, r1, added, attends):
    """(the keys rows r0..r1 of each slice keep, (n, r1 - r0, T) bools; the values hidden ones hold), or (None,
    None) where the rows cannot be computed elementwise."""
    value = _rows(graph, name, len(shape), shape[-2], r0, r1)
    if value is None:
        return None, None
    value = np.broadcast_to(value, (*shape[:-2], r1 - r0, shape[-1])).reshape(-1, r1 - r0, shape[-1])
    if added:
        attend = value == 0
        return attend, value[~attend]
    attend = value.astype(bool) if attends else ~value.astype(bool)
    return attend, np.empty(0)


def _band(r0, r1, s, t, window):
    """The causal band's rows r0..r1 (the last query sees the last key), cut to `window` keys where it is not 0."""
    i, j = np.arange(r0, r1)[:, None], np.arange(t)[None, :]
    band = j <= i + t - s
    return band & (j > i + t - s - window) if window else band


def _rows(graph, name, rank, s, r0, r1):
    """Rows r0..r1 of `s` (dim -2, at `rank` dims) of tensor `name`: a constant's sliced (kept whole where the dim
    is 1), an elementwise op's (or a Cast's) computed from its inputs' rows; None for anything else."""
    value = constant(graph, name)
    if value is not None:
        value = np.asarray(value)
        if value.ndim > rank:
            return None
        value = value.reshape((1,) * (rank - value.ndim) + value.shape)
        return value if value.shape[-2] == 1 else value[..., r0:r1, :] if value.shape[-2] == s else None
    node = graph.producers.get(name)
    schema = ops.of(node, graph.opsets) if node is not None else None
    if schema is None or schema.random or not (schema.split == "elementwise" or (node.op, node.domain) == ("Cast", "")):
        return None
    ins = []
    for i in node.inputs:
        v = _rows(graph, i, rank, s, r0, r1) if i else None
        if i and v is None:
            return None
        ins.append(Info(v.shape, graph.tensors[i].dtype, v) if i else None)
    with np.errstate(all="ignore"):
        values = schema.fold(node, ins)
    return None if values is None else np.asarray(values[node.outputs.index(name)])
