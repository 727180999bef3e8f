"""A generation step's greedy next token as an output: the ArgMax over the vocabulary of the last position's logits,
computed in the arena, so that executor.Generator reads back one int64 a sequence (on a GPU, into a host buffer
made once, nothing allocated a token) instead of reducing the logits itself."""
from dataclasses import replace

from .. import shapes
from ..ir import Node, Tensor
from .base import rewrite_pass
from .last_logits import last_position

NEXT = "next_token"
"""The output holding each sequence's next token, (batch, 1) int64."""


def with_next_token(graph):
    """(graph with NEXT among its outputs, whether it was added): the first output's (batch, positions, vocabulary)
    logits, their last position's ArgMax."""
    if NEXT in graph.outputs or not graph.outputs or len(graph.tensors[graph.outputs[0]].shape) != 3:
        return graph, 0
    logits = graph.outputs[0]
    positions = graph.tensors[logits].shape[1]
    nodes, source = list(graph.nodes), logits
    if positions > 1:
        cut, source = last_position(graph, logits)
        nodes.append(cut)
    nodes.append(Node("ArgMax", (source,), (NEXT,), {"axis": -1, "keepdims": 0}, NEXT))
    tensors = {**graph.tensors, **{n: Tensor(n, None, None, "activation") for n in {source, NEXT} - {logits}}}
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors, outputs=(*graph.outputs, NEXT)), graph), 1


next_token = rewrite_pass("next_token", with_next_token, "generation step without its next token")
