"""A prefill reads the logits of each sequence's last position alone (the next token's), so its LM head runs on that
position's hidden state: Slice before the head's MatMul (and the per-value ops after it, such as Gemma's soft cap),
instead of a (batch, prompt, vocabulary) tensor, which at 8,192 tokens of a 128,256-word vocabulary is 2 GiB of
bf16 a sequence, more than its KV cache (transformers' generate asks the model for the last position's logits
alike: logits_to_keep=1)."""
from dataclasses import replace

from ..ir import Annotations, Node, Tensor
from .. import shapes
from .base import rewrite_pass
from .pattern import constant

PER_VALUE = ("Cast", "Tanh", "Div", "Mul", "Add", "Sub", "Identity")
"""Ops the LM head's output may pass through value by value (a one-element operand beside it) before it is output."""


def _head(graph):
    """(the MatMul computing the first output's logits from (batch, positions, hidden) rows, the tensors from it to
    the output), or None."""
    chain = list(graph.outputs[:1])
    node = graph.producer(chain[0]) if chain else None
    while node is not None and node.op in PER_VALUE and not node.domain:
        rest = [i for i in node.inputs[1:] if i]
        if any(constant(graph, i, absent=True) is None or graph.tensors[i].size != 1 for i in rest):
            return None
        chain.append(node.inputs[0])
        node = graph.producer(node.inputs[0])
    if node is None or node.op != "MatMul" or len(graph.tensors[node.inputs[0]].shape) != 3 or \
            len(graph.tensors[node.inputs[1]].shape) != 2 or graph.tensors[node.inputs[0]].shape[1] == 1:
        return None
    return node, chain


def last_position(graph, name, notes=Annotations()):
    """(the Slice of `name` (batch, positions, ...) to its last position, what it writes: `name`/last_position)."""
    out, positions = f"{name}/last_position", graph.tensors[name].shape[1]
    node = Node("Slice", (name,), (out,), {"starts": [positions - 1], "ends": [positions], "axes": [1]}, out, notes)
    return node, out


def sliced(graph):
    """(graph whose LM head reads the last position's hidden state, whether it was rewritten)."""
    found = _head(graph)
    if found is None:
        return graph, 0
    head, chain = found
    cut, last = last_position(graph, head.inputs[0], head.notes)
    nodes = []
    for node in graph.nodes:
        if node is head:
            nodes += [cut, replace(node, inputs=(last, *node.inputs[1:]))]
        else:
            nodes.append(node)
    retyped = {n: Tensor(n, None, None, graph.tensors[n].kind if n in graph.tensors else "activation")
               for n in (last, *chain)}
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors={**graph.tensors, **retyped}), graph), 1


last_logits = rewrite_pass("last_logits", sliced, "LM head on more than the last position")
