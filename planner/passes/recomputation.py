"""Recomputation (planner.remat): forward tensors recomputed in backward instead of kept, by the
options' `remat` (default "budget" with a `memory_budget`, "mirror" with MXNET_BACKWARD_DO_MIRROR=1).
Fact: "remat", what the strategy decided."""
from .. import remat
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Result


def _recomputation(graph, context):
    options, config = context.options, context.config
    strategy = options.remat or ("budget" if options.memory_budget is not None
                                 else "mirror" if config.backward_do_mirror else None)
    rewritten, decided = remat.rematerialize(graph, strategy, lambda g: context.measure(g, context.facts),
                                             options.memory_budget, config)
    return Result(rewritten, rewritten is not graph, {"remat": decided})


recomputation = Pass("recomputation", _recomputation, needs=frozenset({TYPED, GRADIENTS}),
                     keeps=frozenset({TYPED, LOSS, GRADIENTS, UPDATES}))
