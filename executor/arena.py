"""The one buffer a plan runs in, and every tensor as a view into it."""
import numpy as np

from planner.dtypes import from_onnx  # noqa: F401  (registers ml_dtypes' names with NumPy)


class Arena:
    """`plan.arena_bytes` bytes allocated once with `xp` (numpy or cupy), and `plan.host_arena_bytes` of host memory
    (`host`: a NumPy uint8 buffer, pinned on CUDA); `view(name)` is the tensor at its planned offset in its arena,
    with its shape and dtype."""

    def __init__(self, plan, xp, host, buffer=None):
        self.plan, self.xp, self.host = plan, xp, host
        self.buffer = xp.empty(max(plan.arena_bytes, 1), dtype=xp.uint8) if buffer is None else buffer

    def sharing(self, plan):
        """This arena's buffers as the arenas of `plan`, whose persistent tensors they already hold (Executor's
        `arena`)."""
        if plan.arena_bytes > self.buffer.size or plan.host_arena_bytes > self.host.size:
            raise ValueError(f"a plan of {plan.arena_bytes} bytes and {plan.host_arena_bytes} host bytes cannot run "
                             f"in arenas of {self.buffer.size} and {self.host.size}")
        return Arena(plan, self.xp, self.host, self.buffer)

    def view(self, name):
        t = self.plan.tensors[name]
        raw = (self.host if t.host else self.buffer)[t.offset:t.offset + t.nbytes]
        return raw.view(np.dtype(t.dtype)).reshape(t.shape)

    def bytes(self, offset, nbytes, host=False):
        return (self.host if host else self.buffer)[offset:offset + nbytes]

    def load(self, values):
        """Copy params and consts (host arrays) into their places, once."""
        for name, value in values.items():
            t = self.plan.tensors[name]
            if t.alias_of is None:
                xp = np if t.host else self.xp
                self.view(name)[...] = xp.asarray(np.ascontiguousarray(value, dtype=np.dtype(t.dtype)))
