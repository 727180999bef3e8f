"""The static key/value cache's write (memplan.CacheWrite; rules in planner/ops/cache.py): the new positions'
values copied into the cache, which the plan places the output in, so nothing else moves."""
from . import kernel


@kernel("CacheWrite", domain="memplan")
def cache_write(xp, step, ins, outs, ws):
    cache, new, position = ins
    out, axis = outs[0], step.attrs["axis"] % cache.ndim
    start, count = int(position.reshape(-1)[0]), new.shape[axis]
    if not 0 <= start <= cache.shape[axis] - count:
        raise IndexError(f"position {start} leaves the {count} new positions outside the cache's "
                         f"{cache.shape[axis]}")
    if out is not cache:
        xp.copyto(out, cache)
    where = (slice(None),) * axis + (slice(start, start + count),)
    out[where] = new
