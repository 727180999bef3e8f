"""The order nodes run in: the model's own, or one chosen to lower the peak of live bytes.

"memory" tries two memory-aware orders and keeps the one with the lowest peak (LOAD), as XLA's
scheduler does with its list and DFS schedulers:

- a greedy list scheduler (XLA's ListMemoryScheduler, TVM's): among the nodes whose inputs are
  ready, run the one that frees the most bytes net of what it allocates, the earliest in the file
  on ties;
- a post-order DFS from the sinks (XLA's DFSMemoryScheduler) that visits a node's input subtrees
  in Sethi-Ullman order, the one needing the most memory beyond its result first.

The file's own order is a candidate too, so "memory" never has a higher peak than "file" and
differs from it only when strictly better. Views (identity ops) are counted as new tensors,
as `liveness.peak_bytes` counts them. Host tensors (a swapped value's copy) take no device bytes and
count for nothing. A graph with host copies placed by time (Schema.timed) is planned in its own order alone
(planner.planning).
"""
import heapq
from dataclasses import dataclass, replace

from . import ops
from .errors import PlanError
from .ir import Phase
from .liveness import TRANSIENT, peak_bytes

ORDERS = ("file", "memory")


def schedule(graph, order="file", held=(), last=()):
    """The nodes of a typed graph in a topological order: "file" or "memory".

    `held` names tensors (graph outputs, fetched ones) that are never freed; the nodes named in `last`
    run after all the others, in file order (a training step's optimizer after the whole backward).
    """
    if order not in ORDERS:
        raise PlanError(f"unknown schedule {order!r}; choose one of {', '.join(map(repr, ORDERS))}")
    if last:
        head = replace(graph, nodes=tuple(n for n in graph.nodes if n.name not in last))
        return schedule(head, order, held) + tuple(n for n in graph.nodes if n.name in last)
    steps = tuple(graph.nodes)
    if order == "file" or not steps:
        return steps
    dag = _Dag.of(graph, held)
    greedy = _greedy(dag)
    if len(greedy) < len(steps):
        raise PlanError(_cycle(graph, dag, set(greedy)))
    candidates = [steps] + [tuple(steps[k] for k in order) for order in (greedy, _dfs(dag))]
    peaks = [peak_bytes(graph, c, held) for c in candidates]
    return candidates[peaks.index(min(peaks))]


@dataclass
class _Dag:
    """The graph as index lists, with the bytes a scheduler weighs.

    `reads[k]`: the distinct tensors node k reads; `deps[k]`: the distinct nodes writing them, and for
    a node writing an update (Graph.updates) every other node reading the tensor it overwrites, and
    for a backward node (Phase.BACKWARD) the forward pass's last node: a gradient rule's work on forward
    values alone (BatchNormalization's centred input) waits for the backward pass, as in PyTorch,
    instead of being hoisted into the forward pass where it would live until used;
    `outputs[k]`: the tensors it writes; `readers[t]`: the nodes reading tensor t; `writer[t]`: the
    node writing it; `free[t]`: bytes freed after t's last reader (0 for params, consts and held
    tensors); `made[k]`: bytes node k writes that outlive its step (read later, or held).
    """

    reads: list
    deps: list
    readers: dict
    writer: dict
    free: dict
    made: list
    outputs: list

    @classmethod
    def of(cls, graph, held):
        index = {id(node): k for k, node in enumerate(graph.nodes)}
        keep = {*graph.outputs, *held}
        readers = {t: [index[id(c)] for c in users] for t, users in graph.consumers.items()}
        free = {t: v.nbytes if v.kind in TRANSIENT and t not in keep and not v.host else 0
                for t, v in graph.tensors.items()}
        writer = {t: index[id(node)] for t, node in graph.producers.items()}
        reads = [tuple(dict.fromkeys(i for i in node.inputs if i)) for node in graph.nodes]
        deps = [[writer[i] for i in r if i in writer] for r in reads]
        for new, old in ((n, o) for n, o in graph.updates if n in writer):
            deps[writer[new]] += [index[id(c)] for c in _readers_of_bytes(graph, old) if index[id(c)] != writer[new]]
        forward = [k for k, node in enumerate(graph.nodes) if node.notes.forward]
        for k, node in enumerate(graph.nodes):
            if forward and node.notes.phase is Phase.BACKWARD:
                deps[k].append(forward[-1])
        deps = [tuple(dict.fromkeys(d)) for d in deps]
        outputs = [tuple(o for o in node.outputs if o) for node in graph.nodes]
        made = [sum(graph.tensors[o].nbytes for o in outs if (readers[o] or o in keep) and not graph.tensors[o].host)
                for outs in outputs]
        return cls(reads, deps, readers, writer, free, made, outputs)


def followed(graph, nodes):
    """The graph's `nodes` (in some order) in the order closest to it that runs each after what it must follow (the
    writers of its inputs; for an update, every reader of what it overwrites): each node as early as `nodes` places
    it once those ran, and one that `nodes` leaves out just before its first reader there. An order made for a
    rewrite of the graph (another pass's) becomes one of it."""
    dag = _Dag.of(graph, ())
    index = {id(node): k for k, node in enumerate(graph.nodes)}
    rank = {index[id(node)]: j for j, node in enumerate(nodes)}
    for k in reversed(range(len(graph.nodes))):  # one `nodes` leaves out (a rewrite dropped it): before its readers
        if k not in rank:
            rank[k] = min((rank[r] for o in dag.outputs[k] for r in dag.readers.get(o, ())), default=len(nodes)) - 0.5
    waiting = [len(set(d)) for d in dag.deps]
    after = {}
    for k, deps in enumerate(dag.deps):
        for d in set(deps):
            after.setdefault(d, []).append(k)
    ready = [(rank[k], k) for k, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(graph.nodes[k])
        for j in after.get(k, ()):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (rank[j], j))
    if len(out) < len(graph.nodes):
        raise PlanError(_cycle(graph, dag, {index[id(node)] for node in out}))
    return tuple(out)


def _cycle(graph, dag, done):
    """Why no order runs every node: the nodes of a cycle of dependencies among those not `done`, where an
    update overwrites bytes a node that must run after it still reads (a param shared with the value that
    overwrites it)."""
    k, seen = next(k for k in range(len(dag.deps)) if k not in done), []
    while k not in seen:
        seen.append(k)
        k = next(d for d in dag.deps[k] if d not in done)
    cycle = seen[seen.index(k):]
    names = [graph.nodes[k].name for k in reversed(cycle)]
    shown = " -> ".join(names[:6]) + (f" -> ... ({len(names)} nodes)" if len(names) > 6 else "")
    return (f"no order runs every node: {shown} -> {names[0]} wait on each other (a value that overwrites a "
            f"tensor another of them still reads, such as an initializer the model shares between a trained "
            f"weight and a running statistic)")


def _readers_of_bytes(graph, name):
    """The nodes reading `name` or a view of it (Reshape and the like may share its bytes)."""
    found, todo = [], [name]
    while todo:
        for node in graph.consumers[todo.pop()]:
            found.append(node)
            if ops.of(node, graph.opsets).is_view(node) and node.outputs[0]:
                todo.append(node.outputs[0])
    return found


def _greedy(dag):
    """List scheduling: repeatedly run the ready node with the best net bytes freed, O(E log N).

    A node's score only rises (when it becomes the last reader of an input), so a raised score is
    pushed anew and the stale, lower entry is skipped when it surfaces.
    """
    remaining = {t: len(r) for t, r in dag.readers.items()}
    waiting = [len(d) for d in dag.deps]
    after = [[] for _ in waiting]
    for k, deps in enumerate(dag.deps):
        for d in deps:
            after[d].append(k)
    done, order = [False] * len(waiting), []

    def score(k):
        return sum(dag.free[t] for t in dag.reads[k] if remaining[t] == 1) - dag.made[k]

    heap = [(-score(k), k) for k, w in enumerate(waiting) if not w]
    heapq.heapify(heap)
    while heap:
        _, k = heapq.heappop(heap)
        if done[k]:
            continue
        done[k] = True
        order.append(k)
        for t in dag.reads[k]:
            remaining[t] -= 1
            if remaining[t] == 1 and dag.free[t]:
                last = next(c for c in dag.readers[t] if not done[c])
                if not waiting[last]:
                    heapq.heappush(heap, (-score(last), last))
        for c in after[k]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(heap, (-score(c), c))
    return order


def _dfs(dag):
    """Post-order DFS from the sinks (in file order), each node's inputs visited in Sethi-Ullman order.

    On graphs with many outputs sharing subtrees, file order of the sinks beat sorting them by need.
    """
    kids = _sethi_ullman(dag)
    used = {k for d in dag.deps for k in d}
    sinks = [k for k in range(len(kids)) if k not in used]
    visited, order = [False] * len(kids), []
    for root in sinks:
        visited[root] = True
        stack = [(root, iter(kids[root]))]
        while stack:
            k, todo = stack[-1]
            for c in todo:
                if not visited[c]:
                    visited[c] = True
                    stack.append((c, iter(kids[c])))
                    break
            else:
                stack.pop()
                order.append(k)
    return order


def _sethi_ullman(dag):
    """Each node's producer nodes, ordered so the subtree needing the most bytes beyond its result
    runs first; a node's need is estimated as if its inputs formed a tree (shared ones counted
    each time), which orders trees optimally and DAGs well enough to be worth a try."""
    need, kids = [0] * len(dag.deps), []
    for k, deps in enumerate(dag.deps):
        order = sorted(deps, key=lambda c: (dag.made[c] - need[c], c))
        kept = peak = 0
        for c in order:
            peak = max(peak, kept + need[c])
            kept += dag.made[c]
        need[k] = max(peak, kept + dag.made[k])
        kids.append(order)
    return kids
