"""Recomputation (planner.remat): forward tensors recomputed in backward instead of kept, by the
options' `remat` (default "budget" with a `memory_budget`, "mirror" with MXNET_BACKWARD_DO_MIRROR=1).
Fact: "remat", what the strategy decided."""
from .. import remat
from ..config import Config
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Property, Result


def recomputation(strategy=None, memory_budget=None, config=None, device="any"):
    """The Pass recomputing by `strategy` (planner.remat; None: with a `memory_budget` "budget", or "swap" with the
    Config's enable_swap; else "mirror" with its backward_do_mirror), with the Config's search settings and time
    model (of a plan for `device`)."""
    config = config or Config()
    strategy = strategy or (("swap" if config.enable_swap else "budget") if memory_budget is not None else
                            "mirror" if config.backward_do_mirror else None)

    def apply(graph, context):
        rewritten, decided = remat.rematerialize(graph, strategy, lambda g: context.measure(g, context.facts),
                                                 memory_budget, config, device)
        return Result(rewritten, rewritten is not graph, {"remat": decided})
    return Pass("recomputation", apply, needs=frozenset({TYPED, GRADIENTS}),
                keeps=frozenset({TYPED, LOSS, GRADIENTS, UPDATES}),
                ensures=frozenset({Property("with recomputed values read in backward alone", _backward_reads)}))


def _backward_reads(graph, facts):
    """Every value a recomputed node makes is read by backward nodes (or recomputed ones) alone."""
    for node in graph.nodes:
        if node.notes.recompute:
            for out in node.outputs:
                if any(r.notes.forward and not r.notes.recompute for r in graph.consumers.get(out, ())):
                    return False
    return True
