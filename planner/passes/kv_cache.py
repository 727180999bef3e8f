"""A static KV cache in place of an export's concatenated one. An export with a cache takes each layer's past keys
and values as inputs and returns `present = Concat(past, new)`: a copy of the whole cache at every step, whose
length grows with it. Planned for `length` positions and `tokens` new ones a step, each past input becomes a
persistent cache (a "state" tensor of `length` positions) and each Concat a memplan.CacheWrite of the new
positions into it at the `POSITION` input, in place (Graph.updates), so that prefill and decode read and write the
same bytes and nothing else moves.

The graph is typed with `length - tokens` past positions, so every attention reads `length` keys, and it computes
its masks as for a cache filled to the end: in its coordinates the step's tokens are the last ones and the past
ones come before them (left-padded). The cache holds position p at slot p instead, so each attention's mask and
bias, and its causal band and window, are rolled by `length - tokens - position` along the keys (the mask is computed
from its sources rolled by Gathers, never the cache), and the slots after the step's last token, not yet written,
are hidden. The masks of
the export (causal, sliding windows, padding by attention_mask) are thereby kept as they are."""
from dataclasses import replace

import numpy as np

from .. import shapes
from ..errors import ModelError
from ..generation import POSITION, caches
from ..ir import Node, Tensor, op_name
from .base import TYPED, Pass, Result

ATTENTION = ("memplan", "ScaledDotProductAttention")
ROLLED = frozenset({"Where", "And", "Or", "Xor", "Not", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                    "Add", "Sub", "Mul", "Div", "Neg", "Cast", "Min", "Max", "IsNaN", "IsInf"})
"""ONNX ops computing value by value with broadcasting, which a roll along the last axis passes through: each input's
last axis is the output's or 1."""


def kv_cache(tokens, length):
    """The Pass planning a step of `tokens` new positions over a static cache of `length` (see the module)."""
    def apply(graph, context):
        found = caches(graph)
        if not found:
            raise ModelError("the model has no cache: no output is a Concat of a past input and new values (an "
                             "export with past key/values in and present key/values out)")
        tensors, nodes, updates = dict(graph.tensors), {}, list(graph.updates)
        tensors[POSITION] = Tensor(POSITION, (), np.dtype(np.int64), "input")
        for past, output, concat in found:
            present = tensors[concat.outputs[0]]
            axis = concat.attrs["axis"] % len(present.shape)
            if present.shape[axis] != length:
                raise ModelError(f"{output!r} holds {present.shape[axis]} positions on axis {axis}, not the cache's "
                                 f"{length}")
            tensors[past] = Tensor(past, present.shape, present.dtype, "state")
            nodes[concat.name] = Node("CacheWrite", (past, concat.inputs[1], POSITION), (present.name,),
                                      {"axis": axis}, concat.name, concat.notes, "memplan")
            updates.append((present.name, past))
        pasts, presents = {p for p, _, _ in found}, {c.outputs[0] for _, _, c in found}
        outputs = {o for _, o, _ in found}
        rolled = _Rolled(graph, tokens, length, tensors)
        kept = []
        for node in graph.nodes:
            node = nodes.get(node.name, node)
            if (node.domain, node.op) == ATTENTION and presents & set(node.inputs[1:3]):
                made, node = rolled(node)
                kept += made
            kept.append(node)
        tensors.update((o, Tensor(o, None, None, "activation")) for n in kept for o in n.outputs if o not in tensors)
        rewritten = shapes.prune(replace(graph, nodes=tuple(kept), tensors=tensors, updates=tuple(updates),
                                         inputs=tuple(n for n in graph.inputs if n not in pasts) + (POSITION,),
                                         outputs=tuple(n for n in graph.outputs if n not in outputs)))
        for past in pasts:
            other = [n for n in rewritten.consumers[past] if n.op != "CacheWrite"]
            if other:
                raise ModelError(f"{op_name(other[0].domain, other[0].op)} {other[0].name!r} reads the past input "
                                 f"{past!r} besides its Concat; a static cache replaces the past it reads")
        for present in presents:
            other = [n for n in rewritten.consumers[present] if (n.domain, n.op) != ATTENTION
                     or present not in n.inputs[1:3] or present in n.inputs[:1] + n.inputs[3:]]
            if other:
                raise ModelError(f"{op_name(other[0].domain, other[0].op)} {other[0].name!r} reads the cache "
                                 f"{present!r}; a static cache is read as keys and values by memplan's fused attention "
                                 "alone (fuse_attention on)")
        graph = shapes.retype(rewritten, graph)
        facts = {"kv_cache": {"caches": [[p, c.outputs[0]] for p, _, c in found], "position": POSITION, "length": length,
                              "tokens": tokens}}
        return Result(graph, True, facts)

    return Pass("kv_cache", apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}))


class _Rolled:
    """The nodes rolling masks from the graph's coordinates (the step's tokens last) to the cache's slots: called on
    an attention, (the nodes it needs first that no earlier attention made, it reading the rolled mask and bias)."""

    def __init__(self, graph, tokens, length, tensors):
        self.producers, self.tokens, self.length, self.tensors = graph.producers, tokens, length, tensors
        self.rolled = {}  # {tensor: its rolled form}, made by an earlier attention's nodes
        shift, slots, index = "kv_cache/shift", "kv_cache/slots", "kv_cache/roll"
        self._const("kv_cache/arange", np.arange(length, dtype=np.int64))
        self._const("kv_cache/first_hidden", np.int64(tokens))
        self._const("kv_cache/last_start", np.int64(length - tokens))
        self._const("kv_cache/length", np.int64(length))
        self.common = [Node("Sub", ("kv_cache/last_start", POSITION), (shift,), name=shift),
                       Node("Add", ("kv_cache/arange", shift), (slots,), name=slots),
                       Node("Mod", (slots, "kv_cache/length"), (index,), name=index),
                       Node("Add", (POSITION, "kv_cache/first_hidden"), ("kv_cache/end",), name="kv_cache/end"),
                       Node("Less", ("kv_cache/arange", "kv_cache/end"), ("kv_cache/written",),
                            name="kv_cache/written")]
        self.index = index

    def _const(self, name, value):
        self.tensors[name] = Tensor(name, value.shape, value.dtype, "const", value)

    def __call__(self, node):
        """(the nodes the attention `node` reads that are not made yet, `node` reading the rolled bias and mask, its
        band and window among the mask)."""
        inputs = list(node.inputs) + [""] * max(0, 5 - len(node.inputs))
        made, self.common = self.common, []
        if inputs[3]:
            inputs[3] = self._roll(inputs[3], made)
        mask = "kv_cache/written"
        causal, window = int(node.attrs.get("causal", 0)), int(node.attrs.get("window", 0))
        if causal:
            mask = self._and(self._gather(self._band(window), made), mask, made)
        if inputs[4]:
            mask = self._and(self._roll(inputs[4], made), mask, made)
        inputs[4] = mask
        return made, replace(node, inputs=tuple(inputs), attrs={**node.attrs, "causal": 0, "window": 0})

    def _band(self, window):
        """The const (tokens, length) bool band of `causal` (and `window`) in the graph's coordinates."""
        name = f"kv_cache/band{window}" if window else "kv_cache/band"
        if name not in self.tensors:
            i, j = np.arange(self.tokens)[:, None], np.arange(self.length)[None, :]
            last = i + self.length - self.tokens
            self._const(name, (j <= last) & ((j > last - window) if window else True))
        return name

    def _roll(self, name, made):
        """`name` rolled along its last axis, the keys: itself where that axis is 1 (or it has none); else the value
        by value op making it (ROLLED) applied to its inputs rolled, so that the export's mask is computed rolled
        rather than copied so (the float mask of a prefill, (B, 1, P, L), is not made twice); else a Gather."""
        shape = self.tensors[name].shape
        if not shape or shape[-1] == 1:
            return name
        if name in self.rolled:
            return self.rolled[name]
        node = self.producers.get(name)
        if node is None or node.domain or node.op not in ROLLED or len(node.outputs) != 1:
            return self._gather(name, made)
        inputs = tuple(self._roll(i, made) if i else i for i in node.inputs)
        return self._made(name, Node(node.op, inputs, (f"{name}/rolled",), node.attrs, f"{name}/rolled", node.notes),
                          made)

    def _gather(self, name, made):
        if name in self.rolled:
            return self.rolled[name]
        out = f"{name}/rolled"
        return self._made(name, Node("Gather", (name, self.index), (out,), {"axis": -1}, out), made)

    def _and(self, a, b, made):
        out = f"{a}&{b}"
        return self._made(out, Node("And", (a, b), (out,), name=out), made)

    def _made(self, key, node, made):
        """`node`'s output, `node` among `made` unless an earlier attention made it (kept under `key`)."""
        if key not in self.rolled:
            made.append(node)
            self.rolled[key] = node.outputs[0]
        return self.rolled[key]
