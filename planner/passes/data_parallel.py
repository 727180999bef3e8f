"""One rank's training step under data parallelism (planner.parallel): each optimizer node reads the
gradient reduced over the ranks (AllReduce, or ReduceScatter to this rank's shard under ZeRO-2); under
ZeRO-1/2 it updates only this rank's shard of its parameter, with optimizer state of one shard, and the
updated shards are all-gathered over the parameter. Facts: "parallel" (dp, zero, collective bytes)."""
from dataclasses import replace

from .. import ops, shapes
from ..autodiff import Builder
from ..errors import ConfigError
from ..ir import Phase, Tensor
from ..ops.collectives import communicated
from ..parallel import shard_size
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Result

OPTIMIZER_OPS = {("memplan", "SGD"), ("memplan", "Adam")}


def _data_parallel(graph, context):
    parallel = context.options.parallel
    if parallel is None:
        return Result(graph, False)
    if "scaler" in context.facts:
        raise ConfigError("data-parallel plans with amp-fp16's loss scaling are not planned yet; use amp-bf16")
    if any(n.notes.assign for n in graph.nodes):
        raise ConfigError("data-parallel plans update params in place (MEGENGINE_INPLACE_UPDATE=1)")
    world, zero = parallel.dp, parallel.zero
    b = Builder(graph, prefix="parallel", phase=Phase.OPTIMIZER)
    tensors, updates, nodes = dict(graph.tensors), dict((new, old) for new, old in graph.updates), []
    for node in graph.nodes:
        if (node.domain, node.op) not in OPTIMIZER_OPS:
            nodes.append(node)
            continue
        start = len(b.nodes)
        scalars = len(ops.of(node).scalars)
        param, grad, *state = node.inputs[scalars:]
        if zero == 0:
            reduced = b.op("AllReduce", grad, domain="memplan", world=world, mean=1)
            nodes += [*b.nodes[start:], replace(node, inputs=(*node.inputs[:scalars], param, reduced, *state))]
            continue
        if zero == 1:
            full = b.op("AllReduce", grad, domain="memplan", world=world, mean=1)
            grad_shard = b.op("Shard", full, domain="memplan", world=world)
        else:
            grad_shard = b.op("ReduceScatter", grad, domain="memplan", world=world, mean=1)
        param_shard = b.op("Shard", param, domain="memplan", world=world)
        p = graph.tensors[param]
        shard = (shard_size(p.size, world),)
        for s in state:
            tensors[s] = Tensor(s, shard, tensors[s].dtype, "state")
        for out in node.outputs:  # now of one shard: typed again
            tensors[out] = Tensor(out, None, None, "activation")
        updated = replace(node, inputs=(*node.inputs[:scalars], param_shard, grad_shard, *state))
        nodes += [*b.nodes[start:], updated]
        start = len(b.nodes)
        gathered = b.op("AllGather", node.outputs[0], domain="memplan", world=world, mean=0, shape=list(p.shape))
        nodes += b.nodes[start:]
        del updates[node.outputs[0]]
        updates[gathered] = param
    typed = shapes.retype(replace(graph, nodes=tuple(nodes), tensors={**tensors, **b.tensors},
                                  updates=tuple(updates.items())), graph)
    sent = sum(communicated(n, [typed.tensors[n.inputs[0]]]) for n in typed.nodes if n.domain == "memplan"
               and n.op in ("AllReduce", "ReduceScatter", "AllGather"))
    return Result(typed, True, {"parallel": {"dp": world, "zero": zero, "collective_bytes": sent}})


data_parallel = Pass("data_parallel", _data_parallel, needs=frozenset({TYPED, UPDATES}),
                     makes=frozenset({TYPED, UPDATES}), keeps=frozenset({LOSS, GRADIENTS}))
