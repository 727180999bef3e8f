"""memplan's planner: from a model to a typed graph and a memory plan."""
import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")
"""OpenBLAS's threads sleep after 2^18 cycles (0.1 ms) without a GEMM, not 2^28 (0.1 s), instead of spinning
on the cores that the executor's next kernel (a compiled loop on two threads) then needs: mobilenet_v2 ran
1.6x faster, resnet50 1.2x, and bert_base's back-to-back GEMMs keep their threads awake. It takes effect only
where OpenBLAS loads after this (NumPy imported after memplan); a value the user set is kept."""

from .compiler import compile  # noqa: E402
from .options import CompileOptions
from .config import Config
from .errors import (ConfigError, InfeasibleBudgetError, MemplanError, MissingDependencyError, ModelError,
                     PlanError, ShapeError, UnsupportedOpError)
from .ir import Graph, Node, Tensor
from .plan import Plan, PlannedTensor, Step


def load(model, input_shapes=None):
    """Read a model and give every tensor a concrete shape and dtype.

    `model` is a path to an .onnx file, an onnx.ModelProto, a frontends.symbol.Symbol, or
    "zoo:NAME" (a built-in model, see frontends.zoo). `input_shapes` binds the inputs' dynamic
    dims, e.g. {"input": (8, 3, 224, 224)}; dims of the same name in other inputs follow. Composite
    ops (planner/ops/composite.py) come back as the ops they are made of. The graph is the model's own:
    the rewrites (fusions, folding, precision) are compile's (planner.passes.REWRITES), so it still trains
    with the names it was exported with.
    """
    from frontends import read
    from . import passes
    return passes.run(passes.LOADING, read(model), passes.Context(input_shapes=input_shapes))[0]


__all__ = ["load", "compile", "CompileOptions", "Config", "Plan", "PlannedTensor", "Step", "Graph", "Node", "Tensor",
           "MemplanError", "ModelError", "UnsupportedOpError", "ShapeError", "InfeasibleBudgetError",
           "PlanError", "ConfigError", "MissingDependencyError"]
