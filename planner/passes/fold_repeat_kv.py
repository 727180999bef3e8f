"""Grouped-query attention reads its key and value heads in place: transformers' `repeat_kv` (Unsqueeze, Expand,
Reshape: each of the Hkv heads copied G times) before memplan.ScaledDotProductAttention is dropped, as the op
reads kv head h // G for query head h itself. The copy is G times the keys' and values' bytes each layer: under
a KV cache, G copies of the whole cache at every step. Two more forms of the same values are looked through to
find it: Reshapes that come back to the shape they left, and the dynamo exporter's batched K^T (Reshape to
(B H, T, D), Transpose) turned back by the fusion's Transpose, a copy of the keys each."""
from dataclasses import replace

from .base import rewrite_pass

ATTENTION = ("memplan", "ScaledDotProductAttention")


def _repeated(graph, name):
    """The (B, Hkv, T, D) tensor that `name` (B, Hkv * G, T, D) repeats each head of G times, or None."""
    reshape = graph.producer(name)
    expand = reshape and reshape.op == "Reshape" and graph.producer(reshape.inputs[0])
    unsqueeze = expand and expand.op == "Expand" and graph.producer(expand.inputs[0])
    if not unsqueeze or unsqueeze.op != "Unsqueeze":
        return None
    x, ones, wide, out = (graph.tensors[n].shape for n in (unsqueeze.inputs[0], unsqueeze.outputs[0],
                                                          expand.outputs[0], name))
    if len(x) != 4 or ones != (*x[:2], 1, *x[2:]) or wide[:2] + wide[3:] != x or out != (x[0], x[1] * wide[2], *x[2:]):
        return None
    return unsqueeze.inputs[0]


def _same_values(graph, name):
    """The earliest tensor whose values `name` holds in its shape: through Reshapes back to that shape, and K^T's
    round trip, Transpose(0, 1, 3, 2) of Reshape (B, H, D, T) of Transpose(0, 2, 1) of Reshape (B H, T, D) of
    X (B, H, T, D)."""
    shape, node = graph.tensors[name].shape, graph.producer(name)
    if node is not None and node.op == "Transpose" and list(node.attrs.get("perm", ())) == [0, 1, 3, 2]:
        back = graph.producer(node.inputs[0])
        flip = back and back.op == "Reshape" and graph.producer(back.inputs[0])
        rows = flip and flip.op == "Transpose" and list(flip.attrs.get("perm", ())) == [0, 2, 1] and \
            graph.producer(flip.inputs[0])
        if rows and rows.op == "Reshape" and graph.tensors[rows.inputs[0]].shape == shape and len(shape) == 4 and \
                graph.tensors[rows.outputs[0]].shape == (shape[0] * shape[1], *shape[2:]):
            name, node = rows.inputs[0], graph.producer(rows.inputs[0])
    found = name
    while node is not None and node.op == "Reshape":
        name, node = node.inputs[0], graph.producer(node.inputs[0])
        if graph.tensors[name].shape == shape:
            found = name
    return found


def folded(graph):
    """(graph with each attention reading the kv heads its repeat_kv copied, how many attentions were)."""
    nodes, count = [], 0
    for node in graph.nodes:
        if (node.domain, node.op) == ATTENTION:
            k, v = (_repeated(graph, n) or n for n in (_same_values(graph, n) for n in node.inputs[1:3]))
            if (k, v) != tuple(node.inputs[1:3]) and graph.tensors[k].shape[1] == graph.tensors[v].shape[1]:
                node, count = replace(node, inputs=(node.inputs[0], k, v, *node.inputs[3:])), count + 1
        nodes.append(node)
    return (replace(graph, nodes=tuple(nodes)) if count else graph), count


fold_repeat_kv = rewrite_pass("fold_repeat_kv", folded, "attention reading repeated kv heads")
