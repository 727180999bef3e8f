"""memplan's planner: from a model to a typed graph and a memory plan."""
from .config import quiet_blas

quiet_blas()  # before anything loads NumPy

from .compiler import compile, compile_stages  # noqa: E402
from .options import CompileOptions  # noqa: E402
from .parallel import Parallel  # noqa: E402
from .config import Config  # noqa: E402
from .errors import (AboveLimitError, ConfigError, InfeasibleBudgetError, MemplanError, MissingDependencyError,
                     ModelError, PlanError, ShapeError, UnsupportedOpError)  # noqa: E402
from .ir import Graph, Node, Tensor  # noqa: E402
from .plan import Plan, PlannedTensor, Step  # noqa: E402
from .generation import Generation, GenerationPlan  # noqa: E402


def load(model, input_shapes=None):
    """Read a model and give every tensor a concrete shape and dtype.

    `model` is a path to an .onnx file, an onnx.ModelProto, a frontends.symbol.Symbol, or
    "zoo:NAME" (a built-in model, see frontends.zoo). `input_shapes` binds the inputs' dynamic
    dims, e.g. {"input": (8, 3, 224, 224)}; dims of the same name in other inputs follow. Composite
    ops (planner/ops/composite.py) come back as the ops they are made of. The graph is the model's own:
    the rewrites (fusions, folding, precision) are compile's (planner.passes.pipeline), so it still trains
    with the names it was exported with.
    """
    from frontends import read
    from . import passes
    return passes.run(passes.LOADING, read(model), passes.Context(input_shapes=input_shapes))[0]


__all__ = ["load", "compile", "compile_stages", "CompileOptions", "Generation", "GenerationPlan", "Parallel", "Config", "Plan", "PlannedTensor", "Step", "Graph", "Node", "Tensor",
           "MemplanError", "ModelError", "UnsupportedOpError", "ShapeError", "InfeasibleBudgetError",
           "AboveLimitError", "PlanError", "ConfigError", "MissingDependencyError"]
