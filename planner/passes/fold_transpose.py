"""Fold a transposed matrix into Gemm: MatMul(A, Transpose(W)) with W a matrix, as torch.onnx writes a
Linear layer whose weight is also read elsewhere (GPT-2's LM head, tied to the token embedding), becomes
Gemm(A, W, transB=1) over A's rows (Reshape views around it when A has batch dims). The Transpose copies
W, and training keeps that copy for the backward pass and makes a second one for W's gradient: for GPT-2
small, 147 MiB each. Gemm reads W transposed in place and its gradient comes out in W's own layout.
planner.compile counts the folds in plan.stats["folded_transposes"]; CompileOptions(fold_transpose=False)
keeps the exported form."""
import math

from ..ir import Node
from .base import rewrite_pass
from .pattern import Op, rewrite

PATTERN = Op("MatMul", "a", Op("Transpose", "w", name="transpose"))
SUFFIX = "/folded_transpose"
"""How the Gemm of a fold is named: the MatMul's name and this."""


def _fold(graph, match):
    """The Gemm (and Reshapes) for one match, or None where W is not a matrix or A not a batch of rows."""
    a, w = (graph.tensors[match.bindings[k]] for k in ("a", "w"))
    perm = match.named["transpose"].attrs.get("perm")
    if len(w.shape) != 2 or (perm is not None and list(perm) != [1, 0]) or len(a.shape) < 2 \
            or w.dtype.kind != "f":
        return None
    root = match.root
    gemm = root.name + SUFFIX
    if len(a.shape) == 2:
        return [Node("Gemm", (a.name, w.name), root.outputs, {"transB": 1}, gemm, root.notes)]
    rows, out = math.prod(a.shape[:-1]), graph.tensors[root.outputs[0]].shape
    flat, product = f"{root.name}/rows", gemm
    return [Node("Reshape", (a.name,), (flat,), {"shape": [rows, a.shape[-1]]}, flat, root.notes),
            Node("Gemm", (flat, w.name), (product,), {"transB": 1}, product, root.notes),
            Node("Reshape", (product,), root.outputs, {"shape": list(out)}, root.name, root.notes)]


def folded(graph):
    """(graph with each MatMul of a transposed matrix made a Gemm, whether any was)."""
    return rewrite(graph, PATTERN, lambda m: _fold(graph, m))


fold_transpose = rewrite_pass("fold_transpose", folded, "MatMul of a transposed matrix that folds")
