"""Drop the nodes that compute nothing, Identity and a Cast to the dtype its input already has: their
readers read the input instead. Exporters leave both behind (torch.onnx's Identity of a parameter, a
`.float()` of a float tensor); a Cast would otherwise cost a copy and its bytes."""
from dataclasses import replace

from .base import TYPED, Pass, Result


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


def _simplify(graph, context):
    result = simplified(graph, context.options.fetch)
    return Result(result, result is not graph)


simplify = Pass("simplify", _simplify, needs=frozenset({TYPED}), keeps=frozenset({TYPED}))
