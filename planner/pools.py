"""Baselines for a static plan: MXNet's dynamic GPU memory pools (MXNET_GPU_MEM_POOL_TYPE) replayed on
the plan's own schedule. (What a run takes when nothing is ever freed is the `naive` strategy's arena.)

A pool rounds each request up to a block size, hands out a cached free block of exactly that size when
it has one, else takes a new block from the device (a cache miss), and never gives memory back; so it
holds, for each block size, as many blocks as were ever live at once. Sizes follow MXNet 2.0's
src/storage/pooled_storage_manager.h (RoundMultiple for Naive, RoundPower2 for Round).
"""
from dataclasses import dataclass

from .allocators import align
from .config import Config
from .errors import PlanError


@dataclass(frozen=True)
class PoolRun:
    """One pool replayed over a plan: the most it held from the device (what the GPU must have), the most its
    live blocks took, and its cache misses; persistent bytes are counted once in both byte totals."""

    pool: str
    reserved_bytes: int
    in_use_bytes: int
    device_allocs: int


def naive_block(nbytes, config):
    """MXNet's Naive pool: up to a multiple of the page size, and above the large-alloc round size up to
    a multiple of that (so that large blocks fill whole driver slabs)."""
    size = align(nbytes, config.pool_page_size)
    return align(size, config.pool_round_size) if size > config.pool_round_size else size


def round_block(nbytes, config):
    """MXNet's Round pool: up to a power of two (at least the page size), and above 2**cutoff up to a
    multiple of 2**cutoff, so that blocks of near sizes share one free list."""
    linear = 1 << config.pool_round_linear_cutoff
    return align(nbytes, linear) if nbytes > linear else max(1 << (nbytes - 1).bit_length(), config.pool_page_size)


POOLS = {"naive": naive_block, "round": round_block}


def simulate(plan, pool=None, config=None):
    """Replay `plan`'s transient buffers through MXNet's `pool` ("naive" or "round"; default
    MXNET_GPU_MEM_POOL_TYPE): each taken at its first step, after the buffers of earlier steps are back."""
    config = config or Config.from_env()
    pool = (pool or config.pool_type).lower()
    if pool not in POOLS:
        raise PlanError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
    events = []
    for root, (first, last) in plan.buffer_spans().items():
        if plan.tensors[root].nbytes:
            size = POOLS[pool](plan.tensors[root].nbytes, config)
            events += [(first, False, size), (last, True, size)]
    cached, device, in_use, peak, misses = {}, 0, 0, 0, 0
    for _, freed, size in sorted(events):
        if freed:
            cached[size] += 1
            in_use -= size
            continue
        if cached.get(size):
            cached[size] -= 1
        else:
            device, misses, cached[size] = device + size, misses + 1, 0
        in_use += size
        peak = max(peak, in_use)
    persistent = plan.stats["persistent_bytes"]
    return PoolRun(pool, persistent + device, persistent + peak, misses)

