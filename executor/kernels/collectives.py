"""Collective kernels (memplan.AllReduce, ReduceScatter, AllGather, Shard, ParallelInput, Send, Recv; rules in
planner/ops/collectives.py). A collective kernel takes one more argument, the process group its step's
`group` names (executor/collectives.py), bound when the executor binds the step."""
from planner.ops.collectives import runs

from ..collectives import cut
from . import kernel
from .shape_ops import view

kernel("ParallelInput", domain="memplan")(view)


def collective(op):
    """Register `fn(xp, step, ins, outs, ws, group)` as the kernel of memplan `op`, marked to take the group."""
    def register(fn):
        fn.collective = True
        return kernel(op, domain="memplan")(fn)
    return register


def _mean(xp, step, y, group):
    if step.attrs["mean"] and group.size > 1:
        xp.multiply(y, y.dtype.type(1 / group.size), out=y)


@collective("AllReduce")
def all_reduce(xp, step, ins, outs, ws, group):
    y = outs[0]
    if y is not ins[0]:
        xp.copyto(y, ins[0])
    group.all_reduce(y)
    _mean(xp, step, y, group)


def _by_rank(step, whole, group):
    """The whole tensor `whole` of a collective along a dim (planner.ops.collectives.runs) viewed as (world, outer,
    inner): each rank's runs one after the other."""
    outer, inner = runs(step.attrs, whole.shape, group.size)
    return whole.reshape(outer, group.size, inner).transpose(1, 0, 2)


@collective("ReduceScatter")
def reduce_scatter(xp, step, ins, outs, ws, group):
    x, y = ins[0].reshape(-1), outs[0].reshape(-1)
    if "by_rank" in ws:  # along a dim whose ranks' runs are not one piece each: summed from a rank-major copy
        whole, x = _by_rank(step, ins[0], group), ws["by_rank"]
        xp.copyto(x.reshape(whole.shape), whole)
    elif "padded" in ws:
        full = ws["padded"]
        xp.copyto(full[:x.size], x)
        full[x.size:] = 0
        x = full
    group.reduce_scatter(x, y)
    _mean(xp, step, y, group)


@collective("AllGather")
def all_gather(xp, step, ins, outs, ws, group):
    x, y = ins[0].reshape(-1), outs[0].reshape(-1)
    if "by_rank" in ws:  # along a dim whose ranks' runs are not one piece each: gathered rank-major, then placed
        group.all_gather(x, ws["by_rank"])
        whole = _by_rank(step, outs[0], group)
        xp.copyto(whole, ws["by_rank"].reshape(whole.shape))
    elif "padded" in ws:
        group.all_gather(x, ws["padded"])
        xp.copyto(y, ws["padded"][:y.size])
    else:
        group.all_gather(x, y)


@collective("Shard")
def shard(xp, step, ins, outs, ws, group):
    if "axis" in step.attrs:
        mine = _by_rank(step, ins[0], group)[group.rank]
        xp.copyto(outs[0].reshape(mine.shape), mine)
    else:
        cut(ins[0].reshape(-1), group.rank, outs[0])


@collective("Send")
def send(xp, step, ins, outs, ws, group):
    group.send(ins[0], step.attrs["peer"], step.attrs["tag"])


@collective("Recv")
def recv(xp, step, ins, outs, ws, group):
    group.recv(outs[0], step.attrs["peer"], step.attrs["tag"])
