"""Lifetimes: the steps at which each transient tensor (input, activation, output) holds memory.

A lifetime is `(first, last)`, inclusive. Graph inputs live from step 0 to their last reader;
a tensor lives from the step that writes it to the step of its last reader (the step that writes
it when nothing reads it, so it is freed at once); tensors in `held` (graph outputs, fetched
tensors) live to step len(steps), when the run hands them back, so that even the last step
cannot write over them. Params and consts are persistent and have no lifetime.
"""
from . import allocators

TRANSIENT = ("input", "activation", "output")


def lifetimes(graph, steps, held=()):
    """{name: (first, last)} of every transient tensor, for nodes run in the order `steps`."""
    end = len(steps)
    first = {name: 0 for name in graph.inputs}
    last = dict(first)
    for step, node in enumerate(steps):
        for name in node.inputs:
            if name in last:
                last[name] = step
        for name in node.outputs:
            if name:
                first[name] = last[name] = step
    for name in (*graph.outputs, *held):
        if name in last:
            last[name] = end
    return {name: (first[name], last[name]) for name in first if graph.tensors[name].kind in TRANSIENT}


def peak_bytes(graph, steps, held=(), alignment=256):
    """LOAD of a schedule: the most transient device bytes live at one step, with no sharing of buffers."""
    life = lifetimes(graph, steps, held)
    names = [name for name in life if not graph.tensors[name].host]
    return allocators.lower_bound([graph.tensors[n].nbytes for n in names], [life[n][0] for n in names],
                                  [life[n][1] for n in names], alignment)
