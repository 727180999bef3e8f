"""Synchronised batch statistics (Parallel.sync_batchnorm, PyTorch's SyncBatchNorm): under data parallelism each
rank's training-mode BatchNormalization would normalise its own rows alone (DDP's), so the ranks would not train
as one process on the whole batch. Here each normalises by the statistics of the whole batch of the `dp` ranks:
the per-channel mean of X all-reduced (a mean over ranks: their batches are equal), then the mean of the squares
of X minus it, all-reduced likewise (two passes, as the one-process kernel computes the variance); Y is the
inference-mode BatchNormalization with those statistics, and the running ones are updated from them as the
training-mode op does (old * momentum + new * (1 - momentum)). The gradient flows through the all-reduces (their
adjoint is an all-reduce of the ranks' gradients, as SyncBatchNorm's backward all-reduces its sums), so each
rank's gradients are those of the whole batch. Statistics of 16-bit inputs are computed in float32.
Facts: "sync_batchnorm" (dp, how many BatchNormalizations)."""
from dataclasses import replace
from functools import partial

import numpy as np

from .. import ops, shapes
from ..builder import Builder, FreshNames
from ..ir import Node, Phase
from .base import PRUNED, TYPED, Pass, Property, Result


def sync_batchnorm(dp):
    """The Pass normalising each training-mode BatchNormalization by the statistics of `dp` data ranks."""
    synced = Property("with every BatchNormalization's statistics all-reduced over the data ranks", _synced)
    return Pass("sync_batchnorm", partial(_sync_batchnorm, dp=dp), needs=frozenset({TYPED}),
                makes=frozenset({TYPED}), keeps=frozenset({PRUNED}), ensures=frozenset({synced}))


def _sync_batchnorm(graph, context, dp):
    b, nodes, count = Builder(graph, prefix="sync_batchnorm", phase=Phase.FORWARD), [], 0
    fresh = FreshNames({*(n.name for n in graph.nodes), *graph.tensors})
    for node in graph.nodes:
        if node.op != "BatchNormalization" or node.domain or not node.attrs.get("training_mode"):
            nodes.append(node)
            continue
        start = len(b.nodes)
        tail = _normalised(b, graph, node, dp, fresh)
        nodes += [*b.nodes[start:], *tail]
        count += 1
    if not count:
        return Result(graph, False)
    typed = shapes.retype(replace(graph, nodes=tuple(nodes), tensors={**graph.tensors, **b.tensors}), graph)
    return Result(typed, True, {"sync_batchnorm": {"dp": dp, "layers": count}})


def _normalised(b, graph, node, dp, fresh):
    """Append to `b` the nodes of `node`'s statistics over the `dp` ranks; the nodes that write its outputs (named
    by `fresh`, a FreshNames)."""
    x, scale, bias, mean, var = node.inputs
    t, schema = graph.tensors[x], ops.of(node, graph.opsets)
    axes, channels = [0, *range(2, len(t.shape))], [1, t.shape[1], *(1 for _ in t.shape[2:])]
    work = np.dtype(np.float32) if t.dtype.itemsize < 4 else t.dtype
    wide = x if t.dtype == work else b.cast(x, work)

    def reduced(value):
        local = b.op("ReduceMean", value, axes=axes, keepdims=0)
        return b.op("AllReduce", local, domain="memplan", world=dp, mean=1, group="dp")

    batch_mean = reduced(wide)
    centred = b.op("Sub", wide, b.op("Reshape", batch_mean, shape=channels))
    batch_var = reduced(b.op("Mul", centred, centred))
    stats = graph.tensors[mean].dtype
    if stats != work:
        batch_mean, batch_var = b.cast(batch_mean, stats), b.cast(batch_var, stats)
    outs = [*node.outputs, "", "", "", ""][:5]
    tail = [Node("BatchNormalization", (x, scale, bias, batch_mean, batch_var), (outs[0],),
                 {**node.attrs, "training_mode": 0}, node.name, node.notes, node.domain)]
    momentum = schema.attr(node, "momentum")
    for out, old, new in ((outs[1], mean, batch_mean), (outs[2], var, batch_var)):
        if out:  # new + (old - new) * momentum, as the training-mode kernel updates it
            kept = b.op("Mul", b.op("Sub", old, new), b.const(momentum, old))
            tail.append(Node("Add", (kept, new), (out,), {}, fresh(f"{node.name}/running/{out}"), node.notes))
    tail += [Node("Identity", (value,), (out,), {}, fresh(f"{node.name}/saved/{out}"), node.notes)
             for out, value in ((outs[3], batch_mean), (outs[4], batch_var)) if out]
    return tail


def _synced(graph, facts):
    """No BatchNormalization left normalising by its own rows' statistics."""
    return not any(n.op == "BatchNormalization" and not n.domain and n.attrs.get("training_mode")
                   for n in graph.nodes)
