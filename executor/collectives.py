"""Process groups a parallel plan's collectives run in (planner.parallel): `rank`, `size`, and
all_reduce (in place, sum), reduce_scatter (sum of `x` over ranks, this rank's shard into `y`),
all_gather (the ranks' shards `x` into `y`), send (`x` to rank `peer` under `tag`, from a copy, so that it
returns at once), recv (into `y`) and flush (wait for the sends), on the backend's arrays;
`subgroup(partition)` is this rank's group among a partition of the group's ranks.

`Single` is one rank alone. `TorchDistributed` runs them through torch.distributed's default group (or a
group made from it), as `torchrun` or `init_process_group` set it up (gloo on the CPU; NCCL for CuPy arrays,
passed by DLPack)."""
import ml_dtypes
import numpy as np

from planner.errors import MemplanError
from planner.parallel import piece


class Single:
    """A group of one rank: the collectives copy."""

    rank, size = 0, 1

    def all_reduce(self, x):
        pass

    def reduce_scatter(self, x, y):
        y[...] = x[:y.size]

    def all_gather(self, x, y):
        y[:x.size] = x

    def subgroup(self, partition):
        return self

    def send(self, x, peer, tag):
        raise MemplanError("a rank alone has no pipeline stage to send to")

    recv = send

    def flush(self):
        pass


class TorchDistributed:
    """torch.distributed's default process group, initialized by the caller, or the group `handle` made
    from it."""

    def __init__(self, handle=None):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized (torchrun, or init_process_group)")
        self.dist, self.handle, self.pending = dist, handle, []
        self.rank, self.size = dist.get_rank(handle), dist.get_world_size(handle)

    def subgroup(self, partition):
        """This rank's group among `partition` (lists of the default group's ranks): every list is made a
        group on every rank, in one order, as torch.distributed.new_group requires."""
        mine = self
        for ranks in partition:
            handle = self.dist.new_group(ranks)
            if self.dist.get_rank() in ranks:
                mine = TorchDistributed(handle)
        return mine

    @staticmethod
    def _tensor(x):
        """A torch tensor sharing `x`'s bytes (ml_dtypes' bfloat16, which torch cannot take from NumPy, through
        its int16 view)."""
        import torch
        if not isinstance(x, np.ndarray):
            return torch.from_dlpack(x)
        if x.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(x)

    def all_reduce(self, x):
        self.dist.all_reduce(self._tensor(x), group=self.handle)

    def reduce_scatter(self, x, y):
        self.dist.reduce_scatter_tensor(self._tensor(y), self._tensor(x), group=self.handle)

    def all_gather(self, x, y):
        self.dist.all_gather_into_tensor(self._tensor(y), self._tensor(x), group=self.handle)

    def send(self, x, peer, tag):
        copy = self._tensor(x).clone()
        self.pending.append((self.dist.isend(copy, self._global(peer), tag=tag), copy))

    def recv(self, y, peer, tag):
        self.dist.recv(self._tensor(y), self._global(peer), tag=tag)

    def flush(self):
        for work, _ in self.pending:
            work.wait()
        self.pending = []

    def _global(self, rank):
        """The default group's number of this group's rank `rank`."""
        return rank if self.handle is None else self.dist.get_global_rank(self.handle, rank)


def layout(plan):
    """(dp, tp, pp): the data-parallel, tensor-parallel and pipeline ranks of the step `plan` is one of."""
    training = plan.training or {}
    return ((training.get("parallel") or {}).get("dp", 1), (training.get("tensor_parallel") or {}).get("tp", 1),
            (training.get("pipeline") or {}).get("pp", 1))


def groups_for(plan, group):
    """{"world", "dp", "tp", "pp"}: the groups a plan's collectives run in. "world" is `group` when given,
    else one rank alone for a plan of one rank, else torch.distributed's when initialized; a group of another
    size than the plan's ranks, or a rank of another pipeline stage than the plan's, is an error. "dp", "tp"
    and "pp" are this rank's subgroups of it (planner.parallel numbers the ranks: (stage * dp + dp rank) * tp
    + tp rank)."""
    dp, tp, pp = layout(plan)
    world, what = dp * tp * pp, _ranks(dp, tp, pp)
    if group is None and world > 1:
        try:
            group = TorchDistributed()
        except (ImportError, RuntimeError) as e:
            raise MemplanError(f"the plan is one of {what}; run it in a process group of {world} (torchrun, or "
                               f"torch.distributed.init_process_group): {e}") from None
    group = group or Single()
    if group.size != world:
        raise MemplanError(f"the plan is one of {what}, the process group has {group.size}")

    def rank(s, d, t):
        return (s * dp + d) * tp + t

    partitions = {"tp": [[rank(s, d, t) for t in range(tp)] for s in range(pp) for d in range(dp)],
                  "dp": [[rank(s, d, t) for d in range(dp)] for s in range(pp) for t in range(tp)],
                  "pp": [[rank(s, d, t) for s in range(pp)] for d in range(dp) for t in range(tp)]}
    groups = {"world": group}
    for name, partition in partitions.items():
        groups[name] = group if len(partition) == 1 else Single() if len(partition[0]) == 1 else \
            group.subgroup(partition)
    stage = (plan.training.get("pipeline") or {}).get("stage", 0)
    if groups["pp"].rank != stage:
        raise MemplanError(f"the plan is pipeline stage {stage}'s; rank {group.rank} runs stage {groups['pp'].rank} "
                           "(compile each rank's stage: Parallel(stage=...))")
    return groups


def _ranks(dp, tp, pp):
    parts = [f"{n} {what}" for n, what in ((dp, "data-parallel"), (tp, "tensor-parallel"), (pp, "pipeline"))
             if n > 1]
    return " x ".join(parts or ["1"]) + " ranks"


def stage_feeds(plan, feeds):
    """The feeds of a pipeline stage's plan from the step's: each input it reads, and of each input its
    microbatches read (NAME@j), the j-th run of rows of its whole value; the step's other feeds dropped."""
    pipeline = (plan.training or {}).get("pipeline")
    if not pipeline:
        return feeds
    out = {}
    for name in plan.inputs:
        base, _, j = name.rpartition("@")
        if base and j.isdigit() and base in feeds and name not in feeds:
            rows = plan.tensors[name].shape[0]
            out[name] = feeds[base][int(j) * rows:(int(j) + 1) * rows]
        elif name in feeds:
            out[name] = feeds[name]
    return out


def shards(plan, values, groups):
    """The values to load into a rank's arena: this rank's piece of each param tensor parallelism splits,
    and under ZeRO-3 its shard of each sharded param (flattened, the last shard zero-padded), an offloaded
    optimizer's master weights cut as their params are; the others as they are."""
    split = dict((plan.training.get("tensor_parallel") or {}).get("split", {}))
    sharded = set((plan.training.get("parallel") or {}).get("sharded", ()))
    offload = plan.training.get("offload") or {}
    split.update((master, split[param]) for param, master in offload.get("masters", {}).items() if param in split)
    sharded.update(offload.get("sharded", ()))
    out = dict(values)
    for name, (dim, blocks) in split.items():
        if name in values:
            out[name] = piece(np.asarray(values[name]), dim, blocks, groups["tp"].rank, groups["tp"].size)
    for name in sharded & set(values):
        flat = np.asarray(out[name]).reshape(-1)
        out[name] = cut(flat, groups["dp"].rank, np.empty(plan.tensors[name].shape[0], flat.dtype))
    return out


def cut(flat, rank, shard):
    """`shard` = rank `rank`'s run of the flattened tensor `flat` (shard.size elements a rank), zeros past
    its end; NumPy or CuPy arrays. Returns `shard`."""
    own = flat[rank * shard.size:(rank + 1) * shard.size]
    shard[:own.size] = own
    shard[own.size:] = 0
    return shard
