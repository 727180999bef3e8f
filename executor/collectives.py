"""Process groups a data-parallel plan's collectives run in (planner.parallel): `rank`, `size`, and
all_reduce (in place, sum), reduce_scatter (sum of `x` over ranks, this rank's shard into `y`) and
all_gather (the ranks' shards `x` into `y`), on the backend's arrays.

`Single` is one rank alone. `TorchDistributed` runs them through torch.distributed's default group, as
`torchrun` or `init_process_group` set it up (gloo on the CPU; NCCL for CuPy arrays, passed by DLPack)."""
import numpy as np

from planner.errors import MemplanError


class Single:
    """A group of one rank: the collectives copy."""

    rank, size = 0, 1

    def all_reduce(self, x):
        pass

    def reduce_scatter(self, x, y):
        y[...] = x[:y.size]

    def all_gather(self, x, y):
        y[:x.size] = x


class TorchDistributed:
    """torch.distributed's default process group, initialized by the caller."""

    def __init__(self):
        import torch.distributed as dist
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized (torchrun, or init_process_group)")
        self.dist, self.rank, self.size = dist, dist.get_rank(), dist.get_world_size()

    @staticmethod
    def _tensor(x):
        """A torch tensor sharing `x`'s bytes."""
        import torch
        return torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.from_dlpack(x)

    def all_reduce(self, x):
        self.dist.all_reduce(self._tensor(x))

    def reduce_scatter(self, x, y):
        self.dist.reduce_scatter_tensor(self._tensor(y), self._tensor(x))

    def all_gather(self, x, y):
        self.dist.all_gather_into_tensor(self._tensor(y), self._tensor(x))


def group_for(plan, group):
    """The group a plan runs in: `group` when given, else one rank alone for a plan of one rank, else
    torch.distributed's when initialized; a group of another size than the plan's is an error."""
    world = (plan.training.get("parallel") or {}).get("dp", 1)
    if group is None and world > 1:
        try:
            group = TorchDistributed()
        except (ImportError, RuntimeError) as e:
            raise MemplanError(f"the plan is one of {world} data-parallel ranks; run it in a process group of "
                               f"{world} (torchrun, or torch.distributed.init_process_group): {e}") from None
    group = group or Single()
    if group.size != world:
        raise MemplanError(f"the plan is one of {world} data-parallel ranks, the process group has {group.size}")
    return group


def shards(plan, values, group):
    """The values to load into a rank's arena: under ZeRO-3, this rank's shard of each sharded param's
    whole value (flattened, the last shard zero-padded); the others as they are."""
    sharded = set((plan.training.get("parallel") or {}).get("sharded", ()))
    if not sharded:
        return values
    out = dict(values)
    for name in sharded & set(values):
        flat = np.asarray(values[name]).reshape(-1)
        out[name] = cut(flat, group.rank, np.empty(plan.tensors[name].shape[0], flat.dtype))
    return out


def cut(flat, rank, shard):
    """`shard` = rank `rank`'s run of the flattened tensor `flat` (shard.size elements a rank), zeros past
    its end; NumPy or CuPy arrays. Returns `shard`."""
    own = flat[rank * shard.size:(rank + 1) * shard.size]
    shard[:own.size] = own
    shard[own.size:] = 0
    return shard
