"""Offset assignment in one arena: every algorithm is a function over plain intervals,

    allocate(name, sizes, starts, ends, alignment=256, **options) -> (offsets, total)

with lifetimes inclusive (`starts[i] <= step <= ends[i]`). Two intervals that share a step
never overlap in bytes; offsets are multiples of `alignment`. Algorithms register with
`@allocator("name")`; an unknown name lists the choices.
"""
import numpy as np

from ..errors import PlanError

ALLOCATORS = {}


def allocator(name):
    """Register `fn(sizes, starts, ends, alignment, **options) -> (offsets, total)` under `name`."""
    def register(fn):
        ALLOCATORS[name] = fn
        return fn
    return register


def align(n, alignment=256):
    """`n` rounded up to a multiple of `alignment`."""
    return -(-int(n) // alignment) * alignment


def allocate(name, sizes, starts, ends, alignment=256, **options):
    """Offsets (a list of ints) and the arena's total bytes for intervals of `sizes` bytes."""
    if name not in ALLOCATORS:
        raise PlanError(f"unknown allocator {name!r}; choose one of {', '.join(sorted(ALLOCATORS))}")
    sizes, starts, ends = (list(map(int, a)) for a in (sizes, starts, ends))
    if not len(sizes) == len(starts) == len(ends):
        raise PlanError(f"sizes, starts and ends differ in length ({len(sizes)}, {len(starts)}, {len(ends)})")
    bad = next((i for i in range(len(sizes)) if sizes[i] < 0 or starts[i] > ends[i]), None)
    if bad is not None:
        raise PlanError(f"interval {bad}: size {sizes[bad]} over steps [{starts[bad]}, {ends[bad]}] is not valid")
    offsets, total = ALLOCATORS[name]([align(s, alignment) for s in sizes], starts, ends, alignment, **options)
    return [int(o) for o in offsets], int(total)


def lower_bound(sizes, starts, ends, alignment=256):
    """LOAD: the largest sum of (aligned) live bytes at any step; no placement can use less."""
    if not len(sizes):
        return 0
    sizes = np.array([align(s, alignment) for s in sizes], dtype=np.int64)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    delta = np.zeros(int(ends.max()) + 2, dtype=np.int64)
    np.add.at(delta, starts, sizes)
    np.add.at(delta, ends + 1, -sizes)
    return int(np.cumsum(delta).max())


from . import naive, share, bestfit, optimal, exact, baselines  # noqa: E402,F401  (register the algorithms)
