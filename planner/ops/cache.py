"""memplan.CacheWrite: a static key/value cache written in place at the step's position, so that a step of
generation adds its tokens' keys and values without copying the cache (planner/passes/kv_cache.py)."""
from .registry import schema
from .base import Schema
from ..errors import ShapeError

NUMBERS = frozenset({"tensor(float16)", "tensor(bfloat16)", "tensor(float)", "tensor(double)",
                     "tensor(float8e4m3fn)", "tensor(float8e5m2)", "tensor(int8)", "tensor(uint8)"})


@schema("CacheWrite", domain="memplan")
class CacheWrite(Schema):
    """Y = Cache with New written over positions [position, position + S) of `axis`: Cache (..., L, ...), New of
    Cache's shape but S on `axis`, `position` an int64 of one element. Y is planned into Cache's bytes
    (Graph.updates), so only New's bytes move; a position that leaves New outside the cache fails the run."""

    defaults = {"axis": 2}
    types = (("T", "T", "I"), {"T": NUMBERS, "I": ("tensor(int64)",)})

    def infer(self, node, ins):
        cache, new, position = ins
        axis = self.attr(node, "axis") % max(cache.rank, 1)
        if cache.rank != new.rank or cache.dtype != new.dtype or any(
                c != n for k, (c, n) in enumerate(zip(cache.shape, new.shape)) if k != axis):
            raise ShapeError(f"New {new.shape} {new.dtype} must be the cache's {cache.shape} {cache.dtype} but on "
                             f"axis {axis}")
        if new.shape[axis] > cache.shape[axis]:
            raise ShapeError(f"New's {new.shape[axis]} positions do not fit in the cache's {cache.shape[axis]}")
        if position.shape not in ((), (1,)):
            raise ShapeError(f"position must hold one int64, got shape {position.shape}")
        return [(cache.shape, cache.dtype)]

    def flops(self, node, ins, outs):
        return 0
