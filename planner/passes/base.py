"""The pass interface: a named rewrite of a graph, what it needs the graph to be and what it keeps,
and `run`, which applies a pipeline (a plain list of passes) in order."""
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, NamedTuple

from ..config import Config
from ..errors import PlanError
from ..ir import Graph, Node
from ..options import CompileOptions

TYPED = "typed"
"""Every tensor has a concrete shape and dtype, constants are folded (planner.shapes)."""
PRUNED = "pruned"
"""Every node and tensor is needed by a graph output or an update."""
LOSS = "with a loss"
"""The graph's one output is the scalar "loss" (planner.losses)."""
GRADIENTS = "with gradients"
"""The graph computes the gradient of the loss for each param that trains (planner.autodiff)."""
UPDATES = "with the optimizer's updates"
"""Each trained param (and its optimizer state) is written over by its update (Graph.updates)."""


class Result(NamedTuple):
    """What a pass returns: the graph, whether the pass changed it, and what it found, for
    plan.training (a dict of plain data)."""

    graph: Graph
    modified: bool
    facts: dict = MappingProxyType({})


@dataclass(frozen=True)
class Context:
    """What a pass reads besides the graph: the options, the shapes binding the model's inputs, the
    Config, the facts earlier passes found, and `measure(graph, facts)`, which plans a candidate graph as
    far as its buffers (planning.Measured: its LOAD, and its arena once allocated), by which searches
    compare candidates, allocating only those that can beat the best so far."""

    options: CompileOptions = CompileOptions()
    input_shapes: dict | None = None
    config: Config = field(default_factory=Config.from_env)
    facts: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    measure: Callable | None = None


@dataclass(frozen=True)
class Pass:
    """A named rewrite, `apply(graph, context) -> Result`. The graph must have the properties in `needs`
    before it; after it, it has those in `makes` and those of `keeps` it had (the others may no longer
    hold, e.g. TYPED after a rewrite that does not retype what it changed)."""

    name: str
    apply: Callable
    needs: frozenset = frozenset()
    makes: frozenset = frozenset()
    keeps: frozenset = frozenset()


def run(pipeline, graph, context=None, properties=frozenset()):
    """Apply the passes of `pipeline` in order to `graph` (which has `properties`); return the last
    graph and the facts the passes found. A pass meeting a graph without what it needs is a PlanError
    naming the pass and what is missing."""
    context = context or Context()
    facts = dict(context.facts)
    for step in pipeline:
        missing = step.needs - properties
        if missing:
            raise PlanError(f"pass {step.name!r} needs a graph {', '.join(sorted(missing))}; the pipeline "
                            f"{' -> '.join(p.name for p in pipeline)} does not make it before")
        graph, _, found = step.apply(graph, replace(context, facts=MappingProxyType(facts)))
        facts.update(found)
        properties = (properties & step.keeps) | step.makes
    return graph, facts


def rewrite_pass(name, fused, inference_only=False):
    """The Pass `name` of a graph rewrite, `fused(graph) -> (graph, how many places it rewrote)`, typed
    graph in and out; skipped where CompileOptions.<name> is False, and in training when `inference_only`."""
    def apply(graph, context):
        if not getattr(context.options, name) or (inference_only and context.options.training):
            return Result(graph, False)
        graph, count = fused(graph)
        return Result(graph, bool(count))
    return Pass(name, apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}))


CONVS = {("", "Conv"), ("com.microsoft", "FusedConv")}
"""The convolutions a `conv_pass` may replace."""


def conv_pass(name, prepare):
    """The Pass `name` replacing the convolutions (CONVS) of inference plans for the CPU (not for a CUDA
    `device`; skipped where CompileOptions.<name> is False) by a faster memplan op that computes the same:
    `prepare(graph, context)` gives `choose(node, x, w, y)` (the node and its X, W, Y Tensors), which returns
    (memplan op, attributes to add) or None to keep the node. The new node keeps the node's inputs, outputs
    and attributes (with FusedConv's `activation`, empty for a Conv)."""
    def apply(graph, context):
        options = context.options
        if not getattr(options, name) or options.training or options.device.startswith("cuda"):
            return Result(graph, False)
        choose, nodes = prepare(graph, context), []
        for node in graph.nodes:
            found = (node.domain, node.op) in CONVS and \
                choose(node, *(graph.tensors[t] for t in (*node.inputs[:2], node.outputs[0])))
            nodes.append(Node(found[0], node.inputs, node.outputs, {"activation": "", **node.attrs, **found[1]},
                              node.name, node.notes, "memplan") if found else node)
        changed = any(a is not b for a, b in zip(nodes, graph.nodes))
        return Result(replace(graph, nodes=tuple(nodes)) if changed else graph, changed)
    return Pass(name, apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}))
