"""Drop the nodes that compute nothing, Identity and a Cast to the dtype its input already has: their
readers read the input instead. Exporters leave both behind (torch.onnx's Identity of a parameter, a
`.float()` of a float tensor); a Cast would otherwise cost a copy and its bytes."""
from dataclasses import replace

from .base import TYPED, Pass, Property, Result


def _computes_nothing(node, graph):
    if node.domain or not node.inputs or not node.inputs[0]:
        return False
    if node.op == "Identity":
        return True
    return node.op == "Cast" and graph.tensors[node.outputs[0]].dtype == graph.tensors[node.inputs[0]].dtype


def simplified(graph, keep=()):
    """The typed `graph` without the nodes that compute nothing, but those writing a graph output, an
    update or a name in `keep` (tensors the caller fetches); the graph itself when there is none."""
    held = {*graph.outputs, *(name for pair in graph.updates for name in pair), *keep}
    source, nodes = {}, []
    for node in graph.nodes:
        if any(i in source for i in node.inputs):
            node = replace(node, inputs=tuple(source.get(i, i) for i in node.inputs))
        if _computes_nothing(node, graph) and node.outputs[0] not in held:
            source[node.outputs[0]] = node.inputs[0]
        else:
            nodes.append(node)
    if not source:
        return graph
    return replace(graph, nodes=tuple(nodes), tensors={k: t for k, t in graph.tensors.items() if k not in source})


def simplify(keep=()):
    """The Pass dropping the nodes that compute nothing, but those writing a name in `keep` (fetched)."""
    def apply(graph, context):
        result = simplified(graph, keep)
        return Result(result, result is not graph)
    done = Property("without an Identity or a Cast to its input's dtype",
                    lambda graph, facts: simplified(graph, keep) is graph)
    return Pass("simplify", apply, needs=frozenset({TYPED}), keeps=frozenset({TYPED}), ensures=frozenset({done}))
