"""In-place reuse (MXNET_EXEC_ENABLE_INPLACE): which outputs take their input's buffer.

Walks the schedule as MXNet's planner does. Views (Reshape, Flatten, inference Dropout) share their
input's bytes under every strategy, since they are those bytes; in-place writes only where allowed. An output may take input i's buffer when the op
offers (i, output) in its schema, the input was not taken yet by another output of the node,
the output is used, and the byte sizes match. A view (Reshape, inference Dropout) always may:
it writes nothing. A write may only go into an activation buffer that holds no graph output or
fetched tensor, and only when this node is the buffer's last pending reader.
"""
from . import ops

WRITABLE = ("activation",)


def aliases(graph, steps, held=(), writes=True):
    """{output name: root tensor name} for every output that shares an earlier tensor's buffer,
    and the set of those outputs that are views (written without touching the bytes). With
    `writes=False` only views share."""
    held = set(graph.outputs) | set(held)
    pending = {}
    for node in steps:
        for name in dict.fromkeys(i for i in node.inputs if i):
            pending[name] = pending.get(name, 0) + 1
    root_of, views = {}, set()
    refs = {name: pending.get(name, 0) + (name in held) for name in graph.tensors}
    kept = set(held)
    for node in steps:
        schema = ops.of(node, graph.opsets)
        taken = set()
        for i, o in _options(schema, node, writes):
            src, out = node.inputs[i], node.outputs[o]
            if not src or not out or src in taken or out in root_of or not refs[out]:
                continue
            root = root_of.get(src, src)
            view = o == 0 and i == 0 and schema.is_view(node)
            if not view and not (graph.tensors[root].kind in WRITABLE and root not in kept and refs[root] == 1
                                 and graph.tensors[src].nbytes == graph.tensors[out].nbytes):
                continue
            taken.add(src)
            root_of[out] = root
            refs[root] += refs[out]
            if view:
                views.add(out)
            if out in held:
                kept.add(root)
        for name in dict.fromkeys(i for i in node.inputs if i):
            refs[root_of.get(name, name)] -= 1
    return root_of, views


def _options(schema, node, writes):
    """The (input, output) pairs to try: the view first, then (when `writes`) the schema's in-place pairs."""
    view = ((0, 0),) if schema.is_view(node) else ()
    pairs = (*view, *schema.inplace) if writes else view
    return [(i, o) for i, o in pairs if i < len(node.inputs) and o < len(node.outputs)]
