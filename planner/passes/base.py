"""The pass interface: a named rewrite of a graph, built with its settings, what it needs the graph to be,
what it makes, keeps and ensures, and `run`, which applies a pipeline (a plain list of passes) in order."""
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, NamedTuple

from .. import shapes
from ..errors import PlanError
from ..ir import Graph, Node


@dataclass(frozen=True)
class Property:
    """What a graph is, by name, and `holds(graph, facts)`, a cheap check of it on a graph and the facts the
    passes found (the tests check every pass's after it runs)."""

    name: str
    holds: Callable = field(compare=False, repr=False)

    def __str__(self):
        return self.name


def _pruned(graph, facts):
    pruned = shapes.prune(graph)
    return len(pruned.nodes) == len(graph.nodes) and len(pruned.tensors) == len(graph.tensors)


def _updated(graph, facts):
    written = {old for _, old in graph.updates}
    return bool(facts.get("params")) and all(p in written for p in facts["params"])


TYPED = Property("typed", lambda graph, facts: all(t.is_static for t in graph.tensors.values()))
"""Every tensor has a concrete shape and dtype, constants are folded (planner.shapes)."""
PRUNED = Property("pruned", _pruned)
"""Every node and tensor is needed by a graph output or an update."""
LOSS = Property("with a loss", lambda graph, facts: graph.outputs[:1] == ("loss",) and graph.tensors["loss"].shape == ())
"""The graph's first output is the scalar "loss" (planner.losses; amp-fp16's finite check may follow it)."""
GRADIENTS = Property("with gradients", lambda graph, facts: bool(facts.get("grads")) and all(
    g in graph.tensors for g in facts["grads"].values()))
"""The graph computes the gradient of the loss for each param that trains (planner.autodiff), facts["grads"]."""
UPDATES = Property("with the optimizer's updates", _updated)
"""Each trained param (and its optimizer state) is written over by its update (Graph.updates)."""


class Result(NamedTuple):
    """What a pass returns: the graph, whether the pass changed it, and what it found, for
    plan.training (a dict of plain data)."""

    graph: Graph
    modified: bool
    facts: dict = MappingProxyType({})


@dataclass(frozen=True)
class Context:
    """What a pass reads besides the graph and the settings it was built with: the shapes binding the
    model's inputs, the facts earlier passes found, and `measure(graph, facts)`, which plans a candidate graph
    as far as its buffers (planning.Measured: its LOAD, and its arena once allocated), by which searches
    compare candidates, allocating only those that can beat the best so far."""

    input_shapes: dict | None = None
    facts: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    measure: Callable | None = None


@dataclass(frozen=True)
class Pass:
    """A named rewrite, `apply(graph, context) -> Result`, holding its settings. The graph must have the
    properties in `needs` before it; after it, it has those in `makes` and those of `keeps` it had (the others
    may no longer hold, e.g. TYPED after a rewrite that does not retype what it changed), and those in
    `ensures`: what the pass is for (no foldable BatchNormalization left), which later passes need not keep."""

    name: str
    apply: Callable
    needs: frozenset = frozenset()
    makes: frozenset = frozenset()
    keeps: frozenset = frozenset()
    ensures: frozenset = frozenset()


def run(pipeline, graph, context=None, properties=frozenset()):
    """Apply the passes of `pipeline` in order to `graph` (which has `properties`); return the last
    graph and the facts the passes found. A pass meeting a graph without what it needs is a PlanError
    naming the pass and what is missing."""
    context = context or Context()
    facts = dict(context.facts)
    for step in pipeline:
        missing = step.needs - properties
        if missing:
            raise PlanError(f"pass {step.name!r} needs a graph {', '.join(sorted(map(str, missing)))}; the "
                            f"pipeline {' -> '.join(p.name for p in pipeline)} does not make it before")
        graph, _, found = step.apply(graph, replace(context, facts=MappingProxyType(facts)))
        facts.update(found)
        properties = (properties & step.keeps) | step.makes
    return graph, facts


def rewrite_pass(name, fused, left):
    """The Pass `name` of a graph rewrite, `fused(graph) -> (graph, how many places it rewrote)`, typed graph
    in and out; it ensures that no `left` is left: `fused` finds nothing more to rewrite."""
    def apply(graph, context):
        graph, count = fused(graph)
        return Result(graph, bool(count))
    done = Property(f"no {left} left", lambda graph, facts: not fused(graph)[1])
    return Pass(name, apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}), ensures=frozenset({done}))


CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}
"""The convolutions a `conv_pass` may replace."""


def conv_pass(name, prepare):
    """The builder, `build(config) -> Pass`, of the Pass `name` replacing convolutions (CONVS) by a faster memplan
    op that computes the same (planner.passes.pipeline runs it in inference plans for the CPU):
    `prepare(graph, config)` gives `choose(node, x, w, y)` (the node and its X, W, Y Tensors), which returns
    (memplan op, attributes to add) or None to keep the node. The new node keeps the node's inputs, outputs
    and attributes (with FusedConv's `activation`, empty for a Conv). It ensures that no convolution it
    would take is left."""
    def build(config):
        def apply(graph, context):
            chosen = _chosen(graph, prepare(graph, config))
            if not chosen:
                return Result(graph, False)
            nodes = [Node(chosen[k][0], node.inputs, node.outputs, {"activation": "", **node.attrs, **chosen[k][1]},
                          node.name, node.notes, "memplan") if k in chosen else node
                     for k, node in enumerate(graph.nodes)]
            return Result(replace(graph, nodes=tuple(nodes)), True)
        done = Property(f"no convolution left that {name} takes",
                        lambda graph, facts: not _chosen(graph, prepare(graph, config)))
        return Pass(name, apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}), ensures=frozenset({done}))
    return build


def _chosen(graph, choose):
    """{index of a node of CONVS: (memplan op, attributes)} of those `choose` takes."""
    found = {}
    for k, node in enumerate(graph.nodes):
        pick = (node.domain, node.op) in CONVS and \
            choose(node, *(graph.tensors[t] for t in (*node.inputs[:2], node.outputs[0])))
        if pick:
            found[k] = pick
    return found
