"""No sharing: every interval gets its own block, laid out one after another (the baseline)."""
from itertools import accumulate

from . import allocator


def stack(sizes):
    """Offsets of blocks of `sizes` bytes placed end to end, and their total."""
    ends = list(accumulate(sizes))
    return [end - size for end, size in zip(ends, sizes)], ends[-1] if ends else 0


@allocator("naive")
def naive(sizes, starts, ends, alignment):
    """Each interval its own block; the total is the sum of the (aligned) sizes."""
    return stack(sizes)
