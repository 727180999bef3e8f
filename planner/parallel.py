"""Parallel training plans: what one rank holds when a step is spread over ranks. Data parallelism: each of
`dp` ranks trains on its share of the batch and the ranks combine their gradients with collectives
(DeepSpeed's ZeRO stages, PyTorch's DDP and FSDP's SHARD_GRAD_OP).

- zero 0 (DDP): every rank keeps the whole model state; each gradient is all-reduced (mean).
- zero 1: the optimizer state is sharded: a rank keeps and updates 1/dp of each parameter's state and
  elements, then all-gathers the updated parameter.
- zero 2: the gradients too: each is reduce-scattered, so a rank holds only its shard of it once reduced.
- zero 3 (FSDP's FULL_SHARD, one unit per parameter): the parameters too: a rank keeps its shard of each,
  all-gathers it before the forward pass reads it and again before the backward pass does.

Every rank runs the same plan (the shards have one size, the last one padded); which shard is its own
the rank reads from its process group when running (under ZeRO-3 it cuts its shard of each parameter's
value when the executor loads it). A shard is a run of the flattened tensor's elements: `shard="flat"`
splits them evenly (DeepSpeed), `shard="dim0"` in whole rows of the first dim, as PyTorch's FSDP2
(`fully_shard`) shards each parameter: ceil(rows / dp) rows a rank, the last ones padded. Gradients are
reduced one by one or in buckets.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits the linear layers of transformer blocks over
`tp` ranks of one group (planner/passes/tensor_parallel.py): each rank holds a piece of each split weight
(`piece`), the ranks' pieces joined again by `joined`; with `sequence_parallel` (Megatron-LM's sequence
parallelism, Korthikanti et al. 2022) the norms, residual adds and dropouts between those layers run on 1/tp of
the sequence on each rank (planner/passes/sequence_parallel.py). Pipeline parallelism cuts the step into `pp`
stages that run `microbatches` in 1F1B order (planner/pipeline.py, planner/passes/pipeline_stage.py); a plan is one
stage's. Ranks are numbered as Megatron numbers them, tensor parallel innermost, pipeline stages outermost:
global rank = (stage * dp + dp rank) * tp + tp rank.
"""
import itertools
import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

STAGES = (0, 1, 2, 3)
SHARDS = ("flat", "dim0")


@dataclass(frozen=True)
class Parallel:
    """How a training step is spread: `dp` data-parallel ranks at ZeRO stage `zero` (0 to 3), each tensor's
    shards cut by `shard` ("flat" or "dim0", see the module). Under ZeRO-3 each parameter's all-gather is
    issued `prefetch` gathers ahead of its first reader in each pass (FSDP's prefetching: the gather overlaps
    the compute before it, and its whole value lives that much longer); 0 gathers right before the reader.
    `bucket_bytes` packs the gradients, in the order the backward pass makes them, into buckets of at least
    that many bytes (the last one smaller), each reduced as one tensor once its last gradient is made:
    all-reduced under ZeRO-0 and 1 (PyTorch DDP's bucket_cap_mb, DeepSpeed's allreduce_bucket_size),
    reduce-scattered under 2 and 3 in FSDP2's layout (each gradient's shards side by side, one row a rank;
    DeepSpeed's reduce_bucket_size); 0 reduces each gradient alone. `tp` ranks split each transformer block's
    linear layers and attention heads (Megatron's tensor parallelism). `pp` stages run the layers in turn
    (pipeline parallelism, planner.pipeline), each step's batch in `microbatches` (the batch planned is one
    microbatch's; with pp 1, gradient accumulation), and the plan is stage `stage`'s. A step's ranks are
    dp * tp * pp. BatchNormalization normalises each data rank's rows by their own statistics (DDP's), unless
    `sync_batchnorm`: then by those of the whole batch of the dp ranks, all-reduced (PyTorch's SyncBatchNorm;
    planner/passes/sync_batchnorm.py). `sequence_parallel` (with tp > 1) runs what tensor parallelism leaves
    whole in each layer (norms, residual adds, dropouts) on 1/tp of the sequence on each rank: Megatron-LM's
    sequence parallelism, its all-reduces become reduce-scatters and all-gathers along the sequence."""

    dp: int = 1
    zero: int = 0
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    stage: int = 0
    shard: str = "flat"
    prefetch: int = 0
    bucket_bytes: int = 0
    sync_batchnorm: bool = False
    sequence_parallel: bool = False

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "microbatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"parallel {name} must be an int >= 1, got {value!r}")
        if self.zero not in STAGES or isinstance(self.zero, bool):
            raise ConfigError(f"parallel zero must be one of {', '.join(map(str, STAGES))}, got {self.zero!r}")
        if self.shard not in SHARDS:
            raise ConfigError(f"parallel shard must be one of {', '.join(SHARDS)}, got {self.shard!r}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ConfigError(f"parallel prefetch must be an int >= 0, got {self.prefetch!r}")
        if self.prefetch and self.zero != 3:
            raise ConfigError(f"parallel prefetch applies to ZeRO-3, which gathers the params; zero is {self.zero}")
        if self.shard != "flat" and self.zero == 0:
            raise ConfigError("parallel shard applies from ZeRO-1 on; zero 0 shards nothing")
        if isinstance(self.bucket_bytes, bool) or not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 0:
            raise ConfigError(f"parallel bucket_bytes must be an int >= 0, got {self.bucket_bytes!r}")
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or not 0 <= self.stage < self.pp:
            raise ConfigError(f"parallel stage must be an int from 0 to pp - 1 = {self.pp - 1}, got {self.stage!r}")
        if self.pp > 1 and self.zero > 1:
            raise ConfigError(f"ZeRO-{self.zero} shards the gradients, which pipeline stages accumulate over their "
                              "microbatches (DeepSpeed refuses it too): use zero 0 or 1 with pp > 1")
        if not isinstance(self.sync_batchnorm, bool):
            raise ConfigError(f"parallel sync_batchnorm must be True or False, got {self.sync_batchnorm!r}")
        if self.sync_batchnorm and self.dp == 1:
            raise ConfigError("parallel sync_batchnorm shares batch statistics among the data-parallel ranks: it "
                              "applies with dp > 1")
        if not isinstance(self.sequence_parallel, bool):
            raise ConfigError(f"parallel sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("parallel sequence_parallel shards the sequence among the tensor-parallel ranks: it "
                              "applies with tp > 1")
        if self.microbatches > 1 and self.zero == 3:
            raise ConfigError("ZeRO-3 gathers each param once a pass, not once a microbatch: plan microbatches under "
                              "zero 0 to 2")

    def unit(self, shape):
        """The elements a shard of a tensor of `shape` is a whole number of: a row of the first dim under
        shard="dim0", one element under "flat"."""
        return max(1, math.prod(shape[1:])) if self.shard == "dim0" and len(shape) > 1 else 1

    @property
    def world(self):
        """The ranks of one step: dp * tp * pp."""
        return self.dp * self.tp * self.pp


def piece(value, dim, groups, rank, world):
    """Rank `rank`'s piece of `value` split over `world` ranks on `dim`, which holds consecutive blocks: `groups`
    equal ones (a fused QKV weight's three), or of the sizes `groups` lists (grouped-query q, k and v): the rank's
    1/world of each block, side by side."""
    bounds = np.cumsum([0, *_sizes(value.shape[dim], groups)])
    mine = [np.take(value, np.arange(a + rank * (b - a) // world, a + (rank + 1) * (b - a) // world), axis=dim)
            for a, b in itertools.pairwise(bounds)]
    return np.ascontiguousarray(np.concatenate(mine, axis=dim))


def joined(pieces, dim, groups):
    """The value whose pieces (by rank, see `piece`) are `pieces`."""
    sizes = [size // len(pieces) for size in _sizes(pieces[0].shape[dim] * len(pieces), groups)]
    parts = [np.split(p, np.cumsum(sizes)[:-1], axis=dim) for p in pieces]
    return np.concatenate([part for block in zip(*parts) for part in block], axis=dim)


def _sizes(size, groups):
    """The sizes of the blocks of a dim of `size`: `groups` equal ones, or those `groups` lists."""
    return [size // groups] * groups if isinstance(groups, int) else list(groups)


def shard_size(elements, world, unit=1):
    """The elements of one rank's shard of a tensor of `elements` split over `world` ranks in whole `unit`s
    (the last shards padded with zeros to it)."""
    return math.ceil(math.ceil(elements / unit) / world) * unit


def model_states(values, param_bytes, state_bytes, dp, zero):
    """{"params", "gradients", "optimizer"}: the bytes of each that one of `dp` ranks holds at ZeRO stage
    `zero` by the ZeRO paper's count (Rajbhandari et al. 2020; DeepSpeed's estimators): `values` trained
    values of `param_bytes` each, gradients of the same type, `state_bytes` of optimizer state per value;
    each sharded part is 1/dp of the whole (the paper's count, no padding)."""
    whole = {"params": values * param_bytes, "gradients": values * param_bytes, "optimizer": values * state_bytes}
    sharded = {0: (), 1: ("optimizer",), 2: ("optimizer", "gradients")}.get(zero, tuple(whole))
    return {part: size / dp if part in sharded else size for part, size in whole.items()}


class Whole:
    """The value of a param split over ranks (ZeRO-3's shards, tensor parallelism's pieces): typed as one
    rank's part (`shape`, `dtype`, `size`, so that planning sees the bytes the rank holds) while holding the
    whole value (`np.asarray` gives it), which each rank cuts its own part of when the executor loads it."""

    def __init__(self, value, shard):
        self.value, self.shape, self.dtype = value, tuple(shard), np.dtype(value.dtype)
        self.size = math.prod(self.shape)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.value, dtype=dtype)


def whole_value(value):
    """The whole value a rank's part stands for (a Whole, perhaps of a Whole), or `value` itself."""
    while isinstance(value, Whole):
        value = value.value
    return value
