"""Collectives as ops of a rank's plan (memplan's own, outside ONNX): the data-parallel gradient
reduction, the shards of ZeRO, the all-reduces of tensor parallelism and the sends and receives between
pipeline stages (planner.parallel). Each rank runs the same plan; which shard is its own, and the other
ranks, the executor's process groups say when running: a collective's `group` names which ("dp": the
data-parallel ranks, "tp": the tensor-parallel ones, "pp": the stages, "world": all of them). A tensor of n
elements split
over `world` ranks in whole runs of `unit` elements (a row of its first dim under FSDP2's sharding, else one)
has shards of shard_size(n, world, unit) elements, the last ones padded with zeros.

With an `axis` attribute (sequence parallelism's), ReduceScatter, AllGather and Shard keep the tensor's shape
but for that dim, which a rank holds 1/world of: the dim is `blocks` consecutive blocks (1, or the batch rows
where the tokens are merged with the batch in one dim), each of the ranks' runs in rank order (`runs`), so that
Megatron's all-gathers and reduce-scatters of the sequence hold their own bytes and no padding."""
import math

import numpy as np

from .registry import schema
from .. import dtypes
from .base import FLOATS, Layout, Schema, no_gradient, same_as_input
from .views import View
from ..errors import ShapeError
from ..parallel import shard_size


class _Collective(Schema):
    """Over `world` ranks; `mean` divides a sum by world (the gradients of a mean loss); shards in whole
    `unit`s of elements."""

    types = (("T",), {"T": FLOATS})
    defaults = {"world": 1, "mean": 1, "unit": 1, "group": "dp"}
    mirror = False

    @staticmethod
    def world(node):
        world = node.attrs.get("world", 1)
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ShapeError(f"world must be an int >= 1, got {world!r}")
        return world

    def shard(self, node, elements):
        """The elements of one rank's shard of a tensor of `elements`."""
        unit = node.attrs.get("unit", 1)
        if isinstance(unit, bool) or not isinstance(unit, int) or unit < 1 or elements % unit:
            raise ShapeError(f"unit must be an int >= 1 that divides the {elements} elements, got {unit!r}")
        return shard_size(elements, self.world(node), unit)

    def along(self, node, shape, gathers):
        """The output shape of a collective along dim `axis` (see the module) reading `shape`: that dim times world
        where it `gathers`, else divided by world; None without `axis` (the flat shards)."""
        axis, blocks, world = node.attrs.get("axis"), node.attrs.get("blocks", 1), self.world(node)
        if axis is None:
            return None
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(shape):
            raise ShapeError(f"axis must be a dim of the {len(shape)}-D input, got {axis!r}")
        whole = shape[axis] * world if gathers else shape[axis]
        if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1 or whole % (blocks * world):
            raise ShapeError(f"dim {axis} of {whole} does not hold blocks={blocks!r} blocks of {world} equal runs")
        return (*shape[:axis], whole if gathers else whole // world, *shape[axis + 1:])

    def by_rank(self, node, shape, dtype):
        """The Layout of the rank-major copy of the whole tensor of `shape` that a collective along a dim works in
        where the ranks' runs are not each one piece (several blocks, or dims before `axis`); none where they are."""
        outer, _ = runs(node.attrs, shape, self.world(node))
        return Layout.pack(("by_rank", (math.prod(shape),), dtype)) if outer > 1 else Layout()

    def padded(self, node, elements, dtype):
        """The Layout of a padded (world * shard) copy where `elements` do not split evenly; none where
        they do (the tensor's own bytes serve)."""
        whole = self.world(node) * self.shard(node, elements)
        return Layout.pack(("padded", (whole,), dtype)) if whole != elements else Layout()


@schema("AllReduce", domain="memplan")
class AllReduce(_Collective):
    """Y = the sum over ranks of X (over world with `mean`), in X's bytes where planned in place."""

    inplace = ((0, 0),)
    infer = staticmethod(same_as_input)

    def gradient(self, b, node, dys):
        """Over tensor-parallel ranks dY itself (Megatron's g): the sum's readers on every rank compute alike (a
        region's output), so each rank holds the whole dY, which is dX. Over data-parallel ranks, each of which
        differentiates its own loss (synchronised batch statistics), the same reduction of the ranks' dY, the
        sum's adjoint (SyncBatchNorm's backward all-reduces its gradient sums alike)."""
        if self.attr(node, "group") != "dp":
            return [dys[0]]
        return [b.op("AllReduce", dys[0], domain="memplan", world=self.world(node), mean=self.attr(node, "mean"),
                     group="dp")]


@schema("ParallelInput", domain="memplan")
class ParallelInput(View):
    """Y = X, where a tensor-parallel region reads X (Megatron's f): each rank's region sees only its
    piece of the layers, so dX sums the ranks' parts: the gradient is all-reduced over the `world` ranks
    of `group`."""

    defaults = {"world": 1, "group": "tp"}
    types = (("T",), {"T": FLOATS})

    def view_shape(self, node, shape):
        return shape

    def gradient(self, b, node, dys):
        return [b.op("AllReduce", dys[0], domain="memplan", world=self.attr(node, "world"), mean=0,
                     group=self.attr(node, "group"))]


@schema("ReduceScatter", domain="memplan")
class ReduceScatter(_Collective):
    """Y (shard,) = this rank's shard of the sum over ranks of X flattened (over world with `mean`); with `axis`,
    Y = this rank's runs of the sum along that dim (Megatron's reduce-scatter of the sequence)."""

    def infer(self, node, ins):
        return [(self.along(node, ins[0].shape, False) or (self.shard(node, math.prod(ins[0].shape)),), ins[0].dtype)]

    def workspace(self, node, ins, outs, limit):
        if "axis" in node.attrs:
            return self.by_rank(node, ins[0].shape, ins[0].dtype)
        return self.padded(node, math.prod(ins[0].shape), ins[0].dtype)

    def gradient(self, b, node, dys):
        """Along a dim, the ranks' dY all-gathered: each rank's X adds to every rank's runs."""
        if "axis" not in node.attrs or self.attr(node, "mean"):
            return no_gradient(node)
        return [b.op("AllGather", dys[0], domain="memplan", **_along(self, node))]


@schema("AllGather", domain="memplan")
class AllGather(_Collective):
    """Y of `shape` = the ranks' shards X (shard,) one after the other, the padding cut off; with `axis`, Y = the
    ranks' runs X along that dim (Megatron's all-gather of the sequence), whose gradient is this rank's runs of
    dY where its readers compute alike on every rank, or where they each compute a part (`partial` 1: a
    tensor-parallel region reads Y), of the ranks' dY summed: reduce-scattered (Megatron's g-bar)."""

    defaults = {**_Collective.defaults, "shape": None}

    def infer(self, node, ins):
        along = self.along(node, ins[0].shape, True)
        if along:
            return [(along, ins[0].dtype)]
        shape = tuple(node.attrs.get("shape") or ())
        if ins[0].rank != 1 or ins[0].shape[0] != self.shard(node, math.prod(shape)):
            raise ShapeError(f"AllGather of shards {ins[0].shape} does not make shape {shape} over "
                             f"{self.world(node)} ranks")
        return [(shape, ins[0].dtype)]

    def workspace(self, node, ins, outs, limit):
        if "axis" in node.attrs:
            return self.by_rank(node, outs[0][0], ins[0].dtype)
        return self.padded(node, math.prod(outs[0][0]), ins[0].dtype)

    def gradient(self, b, node, dys):
        """Along a dim, this rank's runs of dY, reduce-scattered where `partial` (see the class)."""
        if "axis" not in node.attrs:
            return no_gradient(node)
        if node.attrs.get("partial", 0):
            return [b.op("ReduceScatter", dys[0], domain="memplan", **_along(self, node))]
        return [b.op("Shard", dys[0], domain="memplan", **_along(self, node))]

    def flops(self, node, ins, outs):
        return 0


@schema("Shard", domain="memplan")
class Shard(_Collective):
    """Y (shard,) = this rank's shard of X flattened, zero-padded; with `axis`, this rank's runs of X along that
    dim (Megatron's scatter of the sequence): no communication."""

    def infer(self, node, ins):
        return [(self.along(node, ins[0].shape, False) or (self.shard(node, math.prod(ins[0].shape)),), ins[0].dtype)]

    def gradient(self, b, node, dys):
        """The ranks' dY gathered (a weight each rank of a tensor-parallel region reads a piece of; along a dim,
        the sequence each rank's layers read their runs of)."""
        if "axis" in node.attrs:
            return [b.op("AllGather", dys[0], domain="memplan", **_along(self, node))]
        return [b.op("AllGather", dys[0], domain="memplan", world=self.world(node), mean=0,
                     unit=self.attr(node, "unit"), group=self.attr(node, "group"), shape=list(b.shape(node.inputs[0])))]

    def flops(self, node, ins, outs):
        return 0


@schema("Send", domain="memplan")
class Send(Schema):
    """X sent to pipeline stage `peer` under `tag` (which the matching Recv names): no output, the send an
    effect. The executor hands the communication library a copy, so that X's bytes are free at once."""

    defaults = {"peer": 0, "tag": 0, "group": "pp"}
    types = (("T",), {"T": FLOATS | {f"tensor({t})" for t in ("int8", "int16", "int32", "int64", "uint8", "bool")}})
    """Floats, and the integers and masks a stage's boundary may carry (a mixture of experts' routing indices)."""
    effect = True
    mirror = False

    def infer(self, node, ins):
        return []

    def flops(self, node, ins, outs):
        return 0


@schema("Recv", domain="memplan")
class Recv(Schema):
    """Y of `shape` and `dtype` (ONNX's number) received from pipeline stage `peer` under `tag`."""

    defaults = {"peer": 0, "tag": 0, "shape": None, "dtype": 1, "group": "pp"}
    mirror = False
    replayable = False

    def infer(self, node, ins):
        return [(tuple(node.attrs.get("shape") or ()), dtypes.from_onnx(self.attr(node, "dtype")))]

    def flops(self, node, ins, outs):
        return 0


def runs(attrs, shape, world):
    """(outer, inner): a collective along dim attrs["axis"] of a whole tensor of `shape` views it as (outer, world,
    inner), rank r's part being [:, r]: its runs of each of the dim's `blocks` blocks, under the dims before."""
    outer = math.prod(shape[:attrs["axis"]]) * attrs.get("blocks", 1)
    return outer, math.prod(shape) // (outer * world)


def _along(schema, node):
    """The attributes of a collective along the same runs as `node`'s, over the same ranks."""
    return {"world": schema.world(node), "mean": 0, "axis": node.attrs["axis"], "blocks": node.attrs.get("blocks", 1),
            "group": schema.attr(node, "group")}


def communicated(node, ins):
    """Bytes one rank sends in a collective step (0 for Shard and Recv): a ring's all-reduce sends about twice
    the tensor, a reduce-scatter or all-gather about once, a Send the tensor."""
    elements, itemsize = math.prod(ins[0].shape), np.dtype(ins[0].dtype).itemsize
    world = node.attrs.get("world", 1)
    share = (world - 1) / world
    factor = {"AllReduce": 2 * share, "ReduceScatter": share, "AllGather": share * world, "Send": 1}.get(node.op, 0)
    return int(factor * elements * itemsize)


COLLECTIVES = ("AllReduce", "ReduceScatter", "AllGather")


def sent_by_group(nodes, tensors):
    """{group: bytes one rank sends} over the collective `nodes` (Nodes or a plan's Steps) among `nodes`, their
    input tensors typed in `tensors` (a graph's or a plan's, by name)."""
    sent = {}
    for n in nodes:
        if n.domain == "memplan" and n.op in COLLECTIVES:
            group = n.attrs.get("group", "dp")
            sent[group] = sent.get(group, 0) + communicated(n, [tensors[n.inputs[0]]])
    return sent
