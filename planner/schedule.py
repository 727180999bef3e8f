"""The order nodes run in: the model's own, or one chosen to lower the peak of live bytes.

"memory" is a greedy list scheduler (as in XLA's and TVM's memory schedulers): among the nodes
whose inputs are ready, run the one that frees the most bytes net of what it allocates, the
earliest in the file on ties. It is kept only when its peak is below the file order's.
"""
import heapq

from .errors import PlanError
from .liveness import TRANSIENT, peak_bytes

ORDERS = ("file", "memory")


def schedule(graph, order="file", held=()):
    """The nodes of a typed graph in a topological order: "file" or "memory"."""
    if order not in ORDERS:
        raise PlanError(f"unknown schedule {order!r}; choose one of {', '.join(ORDERS)}")
    steps = tuple(graph.nodes)
    if order == "memory" and steps:
        greedy = _greedy(graph, held)
        if peak_bytes(graph, greedy, held) < peak_bytes(graph, steps, held):
            return greedy
    return steps


def _greedy(graph, held):
    nodes = graph.nodes
    index = {node.name: k for k, node in enumerate(nodes)}
    keep = set(graph.outputs) | set(held)
    size = {name: t.nbytes if t.kind in TRANSIENT and name not in keep else 0 for name, t in graph.tensors.items()}
    ins = [tuple(dict.fromkeys(i for i in node.inputs if i)) for node in nodes]
    readers = {name: [index[c.name] for c in users] for name, users in graph.consumers.items()}
    remaining = {name: len(users) for name, users in readers.items()}
    producer = {name: index[node.name] for name, node in graph.producers.items()}
    waiting = [sum(1 for i in ins[k] if i in producer) for k in range(len(nodes))]
    made = [sum(graph.tensors[o].nbytes for o in node.outputs if o) for node in nodes]

    def score(k):
        return sum(size[i] for i in ins[k] if remaining[i] == 1) - made[k]

    heap = [(-score(k), k) for k in range(len(nodes)) if not waiting[k]]
    heapq.heapify(heap)
    done, order = [False] * len(nodes), []
    while heap:
        neg, k = heapq.heappop(heap)
        if done[k]:
            continue
        if -neg != score(k):
            heapq.heappush(heap, (-score(k), k))
            continue
        done[k] = True
        order.append(nodes[k])
        for i in ins[k]:
            remaining[i] -= 1
            if remaining[i] == 1:
                last = next(c for c in readers[i] if not done[c])
                if not waiting[last]:
                    heapq.heappush(heap, (-score(last), last))
        for o in nodes[k].outputs:
            for c in readers.get(o, ()) if o else ():
                waiting[c] -= 1
                if not waiting[c]:
                    heapq.heappush(heap, (-score(c), c))
    return tuple(order)
