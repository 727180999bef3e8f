"""Store a Gemm's constant B transposed, once: in inference plans, Gemm(A, B, transB=1) with B a float
matrix constant that this Gemm alone reads becomes Gemm(A, B^T) over a const holding B^T, computed when
read (planner.deferred), so that no run hands BLAS a transposed operand. torch.onnx writes every Linear
layer so; OpenBLAS's sgemm ran 1.1 to 1.8x slower on the transposed form (batch 8 into 1000 classes:
0.84 against 0.47 ms). B^T takes B's bytes (B is dropped), and a B read elsewhere as well (an LM head tied
to the embedding) keeps transB, since its copy would add them. Training keeps B, which it updates in its
own layout; CompileOptions(pretranspose=False) keeps it everywhere. plan.stats["pretransposed"] counts
them."""
from collections import Counter
from dataclasses import replace

import numpy as np

from ..deferred import computed
from ..ir import Tensor
from .base import rewrite_pass
from .pattern import constant

SUFFIX = "/transposed"
"""How the const holding B^T is named: B's name and this."""


def _transposed(b):
    return np.ascontiguousarray(b.T)


def transposed(graph):
    """(graph with each such Gemm reading B^T, how many do)."""
    readers = Counter(name for node in graph.nodes for name in node.inputs)
    nodes, fresh = [], {}
    for node in graph.nodes:
        gemm = node.op == "Gemm" and not node.domain and node.attrs.get("transB")
        b = graph.tensors[node.inputs[1]] if gemm else None
        value = constant(graph, b.name, absent=True) if gemm else None
        if value is not None and len(b.shape) == 2 and b.dtype.kind == "f" and readers[b.name] == 1 \
                and b.name not in graph.outputs:
            name = b.name + SUFFIX
            fresh[name] = Tensor(name, b.shape[::-1], b.dtype, "const", computed(_transposed, b.shape[::-1], b.dtype,
                                                                                 value))
            node = replace(node, inputs=(node.inputs[0], name, *node.inputs[2:]), attrs={**node.attrs, "transB": 0})
        nodes.append(node)
    return replace(graph, nodes=tuple(nodes), tensors={**graph.tensors, **fresh}), len(fresh)


pretranspose = rewrite_pass("pretranspose", transposed, "Gemm of a constant B^T that can store it transposed")
