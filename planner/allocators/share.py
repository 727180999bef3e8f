"""MXNet/NNVM GraphAllocator (src/nnvm/plan_memory.cc) replayed over intervals.

Blocks are shared, never split: a request takes a free block within a factor of `match_range` of
its size (growing it if smaller), and the arena is the blocks laid end to end. Colours keep blocks
apart between nodes that may run concurrently.
"""
from bisect import bisect_left, insort

from . import allocator
from .naive import stack


@allocator("share")
def share(sizes, starts, ends, alignment, match_range=16, auto_search=False, colors=None):
    """Offsets and total of the block-sharing plan; with `auto_search`, the best of match ranges
    1, 2, 4, .. up to `match_range` (NNVM_AUTO_SEARCH_MATCH_RANGE; ties keep the smaller range)."""
    ranges = search_ranges(match_range) if auto_search else [match_range]
    plans = [_replay(sizes, starts, ends, mr, colors) for mr in ranges]
    block_of, block_bytes = min(plans, key=lambda plan: sum(plan[1]))
    block_offsets, total = stack(block_bytes)
    return [block_offsets[b] for b in block_of], total


def search_ranges(match_range):
    """Match ranges the auto search tries: powers of two up to `match_range`, and itself."""
    if match_range == 0:
        return [0]
    powers = [1 << k for k in range(match_range.bit_length())]
    return powers if powers[-1] == match_range else powers + [match_range]


def _replay(sizes, starts, ends, match_range, colors):
    """Replay requests (largest first) and releases step by step: each interval's block id and the
    blocks' sizes. Requests at step t come before releases at t, as a node's outputs are requested
    before its inputs are freed."""
    request_color, release_color = colors or (None, None)
    requests = sorted(range(len(sizes)), key=lambda i: (starts[i], -sizes[i], i))
    releases = sorted(range(len(sizes)), key=lambda i: (ends[i], i))
    pool = _Pool(match_range)
    block_of = [0] * len(sizes)
    r = 0
    for i in requests:
        while ends[releases[r]] < starts[i]:
            j = releases[r]
            pool.release(block_of[j], release_color[j] if colors else None)
            r += 1
        block_of[i] = pool.request(sizes[i], request_color[i] if colors else None)
    return block_of, pool.max_bytes


class _Pool:
    """Storage blocks, and the free ones sorted by (max_bytes, release order) like the C++ multimap."""

    def __init__(self, match_range):
        self.match_range = match_range
        self.max_bytes, self.color = [], []  # per block id: its size, the colour of its last releaser
        self.free = []  # (max_bytes, release sequence number, block id)
        self.released = 0

    def request(self, size, color):
        """The first free block of the same colour among `_matches(size)`, grown to `size`; else a new one."""
        for k in self._matches(size):
            block = self.free[k][2]
            if color is None or self.color[block] == color:
                del self.free[k]
                self.max_bytes[block] = max(self.max_bytes[block], size)
                return block
        self.max_bytes.append(size)
        self.color.append(None)
        return len(self.max_bytes) - 1

    def _matches(self, size):
        """Free-list positions in [size / mr, size * mr]: blocks >= size smallest first, then smaller
        blocks largest first (equal sizes: latest released first, as a reverse multimap walk goes)."""
        if not self.match_range:
            return
        mid = bisect_left(self.free, (size,))
        end = bisect_left(self.free, (size * self.match_range + 1,))
        yield from range(mid, end)
        floor = size // self.match_range
        k = mid - 1
        while k >= 0 and self.free[k][0] >= floor:
            yield k
            k -= 1

    def release(self, block, color):
        """Return `block` to the free list, remembering the colour of the interval that freed it."""
        self.color[block] = color
        insort(self.free, (self.max_bytes[block], self.released, block))
        self.released += 1
