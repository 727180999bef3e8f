"""One rank's training step under data parallelism (planner.parallel): each optimizer node reads the
gradient reduced over the ranks (AllReduce, or ReduceScatter to this rank's shard under ZeRO-2 and 3; alone,
or in a bucket of gradients laid out as one tensor);
under ZeRO-1 and 2 it updates only this rank's shard of its parameter, with optimizer state of one shard,
and the updated shards are all-gathered over the parameter; under ZeRO-3 the rank keeps only its shard of
each trained parameter, all-gathered before its first forward reader and again before its first backward
reader, so that the whole parameter lives only while those read it (PyTorch FSDP, one unit per
parameter). Shards are cut as the Parallel's `shard` says (evenly, or in rows as FSDP2's). A plan of one
data rank at ZeRO-0 (tensor parallelism alone) reduces nothing. Facts: "parallel" (dp, zero, tp, shard,
prefetch, bucket bytes and buckets, the bytes the collectives send, in all and by group, the sharded params)."""
from dataclasses import replace
from functools import partial

from .. import ops, shapes
from ..builder import Builder
from ..errors import ConfigError
from ..ir import Annotations, Node, Phase, Tensor
from ..ops.collectives import sent_by_group
from ..parallel import Whole, shard_size
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Property, Result

OPTIMIZER_OPS = {("memplan", "SGD"), ("memplan", "Adam")}
GATHERED = (Phase.FORWARD, Phase.BACKWARD)
"""The phases whose readers of a ZeRO-3 parameter read it all-gathered, each phase its own gather."""


def data_parallel(parallel):
    """The Pass making one rank's training step under `parallel` (a planner.Parallel)."""
    reduced = Property("with each update reading its gradient reduced over the data ranks",
                       partial(_reduced, parallel=parallel))
    return Pass("data_parallel", partial(_data_parallel, parallel=parallel), needs=frozenset({TYPED, UPDATES}),
                makes=frozenset({TYPED, UPDATES}), keeps=frozenset({LOSS, GRADIENTS}), ensures=frozenset({reduced}))


def _data_parallel(graph, context, parallel):
    if any(n.notes.assign for n in graph.nodes):
        raise ConfigError("data-parallel plans update params in place (MEGENGINE_INPLACE_UPDATE=1)")
    world, zero = parallel.dp, parallel.zero
    b = Builder(graph, prefix="parallel", phase=Phase.OPTIMIZER)
    tensors, updates = dict(graph.tensors), dict(graph.updates)
    optimizers = [n for n in graph.nodes if (n.domain, n.op) in OPTIMIZER_OPS]
    optimized = {n.inputs[len(ops.of(n).scalars)] for n in optimizers}
    # ZeRO-3 shards the params of more elements than ranks; a smaller one stays whole on each (as ZeRO-1)
    sharded = {p for p in optimized if graph.tensors[p].size > world} if zero == 3 else set()
    gathers, nodes = _gathers(graph, sharded, parallel.prefetch), []
    total = (context.facts.get("scaler") or {}).get("total")
    buckets = _buckets(graph, [_grad(n) for n in optimizers], parallel.bucket_bytes if world > 1 or zero else 0)
    bucket_of = {g: j for j, (_, bucket) in enumerate(buckets) for g in bucket}
    reduced, waiting = {}, {j: [] for j in range(len(buckets))}
    new_values = dict(graph.updates)  # {a param's new value: the param}
    for last, bucket in buckets:
        if last < 0:
            nodes += _reduce_bucket(b, graph, bucket, parallel, reduced)
    for k, node in enumerate(graph.nodes):
        if total in node.inputs:  # amp-fp16's finite check: of every rank's gradients, so that all skip alike
            node = replace(node, inputs=tuple(_summed(total) if i == total else i for i in node.inputs))
        for phase, param in gathers.get(k, ()):
            nodes.append(_gather(graph, param, phase, world, parallel.unit(graph.tensors[param].shape)))
            tensors[_gathered(param, phase)] = Tensor(_gathered(param, phase), None, None, "activation")
        if (node.domain, node.op) in OPTIMIZER_OPS:
            if _grad(node) in bucket_of and _grad(node) not in reduced:  # it updates once its bucket is reduced
                waiting[bucket_of[_grad(node)]].append(node)
            else:
                nodes += _rank_update(b, graph, node, tensors, updates, parallel, sharded, reduced.get(_grad(node)))
        else:
            phase = node.notes.phase
            gathered = {p: _gathered(p, phase) for p in sharded if p in node.inputs and phase in GATHERED}
            if any(i in new_values for i in node.inputs):  # a pipeline stage sends a new value: the gathered one
                now = {old: new for new, old in updates.items()}
                gathered.update((i, now[new_values[i]]) for i in node.inputs if i in new_values)
            nodes.append(replace(node, inputs=tuple(gathered.get(i, i) for i in node.inputs)) if gathered else node)
        if total in node.outputs:
            nodes.append(Node("AllReduce", (total,), (_summed(total),),
                              {"world": parallel.world, "mean": 0, "group": "world"},
                              f"parallel/AllReduce/{total}", Annotations(node.notes.phase), "memplan"))
            tensors[_summed(total)] = Tensor(_summed(total), None, None, "activation")
        for j, (last, bucket) in enumerate(buckets):
            if last == k:
                nodes += _reduce_bucket(b, graph, bucket, parallel, reduced)
                for update in waiting.pop(j):
                    nodes += _rank_update(b, graph, update, tensors, updates, parallel, sharded, reduced[_grad(update)])
    typed = shapes.retype(replace(graph, nodes=tuple(nodes), tensors={**tensors, **b.tensors},
                                  updates=tuple(updates.items())), graph)
    sent = sent_by_group(typed.nodes, typed.tensors)
    facts = {"dp": world, "zero": zero, "tp": parallel.tp, "shard": parallel.shard, "prefetch": parallel.prefetch,
             "bucket_bytes": parallel.bucket_bytes, "buckets": len(buckets), "collective_bytes": sum(sent.values()),
             "collective_bytes_by_group": sent, "sharded": sorted(sharded)}
    return Result(typed, True, {"parallel": facts})


def _grad(node):
    """The gradient an optimizer node reads."""
    return node.inputs[len(ops.of(node).scalars) + 1]


def _rank_update(b, graph, node, tensors, updates, parallel, sharded, reduced=None):
    """The nodes of one rank's update of the param `node` (an optimizer node) updates: its gradient reduced
    over the ranks (`reduced` where its bucket's reduction made it: the whole gradient under ZeRO-0 and 1,
    this rank's shard under 2 and 3), and from ZeRO-1 on the update of this
    rank's shard with state of one shard, gathered back over the param unless the param is itself kept
    sharded (ZeRO-3). Retypes `tensors` and rewrites `updates` (the graph's, as {new: old}) to match."""
    start, scalars = len(b.nodes), len(ops.of(node).scalars)
    param, grad, *state = node.inputs[scalars:]
    p, world, zero = graph.tensors[param], parallel.dp, parallel.zero
    unit = parallel.unit(p.shape)
    if zero == 0:
        if world == 1:  # one rank of data: a plain update (tensor parallelism alone)
            return [node]
        reduced = reduced or b.op("AllReduce", grad, domain="memplan", world=world, mean=1)
        return [*b.nodes[start:], replace(node, inputs=(*node.inputs[:scalars], param, reduced, *state))]
    if zero == 1:
        full = reduced or b.op("AllReduce", grad, domain="memplan", world=world, mean=1)
        grad_shard = b.op("Shard", full, domain="memplan", world=world, unit=unit)
    else:
        grad_shard = reduced or b.op("ReduceScatter", grad, domain="memplan", world=world, mean=1, unit=unit)
    shard = (shard_size(p.size, world, unit),)
    if param in sharded:  # the rank keeps its shard of the param
        tensors[param] = Tensor(param, shard, p.dtype, "param", Whole(p.data, shard))
        param_shard = param
    else:
        param_shard = b.op("Shard", param, domain="memplan", world=world, unit=unit)
    for s in state:
        tensors[s] = Tensor(s, shard, tensors[s].dtype, "state")
    for out in node.outputs:  # now of one shard: typed again
        tensors[out] = Tensor(out, None, None, "activation")
    nodes = [*b.nodes[start:], replace(node, inputs=(*node.inputs[:scalars], param_shard, grad_shard, *state))]
    if param not in sharded:
        start = len(b.nodes)
        gathered = b.op("AllGather", node.outputs[0], domain="memplan", world=world, mean=0, shape=list(p.shape),
                        unit=unit)
        nodes += b.nodes[start:]
        del updates[node.outputs[0]]
        updates[gathered] = param
    return nodes


def _buckets(graph, grads, limit):
    """[(index of the node making its last gradient, the gradients)] of each bucket of two gradients or more:
    `grads` in the order the graph makes them, those of one dtype packed until a bucket holds `limit` bytes
    (none where `limit` is 0). A gradient the graph does not make (a constant) is ready at index -1."""
    made = {out: k for k, node in enumerate(graph.nodes) for out in node.outputs}
    open_, found = {}, []
    for grad in sorted(grads, key=lambda g: made.get(g, -1)) if limit else ():
        t = graph.tensors[grad]
        held = open_.setdefault(t.dtype, [[], 0])
        held[0].append(grad)
        held[1] += t.nbytes
        if held[1] >= limit:
            found.append(open_.pop(t.dtype)[0])
    found += [held for held, _ in open_.values()]
    return sorted(((max(made.get(g, -1) for g in bucket), bucket) for bucket in found if len(bucket) > 1),
                  key=lambda item: item[0])


def _reduce_bucket(b, graph, bucket, parallel, reduced):
    """The nodes reducing a bucket of gradients into `reduced` ({gradient: what the update reads}). Under
    ZeRO-0 and 1: flattened into one tensor, all-reduced (mean) and split back into whole gradients. Under
    ZeRO-2 and 3 (FSDP2's layout): each flattened, padded to whole shards and laid out as (world, shard),
    side by side into one (world, sum of shards) tensor, whose reduce-scatter (mean) gives this rank its row:
    its shard of every gradient, split apart."""
    start, world = len(b.nodes), parallel.dp
    flat = [b.op("Reshape", g, shape=[-1]) for g in bucket]
    if parallel.zero < 2:
        summed = b.op("AllReduce", b.op("Concat", *flat, axis=0), domain="memplan", world=world, mean=1)
        pieces = b.op("Split", summed, outputs=len(bucket), axis=0, split=[graph.tensors[g].size for g in bucket])
        for grad, piece in zip(bucket, pieces):
            reduced[grad] = b.op("Reshape", piece, shape=list(graph.tensors[grad].shape))
        return b.nodes[start:]
    shards, rows = [], []
    for grad, line in zip(bucket, flat):
        t = graph.tensors[grad]
        shards.append(shard_size(t.size, world, parallel.unit(t.shape)))
        if shards[-1] * world != t.size:
            line = b.op("Pad", line, pads=[0, shards[-1] * world - t.size])
        rows.append(b.op("Reshape", line, shape=[world, shards[-1]]))
    mine = b.op("ReduceScatter", b.op("Concat", *rows, axis=1), domain="memplan", world=world, mean=1)
    reduced.update(zip(bucket, b.op("Split", mine, outputs=len(bucket), axis=0, split=shards)))
    return b.nodes[start:]


def _gathers(graph, params, prefetch):
    """{node index: [(phase, param)]}: where each ZeRO-3 param is all-gathered in each phase of GATHERED,
    in the order its first reader of the phase reads them (every rank must gather in one order): before the
    first reader of the param `prefetch` places earlier in that order (the phase's first for the first ones)."""
    first = {}
    for k, node in enumerate(graph.nodes):
        if node.notes.phase in GATHERED and (node.domain, node.op) not in OPTIMIZER_OPS:
            for name in node.inputs:
                if name in params:
                    first.setdefault((node.notes.phase, name), k)
    out = {}
    for phase in GATHERED:
        order = [(k, param) for (p, param), k in sorted(first.items(), key=lambda item: item[1]) if p is phase]
        for j, (_, param) in enumerate(order):
            out.setdefault(order[max(0, j - prefetch)][0], []).append((phase, param))
    return dict(sorted(out.items()))


def _summed(name):
    return f"{name}/summed"


def _gathered(param, phase):
    return f"{param}/gathered/{phase.value}"


def _gather(graph, param, phase, world, unit):
    """The AllGather node of `param`'s whole value for the readers of `phase`."""
    return Node("AllGather", (param,), (_gathered(param, phase),), {"world": world, "mean": 0, "unit": unit,
                "shape": list(graph.tensors[param].shape)}, f"parallel/AllGather/{param}/{phase.value}",
                Annotations(phase), "memplan")


def _reduced(graph, facts, parallel):
    """Whether each optimizer node reads a gradient made from a reduction over the data ranks (AllReduce or
    ReduceScatter of the "dp" group), where there are several ranks or ZeRO's shards."""
    if parallel.dp == 1 and parallel.zero == 0:
        return True
    reduced = set()
    for node in graph.nodes:
        if (node.domain, node.op) in OPTIMIZER_OPS and _grad(node) not in reduced:
            return False
        collective = node.domain == "memplan" and node.op in ("AllReduce", "ReduceScatter") and \
            ops.of(node, graph.opsets).attr(node, "group") == "dp"
        if collective or reduced.intersection(node.inputs):
            reduced.update(o for o in node.outputs if o)
    return True
