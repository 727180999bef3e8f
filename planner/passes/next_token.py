"""A generation step's greedy next token as an output: the ArgMax over the vocabulary of the last position's logits,
computed in the arena, so that executor.Generator reads back one int64 a sequence (on a GPU, into a host buffer
made once, nothing allocated a token) instead of reducing the logits itself."""
from dataclasses import replace

from .. import shapes
from ..ir import Node, Tensor
from .base import TYPED, Pass, Property, Result

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
        source = f"{logits}/last_position"
        nodes.append(Node("Slice", (logits,), (source,), {"starts": [positions - 1], "ends": [positions], "axes": [1]},
                          source))
    nodes.append(Node("ArgMax", (source,), (NEXT,), {"axis": -1, "keepdims": 0}, NEXT))
    tensors = {**graph.tensors, **{n: Tensor(n, None, None, "activation") for n in {source, NEXT} - {logits}}}
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors, outputs=(*graph.outputs, NEXT)), graph), 1


def _apply(graph, context):
    graph, count = with_next_token(graph)
    return Result(graph, bool(count))


next_token = Pass("next_token", _apply, needs=frozenset({TYPED}), makes=frozenset({TYPED}),
                  ensures=frozenset({Property("the next token an output", lambda graph, facts: NEXT in graph.outputs)}))
