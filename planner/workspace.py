"""Temp workspace: the scratch bytes each node asks for, and MXNet's pooling of them into shared slots.

With MXNET_EXEC_NUM_TEMP = k, the nodes that need scratch are coloured into k groups (NNVM's
ColorNodeGroup); each group shares one slot sized to its largest request. Nodes of one colour lie on
one dependency path, so they never run at the same time and may share.
"""
from . import ops
from .ops import Info


def layouts(graph, steps, limit):
    """{node name: workspace Layout} for the nodes of `steps` whose op needs scratch, each of at most
    `limit` bytes (see the op's `workspace` for the one exception). A layout of empty slices (scratch
    shaped by a dim of 0) is kept: it takes no bytes, but its kernel still finds its slices."""
    asked = {}
    for node in steps:
        layout = ops.of(node, graph.opsets).workspace(node, *infos(graph, node), limit)
        if layout.nbytes > 0 or layout.slices:
            asked[node.name] = layout
    return asked


def infos(graph, node):
    """(ins, outs) of a node as an op's `workspace` takes them: Infos, and (shape, dtype) pairs."""
    tensors = graph.tensors
    return ([Info(tensors[name].shape, tensors[name].dtype) if name else None for name in node.inputs],
            [(tensors[name].shape, tensors[name].dtype) if name else None for name in node.outputs])


def room(graph, config):
    """Bytes of scratch any one step may take without growing the arena: where the plan may pool all scratch in
    one slot (workspace_mode "pool" or "auto", one temp slot), the slot its largest request sizes; else 0.
    Passes choosing a faster kernel that needs more scratch (planner/passes/winograd.py) stay within it."""
    if config.workspace_mode == "tensor" or config.temp_slots != 1:
        return 0
    return max((layout.nbytes for layout in layouts(graph, graph.nodes, config.workspace_limit).values()), default=0)


def color_nodes(steps, ncolor, importance):
    """{node name: colour} by ColorNodeGroup: `ncolor - 1` times, the heaviest path (by summed
    `importance`, {node name: weight}, 0 when absent) takes the next colour for its weighted nodes,
    whose weight then drops to 0; every node left takes the colour after the last path's.

    As in NNVM, the rounds stop early once no weight is left, so fewer than `ncolor` colours may be
    used. `steps` must be in a topological order; node A precedes B when B reads an output of A.
    """
    weight = [importance.get(node.name, 0) for node in steps]
    preds = _predecessors(steps)
    color = [None] * len(steps)
    c = 0
    while c < ncolor - 1:
        path = _heaviest_path(weight, preds)
        if not path:
            break
        for i in path:
            if weight[i]:
                color[i], weight[i] = c, 0
        c += 1
    return {node.name: c if k is None else k for node, k in zip(steps, color)}


def _predecessors(steps):
    """For each step index, the indices of the steps whose outputs it reads."""
    writer = {out: i for i, node in enumerate(steps) for out in node.outputs if out}
    return [{writer[x] for x in node.inputs if x in writer} for node in steps]


def _heaviest_path(weight, preds):
    """The step indices of a path of largest positive summed weight, in order; [] when all weights
    are 0. NNVM's FindBestPath: DP over the reverse order, later nodes winning ties."""
    n = len(weight)
    best, succ = [0] * n, [None] * n
    top, start = 0, None
    for i in range(n - 1, -1, -1):
        best[i] += weight[i]
        if best[i] > top:
            top, start = best[i], i
        for p in preds[i]:
            if best[i] > best[p]:
                best[p], succ[p] = best[i], i
    path = []
    while start is not None:
        path.append(start)
        start = succ[start]
    return path


def pool(steps, asked, slots):
    """(slot sizes, {node name: slot index}): the nodes of `steps` that ask for scratch (`asked`, {node
    name: bytes}) coloured into at most `slots` groups (Config.temp_slots), each slot sized to the
    largest request of its group.

    Colours no request fell into are dropped, so a graph whose requests lie on one path gets one slot.
    """
    color = color_nodes(steps, slots, {name: 1 for name in asked})
    slot_of_color = {c: k for k, c in enumerate(sorted({color[name] for name in asked}))}
    sizes = [0] * len(slot_of_color)
    assignment = {}
    for name, nbytes in asked.items():
        k = assignment[name] = slot_of_color[color[name]]
        sizes[k] = max(sizes[k], nbytes)
    return sizes, assignment
