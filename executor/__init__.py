"""memplan's executor: runs a Plan out of one preallocated arena, on NumPy (CPU) or CuPy (GPU).

Everything is decided before the first run: each step's kernel and the arena views it reads and
writes. Running copies the feeds in, calls the kernels in order and copies the outputs out.
"""
import numpy as np

from planner.config import Config
from planner.dtypes import from_onnx  # noqa: F401  (registers ml_dtypes' names with NumPy)
from planner.errors import MemplanError

from . import backends
from .arena import Arena

POISON = 0xFF
"""The byte poison mode writes over dead tensors: NaN in every float dtype, -1 in the integers."""


class FeedError(MemplanError):
    """A feed is missing, unknown, or of the wrong shape or dtype."""


class Executor:
    """Runs `plan` on `backend` ("numpy", "cupy" or "auto"). With `poison=True` every byte range
    whose tensors are dead is overwritten after each step, so a planning mistake shows as a wrong
    output instead of passing unnoticed."""

    def __init__(self, plan, backend="auto", poison=False, config=None):
        self.plan, self.poison = plan, poison
        self.backend = backends.get(backend)
        config = config or Config.from_env()
        free = self.backend.free_bytes()
        if free is not None:
            usable = int(free * (1 - config.pool_reserve_percent / 100))
            if plan.arena_bytes > usable:
                raise MemplanError(f"the arena needs {plan.arena_bytes:,} bytes but the device has {usable:,} usable "
                                   f"({free:,} free less MXNET_GPU_MEM_POOL_RESERVE={config.pool_reserve_percent}%)")
        foreign = sorted({t.dtype for t in plan.tensors.values() if not self.backend.holds(np.dtype(t.dtype))})
        if foreign:
            raise MemplanError(f"backend {self.backend.NAME!r} cannot hold tensors of dtype {', '.join(foreign)}")
        missing = sorted({s.op for s in plan.steps} - set(self.backend.kernels))
        if missing:
            raise MemplanError(f"backend {self.backend.NAME!r} has no kernel for {', '.join(missing)}")
        self.arena = Arena(plan, self.backend.xp)
        self.arena.load(plan.data)
        for t in plan.tensors.values():
            if t.kind == "state":
                self.arena.view(t.name).fill(0)
        self.steps_taken = 0
        self.lr = plan.training.get("args", {}).get("lr")
        self.views = {}
        self.program = [self._bind(step) for step in plan.steps]
        self.dead = _dead_after(plan) if poison else {}

    def _view(self, name):
        """The arena view of a tensor: one object per place, so that an output written in place is the
        very array its input is (CuPy copies an input that overlaps its output but is another object)."""
        t = self.plan.tensors[name]
        key = (t.offset, tuple(t.shape), t.dtype)
        if key not in self.views:
            self.views[key] = self.arena.view(name)
        return self.views[key]

    def _bind(self, step):
        """(kernel, step, input views, output views, workspace bytes), or None for a step whose outputs
        are all views of its input: its bytes are already in place."""
        views = self._view
        if step.outputs and all(not o or self.plan.tensors[o].view for o in step.outputs):
            return None
        ws = None
        if step.workspace:
            t = self.plan.tensors[step.workspace]
            ws = self.arena.bytes(t.offset, t.nbytes)
        return (self.backend.kernels[step.op], step, [views(i) if i else None for i in step.inputs],
                [views(o) if o else None for o in step.outputs], ws)

    def run(self, feeds):
        """Run once on `feeds` ({input name: array}); returns {output name: array}, copies that the
        next run does not change."""
        return self._run(feeds, {})

    def _run(self, feeds, scalars):
        """`run`, with the scalar inputs in `scalars` filled in place (no host array to copy)."""
        xp = self.backend.xp
        self._check(feeds, scalars)
        if self.poison:
            base = self.plan.stats.get("persistent_bytes", 0)
            self.arena.bytes(base, self.plan.arena_bytes - base).fill(POISON)
        for name, value in scalars.items():
            self.arena.view(name).fill(value)
        for name in feeds:
            self.arena.view(name)[...] = xp.asarray(feeds[name])
        for k, bound in enumerate(self.program):
            if bound is not None:
                fn, step, ins, outs, ws = bound
                fn(xp, step, ins, outs, ws)
            for offset, nbytes in self.dead.get(k, ()):
                self.arena.bytes(offset, nbytes).fill(POISON)
        self.backend.synchronize()
        return {name: self.arena.view(name).copy() for name in self.plan.outputs}

    def train_step(self, feeds):
        """One training step of a plan compiled with training=True: forward, backward and the optimizer
        updating the params in the arena. `feeds` are the model's inputs and the labels (or targets);
        the learning rate is `self.lr`. Returns the loss before the update."""
        info = self.plan.training
        if not info:
            raise MemplanError("train_step needs a plan compiled with training=True")
        scalars = {info["lr"]: float(self.lr), info["step"]: float(self.steps_taken + 1)}
        loss = self._run(feeds, scalars)[info["loss"]]
        self.steps_taken += 1
        return float(loss)

    def parameters(self):
        """{name: host array} of the trained params (a copy of their current values in the arena)."""
        names = self.plan.training.get("params") or [t.name for t in self.plan.tensors.values() if t.kind == "param"]
        xp = self.backend.xp
        return {name: np.array(self.arena.view(name).get() if xp is not np else self.arena.view(name))
                for name in names}

    def set_parameters(self, values):
        """Write params (any of the plan's, trained or not, e.g. running statistics) into the arena."""
        for name, value in values.items():
            t = self.plan.tensors.get(name)
            if t is None or t.kind != "param":
                raise FeedError(f"{name!r} is not a param of the plan")
            if tuple(np.shape(value)) != tuple(t.shape):
                raise FeedError(f"param {name!r}: expected shape {tuple(t.shape)}, got {tuple(np.shape(value))}")
            self.arena.view(name)[...] = self.backend.xp.asarray(np.asarray(value, dtype=np.dtype(t.dtype)))

    def _check(self, feeds, scalars):
        """Every input but the `scalars` fed once, with the planned shape and dtype."""
        expected = [n for n in self.plan.inputs if n not in scalars]
        unknown = sorted(set(feeds) - set(expected))
        missing = [n for n in expected if n not in feeds]
        if unknown or missing:
            raise FeedError(f"feeds must name exactly the inputs {expected}; missing {missing}, unknown {unknown}")
        for name in expected:
            t, value = self.plan.tensors[name], feeds[name]
            if tuple(value.shape) != tuple(t.shape) or np.dtype(value.dtype) != np.dtype(t.dtype):
                raise FeedError(f"input {name!r}: expected shape {tuple(t.shape)} {t.dtype}, "
                                f"got {tuple(value.shape)} {value.dtype}")


def _dead_after(plan):
    """{step: [(offset, nbytes)]}: the buffers whose every tensor is dead once the step has run, and
    the pooled workspace slot the step used."""
    dead = {}
    for root, (_, last) in plan.buffer_spans().items():
        if last < len(plan.steps):
            dead.setdefault(last, []).append((plan.tensors[root].offset, plan.tensors[root].nbytes))
    for k, step in enumerate(plan.steps):
        if step.workspace and plan.tensors[step.workspace].lifetime is None:
            t = plan.tensors[step.workspace]
            dead.setdefault(k, []).append((t.offset, t.nbytes))
    return dead


__all__ = ["Executor", "FeedError"]
