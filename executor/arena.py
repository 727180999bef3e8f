"""The one buffer a plan runs in, and every tensor as a view into it."""
import numpy as np

from planner.dtypes import from_onnx  # noqa: F401  (registers ml_dtypes' names with NumPy)


class Arena:
    """`plan.arena_bytes` bytes allocated once with `xp` (numpy or cupy); `view(name)` is the tensor
    at its planned offset, with its shape and dtype."""

    def __init__(self, plan, xp, buffer=None):
        self.plan, self.xp = plan, xp
        self.buffer = xp.empty(max(plan.arena_bytes, 1), dtype=xp.uint8) if buffer is None else buffer

    def sharing(self, plan):
        """This arena's buffer as the arena of `plan`, whose persistent tensors it already holds (Executor's `arena`)."""
        if plan.arena_bytes > self.buffer.size:
            raise ValueError(f"a plan of {plan.arena_bytes} bytes cannot run in an arena of {self.buffer.size}")
        return Arena(plan, self.xp, self.buffer)

    def view(self, name):
        t = self.plan.tensors[name]
        raw = self.buffer[t.offset:t.offset + t.nbytes]
        return raw.view(np.dtype(t.dtype)).reshape(t.shape)

    def bytes(self, offset, nbytes):
        return self.buffer[offset:offset + nbytes]

    def load(self, values):
        """Copy params and consts (host arrays) into their places, once."""
        for name, value in values.items():
            t = self.plan.tensors[name]
            if t.alias_of is None:
                self.view(name)[...] = self.xp.asarray(np.ascontiguousarray(value, dtype=np.dtype(t.dtype)))
