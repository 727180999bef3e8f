"""Fuse attention: scaled dot-product attention as exporters write it (planner/passes/attention_form.py reads
its forms) replaced by one memplan.ScaledDotProductAttention, whose kernel works tile by tile and never holds
the (S, T) scores (planner/ops/fused_attention.py). A fusion changes no result: a constant mask whose kept
keys are the causal band (with or without a sliding window) becomes the op's `causal` and `window`, its
hidden scores taking the export's own fill, set or added as the export does; other Where masks become the
op's mask input (their hidden scores set to the same fill), other additive terms its bias, DeBERTa's
relative-position terms its rows and cols; a row whose softmax is NaN gives NaN unless the export guards it. Attention of a 16-bit
export stays as it is, since the fused op accumulates in float32 where the export rounds each step in
16 bits (so results would change); fp16 and bf16 plans of float32 models fuse first and lower after.
planner.compile counts the fused ops in plan.stats["fused_attention"]; CompileOptions(fuse_attention=False)
keeps the exported form."""
import math
from dataclasses import replace
from functools import partial

import numpy as np

from .. import ops
from ..ir import Node, Tensor
from ..ops import Info
from ..ops.base import broadcast
from ..training import STEP
from .attention_form import read
from .attention_relative import gathers
from .base import rewrite_pass
from .mask_rows import band_by_rows
from .pattern import Match, constant, exclusive, replace_matches

FUSED = "ScaledDotProductAttention"
PROBE_LIMIT = 1 << 25
"""Most elements of a mask built from constants alone (transformers' causal masks from index comparisons)
that planning evaluates whole, to learn whether it is the causal one; larger ones are read a block of rows at a
time where they are built elementwise (mask_rows), else stay an input of the op."""


def band(attend, s, t):
    """The window (0: none) of a constant mask (True: attend) whose every (S, T) slice keeps exactly the causal
    band of S queries over T keys, the last query seeing the last key; None for any other mask."""
    if attend.dtype != bool or attend.ndim < 2 or attend.shape[-2:] != (s, t):
        return None
    slices = attend.reshape(-1, s, t)
    first = slices[0]
    if not (slices == first).all():
        return None
    i, j = np.arange(s)[:, None], np.arange(t)[None, :]
    causal = j <= i + t - s
    if (first == causal).all():
        return 0
    window = int(first.sum(1).max())
    return window if window and (first == (causal & (j > i + t - s - window))).all() else None


def _built_causal(graph, cond, s, t):
    """Whether `cond` is a causal mask built when running, too large to fold: the lower triangle
    (Trilu, upper=0, diagonal T - S) of ones (ConstantOfShape), as bools (or cast to them)."""
    node = graph.producers.get(cond)
    if node is not None and node.op == "Cast" and graph.tensors[cond].dtype == bool:
        node = graph.producers.get(node.inputs[0])
    if node is None or node.op != "Trilu" or node.attrs.get("upper", 1) or _k(node) != t - s:
        return False
    ones = graph.producers.get(node.inputs[0])
    shape = graph.tensors[node.inputs[0]].shape
    filled = ones is not None and ones.op == "ConstantOfShape" and bool(np.all(ones.attrs.get("value", 0)))
    return filled and shape[-2:] == (s, t)


def _k(trilu):
    k = trilu.attrs.get("k", 0)
    return int(np.ravel(k)[0]) if k is not None else 0


def _computed(graph, name, limit=None):
    """The value of tensor `name` where it depends on constants alone, each value on the way at most
    `limit` elements (PROBE_LIMIT), computed by the ops' NumPy forms (planning folds only small constants);
    else None."""
    limit = PROBE_LIMIT if limit is None else limit
    value = constant(graph, name)
    node = graph.producers.get(name)
    if value is not None or node is None or math.prod(graph.tensors[name].shape) > limit or ops.of(node, graph.opsets).random:
        return value
    ins = []
    for i in node.inputs:
        v = _computed(graph, i, limit) if i else None
        if i and v is None:
            return None
        ins.append(Info(graph.tensors[i].shape, graph.tensors[i].dtype, v) if i else None)
    with np.errstate(all="ignore"):
        values = ops.of(node, graph.opsets).fold(node, ins)
    return None if values is None else np.asarray(values[node.outputs.index(name)])


class _Fuser:
    """Builds the replacement of one Attention read from the graph, or None where it is not attention the
    fused op computes alike."""

    def __init__(self, graph, training):
        self.graph, self.training, self.fresh, self.masks, self.made, self.nodes = graph, training, {}, {}, {}, []
        self.bands = {}

    def mask(self, name):
        """`_computed` of a mask, once per mask (every layer reads the same one)."""
        if name not in self.masks:
            self.masks[name] = _computed(self.graph, name)
        return self.masks[name]

    def band(self, name, s, t, added, attends=True):
        """mask_rows.band_by_rows of a mask too large to fold, once per mask and form."""
        key = (name, s, t, added, attends)
        if key not in self.bands:
            self.bands[key] = band_by_rows(self.graph, name, s, t, added, attends)
        return self.bands[key]

    def build(self, a):
        """The nodes that replace Attention `a`, or None (and nothing made for it kept)."""
        made, fresh, self.nodes = dict(self.made), dict(self.fresh), []
        nodes = self.nodes if self.replacement(a) else None
        if nodes is None:
            self.made, self.fresh = made, fresh
        return nodes

    def replacement(self, a):
        """Whether `a` fuses, its fused node and the nodes it reads made in self.nodes."""
        g = self.graph
        q, kt, v, y = (g.tensors[n] for n in (a.q, a.kt, a.v, a.root.outputs[0]))
        if not q.dtype.kind == "f" or q.dtype.itemsize < 4:  # a 16-bit export rounds its softmax in 16 bits
            return False
        s, d, t = q.shape[-2], q.shape[-1], kt.shape[-1]
        batch, heads = q.shape[:2] if len(q.shape) == 4 else a.heads or (q.shape[0], 1)
        if a.heads not in (None, (batch, heads)):
            return False
        attrs = {"scale": a.scale, "empty_rows": "zero" if a.guarded else "nan"}
        dropout = self.dropout(a.dropout)
        form = self.terms(a.terms, s, t, (batch, heads), q.dtype)
        if dropout is None or form is None:
            return False
        if a.softcap:
            attrs["softcap"] = a.softcap
        attrs.update(dropout)
        attrs.update(form[0])
        bias, mask, relative = form[1:]
        optional = [bias or "", mask or "", STEP if dropout else "", *relative]
        while optional and not optional[-1]:
            optional.pop()
        key = self.key(kt, batch, heads)
        value = self.as4(a.v, (batch, heads, t, v.shape[-1]) if len(v.shape) == 3 else v.shape)
        if self.shape(key)[1] != self.shape(value)[1]:
            return False
        out = a.root.outputs[0] if len(y.shape) == 4 else self.activation(f"{a.root.name}/fused")
        name = a.root.name
        inputs = (self.as4(a.q, (batch, heads, s, d)), key, value, *optional)
        self.nodes.append(Node(FUSED, inputs, (out,), attrs, name, a.root.notes, "memplan"))
        if len(y.shape) == 3:
            self.nodes.append(Node("Reshape", (out,), a.root.outputs, {"shape": list(y.shape)}, f"{name}/as_3d"))
        return True

    def shape(self, name):
        return (self.fresh[name] if name in self.fresh else self.graph.tensors[name]).shape

    def node(self, op, inputs, attrs, shape, dtype):
        """The output of a new node (op, inputs, attrs) of `shape` and `dtype`, made once for every layer that
        asks for it."""
        key = (op, tuple(inputs), repr(sorted(attrs.items())))
        if key not in self.made:
            out = f"{inputs[0]}/{op.lower()}{len(self.made)}"
            self.made[key] = out
            self.fresh[out] = Tensor(out, tuple(shape), dtype, "activation")
            self.nodes.append(Node(op, tuple(inputs), (out,), attrs, f"{out}/fused_attention"))
        return self.made[key]

    def dropout(self, node):
        """The fused op's dropout attributes for the export's Dropout on the probabilities ({} without one),
        None where it draws at random outside a training step (it is left unfused)."""
        if node is None or not node.attrs.get("ratio"):
            return {}
        if not self.training:
            return None if node.attrs.get("training_mode") else {}
        seed = node.attrs.get("seed")
        return {"dropout": float(node.attrs["ratio"]),
                "seed": int(seed) if seed is not None else self.graph.nodes.index(node)}

    def terms(self, terms, s, t, heads, dtype):
        """(mask attributes, the one bias, the mask input, the relative-position inputs) of the terms
        (attention_form.Term, in the order they apply): Where masks share the op's fill, the first band of them
        becomes causal and window, the rest the mask input (their intersection); an additive band becomes causal
        and window where no Where mask claims the fill; the first relative-position terms become the op's rows
        and cols, the other additive terms the bias. None where a term cannot be read alike."""
        reads = [self.term(term, s, t, dtype) for term in terms]
        if None in reads:
            return None
        sets = [k for k, (kind, value) in enumerate(reads) if kind == "mask" or kind == "band" and value[2] == "set"]
        added = [k for k, (kind, value) in enumerate(reads) if kind == "band" and value[2] == "add"]
        if len({reads[k][1][1] for k in sets}) > 1:
            return None
        found, masks, biases, before, relative = {}, [], [], [], ["", "", "", ""]
        for k, (term, (kind, value)) in enumerate(zip(terms, reads)):
            if k in sets and kind == "band" and not found:
                found = {"causal": 1, "window": value[0], "fill": value[1], "fill_mode": "set"}
            elif k in sets:
                masks.append(self.bias4(self.band_mask(term) if kind == "band" else value[2], term.shape, heads))
            elif k in added and not sets and not found:
                found = {"causal": 1, "window": value[0], "fill": value[1], "fill_mode": "add"}
            elif kind in ("bias", "band"):
                bias = value if kind == "bias" else term.value
                if not self.relative(bias, term.shape, heads, relative):
                    biases.append(self.bias4(bias, term.shape, heads))
            before.append(len(biases) + sum(map(bool, relative)) // 2)
        if None in biases or None in masks:
            return None
        if sets:
            found.setdefault("fill", reads[sets[0]][1][1])
            given = before[-1]  # every additive term
            if given and all(before[k] == given for k in sets):
                found["fill_mode"] = "set_after_bias"
            elif any(before[k] for k in sets) and found["fill"] != -math.inf:
                return None
            found.setdefault("fill_mode", "set")
        return found, self.summed(biases), self.combined(masks), relative

    def band_mask(self, term):
        """A Where band mask beyond the first, as a constant mask input."""
        cond = self.mask(term.cond)
        return self.const(cond if term.attends else ~cond)

    def combined(self, masks):
        """The intersection of the masks (None for none), by And nodes."""
        total = masks[0] if masks else None
        for mask in masks[1:]:
            total = self.node("And", (total, mask), {}, broadcast(self.shape(total), self.shape(mask)), np.dtype(bool))
        return total

    def relative(self, bias, shape, heads, relative):
        """Whether the bias is relative-position terms (attention_relative) that the op's free rows and cols
        inputs take; if so, fills `relative` (rows, rows index, cols, cols index)."""
        parts = gathers(self.graph, bias, lambda graph, name: self.mask(name))
        slots = [2 * part.crossed for part in parts or ()]
        if not parts or len(set(slots)) != len(slots) or any(relative[k] for k in slots):
            return False
        for part, k in zip(parts, slots):
            table = self.graph.tensors[part.table]
            if table.dtype != self.graph.tensors[bias].dtype or table.shape[:-2] != shape[:-2]:
                return False
        for part, k in zip(parts, slots):
            table = self.graph.tensors[part.table]
            lines = table.shape[-2:]
            name = self.as4(part.table, (*heads, *lines) if len(shape) == 3 else table.shape)
            if part.scale != 1:
                name = self.node("Mul", (name, self.const(np.array(part.scale, table.dtype))), {}, self.shape(name),
                                 table.dtype)
            relative[k:k + 2] = [name, self.const(part.index)]
        return True

    def term(self, term, s, t, dtype):
        """("band", (window, fill, mode)), ("mask", (None, fill, the keys kept: a bool tensor)), ("bias", tensor)
        or ("none", None) for one Term; None where it cannot be read alike."""
        g = self.graph
        if term.kind == "add":
            if g.tensors[term.value].dtype != dtype:
                return None
            value = self.mask(term.value)
            if value is None:
                found = self.band(term.value, s, t, True)
                return ("bias", term.value) if found is None else ("band", (*found, "add"))
            if not value.any():
                return "none", None
            window = band(value == 0, s, t)
            hidden = value.reshape(-1, s, t)[0][~(value.reshape(-1, s, t)[0] == 0)] if window is not None else None
            if hidden is not None and hidden.size and (hidden == hidden[0]).all():
                return "band", (window, float(hidden[0]), "add")
            return "bias", term.value
        fill = constant(g, term.value)
        if fill is None or fill.size != 1 or np.isnan(fill).any():
            return None
        fill = float(fill.ravel()[0])
        cond = self.mask(term.cond)
        if cond is None:
            if term.attends and _built_causal(g, term.cond, s, t):
                return "band", (0, fill, "set")
            found = self.band(term.cond, s, t, False, term.attends)
            if found is not None:
                return "band", (found[0], fill, "set")
            attend = term.cond if term.attends else self.node("Not", (term.cond,), {}, self.shape(term.cond),
                                                                np.dtype(bool))
            return "mask", (None, fill, attend)
        attend = cond if term.attends else ~cond
        if attend.all():
            return "none", None
        window = band(attend, s, t)
        if window is not None:
            return "band", (window, fill, "set")
        return "mask", (None, fill, self.const(attend))

    def bias4(self, bias, shape, heads):
        """`bias` (broadcasting to the scores' `shape` at its term) as a tensor that broadcasts to (B, H, S, T);
        None where a 3-D one mixes heads with the batch otherwise than as (B H)."""
        b = self.shape(bias)
        if len(shape) == 4:
            return bias
        b = (1,) * (3 - len(b)) + tuple(b)
        if b[0] not in (1, heads[0] * heads[1]):
            return None
        return self.as4(bias, (*heads, *b[1:]) if b[0] > 1 else (1, 1, *b[1:]))

    def summed(self, biases):
        """The sum of the biases (None for none), by Add nodes."""
        total = biases[0] if biases else None
        for bias in biases[1:]:
            total = self.node("Add", (total, bias), {}, broadcast(self.shape(total), self.shape(bias)), self.dtype(total))
        return total

    def dtype(self, name):
        return (self.fresh[name] if name in self.fresh else self.graph.tensors[name]).dtype

    def key(self, kt, batch, heads):
        """K as the fused op reads it, (B, Hkv, T, D), from K^T: where the export transposed the keys into K^T
        itself, that Transpose's input (reshaped from (B H, T, D)); else K^T transposed."""
        g, name = self.graph, kt.name
        producer = g.producers.get(name)
        if len(kt.shape) == 3:
            source = producer.inputs[0] if producer is not None and producer.op == "Transpose" and not producer.domain \
                and list(producer.attrs.get("perm") or [2, 1, 0]) == [0, 2, 1] else None
            if source is not None:
                return self.as4(source, (batch, heads, *g.tensors[source].shape[1:]))
            name = self.as4(name, (batch, heads, *kt.shape[1:]))
            perm = [0, 1, 3, 2]
        elif producer is None or producer.op != "Transpose" or producer.domain:
            perm = [0, 1, 3, 2]
        else:
            inner = producer.attrs.get("perm") or list(range(4))[::-1]
            name, perm = producer.inputs[0], [int(inner[i]) for i in (0, 1, 3, 2)]
        if perm == [0, 1, 2, 3]:
            return name
        shape = self.shape(name)
        return self.node("Transpose", (name,), {"perm": perm}, tuple(shape[p] for p in perm), kt.dtype)

    def as4(self, name, shape):
        """Tensor `name` of `shape`: itself where it has it, else a Reshape of it (a view)."""
        shape = tuple(shape)
        if tuple(self.shape(name)) == shape:
            return name
        return self.node("Reshape", (name,), {"shape": list(shape)}, shape, self.dtype(name))

    def activation(self, name):
        self.fresh[name] = Tensor(name, None, None, "activation")
        return name

    def const(self, value):
        name = f"fused_attention/const{len(self.fresh)}"
        self.fresh[name] = Tensor(name, value.shape, value.dtype, "const", value)
        return name


def fused(graph, training=False):
    """(graph with every attention it can fuse replaced, how many)."""
    fuser, found, taken = _Fuser(graph, training), [], set()
    for node in graph.nodes:
        if node.op != "Softmax" or node.domain or node.name in taken:
            continue
        a = read(graph, node)
        if a is None or not taken.isdisjoint(a.nodes) or not exclusive(graph, a.root, a.nodes):
            continue
        new = fuser.build(a)
        if new is not None:
            found.append((Match(a.root, tuple(a.nodes.values()), {}, {}), new))
            taken.update(a.nodes)
    if any(STEP in n.inputs for _, new in found for n in new) and STEP not in graph.inputs:
        graph = replace(graph, inputs=(*graph.inputs, STEP),
                        tensors={**graph.tensors, STEP: Tensor(STEP, (), np.dtype(np.float64), "input")})
    graph, _ = replace_matches(graph, found, {k: t for k, t in fuser.fresh.items() if t.kind == "const"}, "attention")
    return graph, len(found)


def fuse_attention(training=False):
    """The Pass fusing attention, for a training step's graph where `training`."""
    return rewrite_pass("fuse_attention", partial(fused, training=training), "attention that fuses")
