"""A Transpose that moves only axes of size 1 keeps every value where it was: it becomes a Reshape, which the plan
makes a view of its input (no copy, no step). A decoded token's heads, (B, 1, H, D) to (B, H, 1, D), are such
transposes: 4 a layer, each a copy and a kernel call otherwise."""
from dataclasses import replace

from ..ir import Node
from .base import rewrite_pass


def _moves_values(node, graph):
    """Whether the Transpose `node` moves values: its permutation reorders axes of more than one element."""
    shape = graph.tensors[node.inputs[0]].shape
    perm = node.attrs.get("perm") or list(range(len(shape)))[::-1]
    kept = [axis for axis in perm if shape[axis] != 1]
    return kept != sorted(kept)


def viewed(graph):
    """(graph with each Transpose of size-1 axes alone a Reshape, how many were)."""
    nodes, count = [], 0
    for node in graph.nodes:
        if node.op == "Transpose" and not node.domain and node.inputs and not _moves_values(node, graph):
            shape = list(graph.tensors[node.outputs[0]].shape)
            if 0 not in shape:  # Reshape reads a 0 as "this dim of the input"
                node, count = Node("Reshape", node.inputs[:1], node.outputs, {"shape": shape}, node.name,
                                   node.notes), count + 1
        nodes.append(node)
    return (replace(graph, nodes=tuple(nodes)) if count else graph), count


transpose_view = rewrite_pass("transpose_view", viewed, "Transpose of size-1 axes alone")
