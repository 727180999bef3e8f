"""Serving a causal LM from one arena: `Generation` says what is served (batch, the cache's length, the prompt's),
and a GenerationPlan holds the plans of its two steps, prefill (the prompt's tokens) and decode (one token), whose
weights and KV cache sit at the same offsets in both, below each step's own buffers, so that both run in one arena
(executor.Generator). The cache is static (planner/passes/kv_cache.py): written in place, never copied."""
from dataclasses import dataclass, field, replace

import numpy as np

from .deferred import Deferred
from .errors import ModelError, PlanError

IDS, MASK, POSITIONS = "input_ids", "attention_mask", "position_ids"
"""The inputs of an export with a cache that a step feeds besides the cache (Optimum's and transformers' names)."""
ENTRIES = ("prefill", "decode")
POSITION = "cache_position"
"""The int64 scalar input of a step planned with a static cache: the slot of its first token."""
PASS_THROUGH = ("Identity", "Cast")
SHARED = ("param", "const", "state")
"""The kinds of tensor both steps hold at the same offsets: what stays in the arena between them."""


def caches(graph):
    """[(past input, present output, the Concat writing it)] of an export with a cache: each graph output a
    two-input Concat makes (through PASS_THROUGH: the precision pass's Cast back to the output's type) of a graph
    input (through PASS_THROUGH and one-input Concats) and new values."""
    found = []
    for name in graph.outputs:
        concat = graph.producer(_source(graph, name, concats=False))
        if concat is None or concat.op != "Concat" or len(concat.inputs) != 2:
            continue
        past = _source(graph, concat.inputs[0])
        if past in graph.inputs:
            found.append((past, name, concat))
    return found


def _source(graph, name, concats=True):
    """The tensor whose value `name` holds (through PASS_THROUGH, and one-input Concats where `concats`)."""
    node = graph.producer(name)
    while node is not None and (node.op in PASS_THROUGH or (concats and node.op == "Concat" and len(node.inputs) == 1)):
        name, node = node.inputs[0], graph.producer(node.inputs[0])
    return name



@dataclass(frozen=True)
class Generation:
    """`batch` sequences served together, each of at most `max_length` positions (its prompt and the tokens it
    generates), prompts of `prompt` tokens (shorter ones padded on the left). `tokens` is the step being planned
    (the prompt for prefill, 1 for decode), which planner.compile sets for each."""

    batch: int = 1
    max_length: int = 2048
    prompt: int = 128
    tokens: int | None = None

    def __post_init__(self):
        for name in ("batch", "max_length", "prompt"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"Generation's {name} must be an int >= 1, got {value!r}")
        if self.prompt >= self.max_length:
            raise PlanError(f"a prompt of {self.prompt} tokens leaves no room to generate in max_length "
                            f"{self.max_length}")

    def entries(self):
        """{step: this Generation planning it}."""
        return {"prefill": replace(self, tokens=self.prompt), "decode": replace(self, tokens=1)}

    def input_shapes(self, graph):
        """The input shapes of this step of `graph`, an export with a cache as read (untyped): the token inputs,
        the attention mask over the cache's positions, and each past input of `max_length - tokens` positions."""
        found = caches(graph)
        if not found:
            raise ModelError("the model has no cache to generate with: no output is a Concat of a past input and "
                             "new values (export it with past key/values in and present key/values out)")
        pasts = {past: concat for past, _, concat in found}
        other = [n for n in graph.inputs if n not in pasts and n not in (IDS, MASK, POSITIONS)]
        missing = [n for n in (IDS, POSITIONS) if n not in graph.inputs]
        if other or missing:
            raise ModelError(f"a model that generates takes {IDS}, {POSITIONS}, an optional {MASK} and its past "
                             f"key/values; this one {'also takes ' + repr(other) if other else 'lacks ' + repr(missing)}"
                             f" (under a static cache the positions are fed, not counted from the past's length)")
        shapes = {IDS: (self.batch, self.tokens), POSITIONS: (self.batch, self.tokens)}
        if MASK in graph.inputs:
            shapes[MASK] = (self.batch, self.max_length)
        for past, concat in pasts.items():
            declared = graph.tensors[past].shape
            if declared is None:
                raise ModelError(f"past input {past!r} declares no shape: its heads and head size are unknown")
            axis = concat.attrs.get("axis", 0) % len(declared)
            shape = [self.batch if k == 0 else self.max_length - self.tokens if k == axis else d
                     for k, d in enumerate(declared)]
            if not all(isinstance(d, int) for d in shape):
                raise ModelError(f"past input {past!r} declares shape {declared}: all but its batch and positions "
                                 "must be numbers (its heads and head size)")
            shapes[past] = tuple(shape)
        return shapes


@dataclass
class GenerationPlan:
    """The plans of prefill and decode (planner.Plan each) of one Generation, sharing their weights and caches
    (plan_checks.PERSISTENT tensors of kinds SHARED) at the same offsets; `arena_bytes` holds either step."""

    generation: Generation
    prefill: object
    decode: object
    caches: list = field(default_factory=list)

    @property
    def arena_bytes(self):
        return max(self.prefill.arena_bytes, self.decode.arena_bytes)

    @property
    def weights_bytes(self):
        """The params and consts both steps read: the weights, as the plans hold them (a step's own folded tables, such
        as a weightless export's mask for its shape, are not)."""
        read = [{i for s in plan.steps for i in s.inputs} for plan in (self.prefill, self.decode)]
        return sum(t.nbytes for n, t in self.decode.tensors.items()
                   if t.kind in ("param", "const") and n in read[0] and n in read[1])

    @property
    def cache_bytes(self):
        return _bytes(self.decode, ("state",))

    @property
    def shared_bytes(self):
        """The bytes from the arena's start to the end of the last shared tensor."""
        return max((t.offset + t.nbytes for t in self.decode.tensors.values() if t.kind in SHARED), default=0)

    def peak(self, entry):
        """The arena bytes the step `entry` ("prefill" or "decode") needs."""
        return getattr(self, entry).arena_bytes

    def verify(self):
        """Both plans verify, and they place every shared tensor alike."""
        for plan in (self.prefill, self.decode):
            plan.verify()
        places = [{n: (t.offset, t.nbytes, t.dtype, tuple(t.shape)) for n, t in p.tensors.items() if t.kind in SHARED}
                  for p in (self.prefill, self.decode)]
        if places[0] != places[1]:
            differ = sorted(set(places[0].items()) ^ set(places[1].items()))[:3]
            raise PlanError(f"prefill and decode place their shared tensors differently: {differ}")
        return self


def _bytes(plan, kinds):
    return sum(t.nbytes for t in plan.tensors.values() if t.kind in kinds)


def shared(graphs):
    """The typed graphs of the steps (in ENTRIES order), each holding every SHARED tensor of them all, first and in
    one order, so that both place them alike: a param or const of one name but another type or other values in a
    later step (a mask folded for its shape, in a config's exports for each step) is renamed there."""
    held, renamed = {}, []
    for entry, graph in zip(ENTRIES, graphs):
        names = {}
        for t in graph.tensors.values():
            if t.kind not in SHARED:
                continue
            if t.name in held and not _same(held[t.name], t):
                if t.kind == "state":
                    raise PlanError(f"cache {t.name!r} is {held[t.name].shape} in prefill but {t.shape} in {entry}")
                names[t.name] = f"{t.name}@{entry}"
                held[names[t.name]] = replace(t, name=names[t.name])
            else:
                held.setdefault(t.name, t)
        renamed.append(_renamed(graph, names))
    return [replace(g, tensors={**held, **{n: t for n, t in g.tensors.items() if n not in held}}) for g in renamed]


def _same(a, b):
    """Whether two steps' tensors of one name are the same: a state by its type, a param or const by its values (the
    same weight, array or computation of them)."""
    if (a.shape, a.dtype) != (b.shape, b.dtype):
        return False
    if a.kind == "state" or a.data is b.data:
        return True
    if isinstance(a.data, Deferred):
        return a.data.same_as(b.data)
    return isinstance(a.data, np.ndarray) and isinstance(b.data, np.ndarray) and np.array_equal(a.data, b.data)


def _renamed(graph, names):
    """`graph` with the tensors `names` ({old: new}) renamed where nodes read them."""
    if not names:
        return graph
    nodes = tuple(replace(n, inputs=tuple(names.get(i, i) for i in n.inputs)) for n in graph.nodes)
    tensors = {names.get(k, k): (replace(t, name=names[k]) if k in names else t) for k, t in graph.tensors.items()}
    return replace(graph, nodes=nodes, tensors=tensors)


__all__ = ["Generation", "GenerationPlan", "POSITION", "IDS", "MASK", "POSITIONS"]
