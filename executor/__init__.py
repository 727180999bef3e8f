"""memplan's executor: runs a Plan out of one preallocated arena, on NumPy (CPU) or CuPy (GPU).

Everything is decided before the first run: each step's kernel and the arena views it reads and
writes. Running copies the feeds in, calls the kernels in order and copies the outputs out.
"""
import planner  # noqa: F401  (first: it sets OpenBLAS's thread timeout before NumPy loads it)
import threading
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import replace
from functools import partial

import numpy as np

from planner import heap
from planner.config import Config
from planner.dtypes import from_onnx  # noqa: F401  (registers ml_dtypes' names with NumPy)
from planner.errors import MemplanError, OutOfMemoryError
from planner.ir import op_name
from planner.timing import runs_on_host
from planner.units import format_bytes

from . import backends, kernels
from .arena import Arena
from .collectives import groups_for, shards, stage_feeds
from .feeds import FeedError, check_labels, label_ranges, random_feeds, random_inputs, type_name
from .backends import numpy_backend
from .backends.memory import first_line
from .profile import Profile

POISON = 0xFF
"""The byte poison mode writes over dead tensors: NaN in every float dtype, -1 in the integers."""


class RunError(MemplanError):
    """A step met values it cannot compute on, such as a token id past the end of its embedding table."""


class BusyError(MemplanError):
    """An Executor was asked to run while another run was in progress on it (from another thread)."""


class Executor:
    """Runs `plan` on `backend` ("numpy", "cupy" or "auto"). With `poison=True` every byte range
    whose tensors are dead is overwritten after each step, so a planning mistake shows as a wrong
    output instead of passing unnoticed.

    One Executor runs one step at a time: every run writes the same arena, so `run` or `train_step`
    called while another is in progress (from another thread) raises BusyError. Make one Executor
    per thread instead.

    With `profile=True` each step's kernel is timed, the device synchronised after it, into
    `self.profile` (executor.profile.Profile); None otherwise. `threads` caps the host BLAS threads
    during a run (default: the BLAS library's own choice, one per core). `jit` chooses the compiled CPU
    kernels of executor.jit (numba) over the shared NumPy ones: None, where numba is installed and
    MEMPLAN_JIT is not 0, without waiting for a kernel not yet in numba's cache (its step runs the NumPy
    kernel while a child process compiles it: executor/jit/compiling.py); True, compiling first; False, never.

    The params' and consts' values are copied into the arena and `self.plan` is the plan without them
    (`data` empty): where nothing else holds the plan, the weights are not kept twice (planner.heap returns
    the freed pages to the operating system, before the arena is filled and after).

    A parallel plan (planner.parallel) runs its collectives in `group` (executor.collectives), which holds
    all of the step's ranks: by default torch.distributed's, where the caller initialized it.

    On CuPy, `cuda_graph=True` runs the first run's kernels one by one, then captures them as one CUDA graph
    that every later run replays (executor/backends/cuda_graph.py): feeds are copied into their places in the
    arena, the graph launched, and the outputs returned as host (NumPy) arrays; nothing is allocated on the
    device. Without it the copies between the arenas (memplan.SwapOut, SwapIn) run on a CUDA stream of their own,
    ordered with the kernels by events (executor/backends/cuda_copies.py). `tf32=True` lets fp32 GEMMs and
    convolutions round to TF32 on the tensor cores. `arena`: run in the
    Arena of another Executor whose plan places its params, consts and state alike (the steps of a GenerationPlan,
    executor.Generator), loading nothing.
    `self.libraries` says which GPU libraries run the GEMMs and convolutions, or why none do."""

    def __init__(self, plan, backend="auto", poison=False, config=None, profile=False, threads=None, jit=None,
                 group=None, cuda_graph=False, tf32=False, arena=None):
        _check_weights(plan)
        self.backend = backends.get(backend)
        self.groups = groups_for(plan, group)
        if cuda_graph:
            _check_graphable(self.backend, plan, poison, profile, self.groups["world"].size)
        self.config = config or Config.from_env()
        if arena is None:
            check_memory(plan, self.backend, self.config, cuda_graph=cuda_graph)
            plan.check_values()
            heap.trim()
        values, plan = plan.data, replace(plan, data={})
        self.plan, self.poison, self.copies = plan, poison, _outputs(plan)
        foreign = sorted({t.dtype for t in plan.tensors.values() if not self.backend.holds(np.dtype(t.dtype))})
        if foreign:
            raise MemplanError(f"backend {self.backend.NAME!r} cannot hold tensors of dtype {', '.join(foreign)}")
        self.kernels = self.backend.table(jit)
        self.jit = self.kernels is not self.backend.kernels
        missing = sorted({op_name(s.domain, s.op) for s in plan.steps if self._kernel(s) is None})
        if missing:
            raise MemplanError(f"backend {self.backend.NAME!r} has no kernel for {', '.join(missing)}")
        self.runtime = self.backend.runtime(tf32)
        self.libraries = self.runtime.libraries
        if arena is not None:
            self.arena = arena.sharing(plan)
        else:
            with self.backend.allocating(plan.arena_bytes, "the arena", self.config):
                self.arena = Arena(plan, self.backend.xp, self.backend.host_arena(plan.host_arena_bytes))
            with self.backend.allocating(sum(plan.tensors[n].nbytes for n in values),
                                         "the params' and consts' values", self.config):
                self.arena.load(shards(plan, values, self.groups))
            heap.trim()
            for t in plan.tensors.values():
                if t.kind == "state":
                    self.arena.view(t.name).fill(0)
        del values
        self.steps_taken = 0
        self.lr = plan.training.get("args", {}).get("lr")
        self.views = {}
        self.profile = Profile(plan, self.backend.synchronize) if profile else None
        self.copy_stream = None if cuda_graph else self.backend.copies(plan, self._view)
        self.program = [self._bind(k, step) for k, step in enumerate(plan.steps)]
        self.gate = _gate(plan)
        self.labels = label_ranges(plan)
        self.updated = False
        self.dead = _dead_after(plan) if poison else {}
        self.busy = threading.Lock()
        self.threads = _thread_limit(threads, self.jit)
        self.replay = self.backend.Replay(self.backend.xp) if cuda_graph else None

    @contextmanager
    def _exclusive(self):
        """Hold the arena for one run, or raise BusyError when another run holds it; the BLAS threads
        capped meanwhile when `threads` was given."""
        if not self.busy.acquire(blocking=False):
            raise BusyError("this Executor is already running (run or train_step from another thread) and its "
                            "arena holds one run at a time: make one Executor per thread")
        try:
            with self.threads() if self.threads else nullcontext():
                yield
        finally:
            self.busy.release()

    def _on_host(self, step):
        """Whether `step` runs NumPy's kernel on the host arena though the backend is another (an offloaded update)."""
        return self.backend is not numpy_backend and runs_on_host(step, self.plan.tensors)

    def _kernel(self, step):
        """The kernel of `step`: NumPy's for a step `_on_host`, else the backend's (None where it has none)."""
        if self._on_host(step):
            return kernels.find(numpy_backend.table(False), step)
        return kernels.find(self.kernels, step, self.backend.fuse)

    def _view(self, name):
        """The arena view of a tensor: one object per place, so that an output written in place is the
        very array its input is (CuPy copies an input that overlaps its output but is another object)."""
        t = self.plan.tensors[name]
        key = (t.host, t.offset, tuple(t.shape), t.dtype)
        if key not in self.views:
            self.views[key] = self.arena.view(name)
        return self.views[key]

    def _bind(self, k, step):
        """(kernel, step, input views, output views, {scratch slice name: view}), or None for a step whose
        outputs are all views of its input (its bytes are already in place) or empty (a zero-size batch:
        nothing to write), unless it communicates (its peers wait for it). The kernel of step `k` is timed
        when profiling."""
        views, tensors = self._view, self.plan.tensors
        if self.copy_stream and k in self.copy_stream.handled:  # its copy runs on the copy stream, around the steps
            return None
        if step.outputs and all(not o or tensors[o].view or not tensors[o].nbytes for o in step.outputs) and \
                not getattr(kernels.find(self.kernels, step), "collective", False):
            return None
        ws, region = {}, None
        if step.workspace:
            slot = self.plan.tensors[step.workspace]
            region = self.arena.bytes(slot.offset, slot.nbytes)
            ws = {c.name: self.arena.bytes(slot.offset + c.offset, c.nbytes).view(np.dtype(c.dtype)).reshape(c.shape)
                  for c in step.scratch}
        ins, outs = [views(i) if i else None for i in step.inputs], [views(o) if o else None for o in step.outputs]
        if self._on_host(step):
            fn = numpy_backend.host_step(self._kernel(step), self._quiet)
        else:
            fn = self.runtime.bind(step, self._kernel(step), ins, outs, region)
        if getattr(fn, "collective", False):
            fn = partial(fn, group=self.groups[step.attrs.get("group", "dp")])
        if self.profile:
            fn = self.profile.timed(k, fn)
        return fn, step, ins, outs, ws

    def run(self, feeds):
        """Run once on `feeds` ({input name: array}); returns {output name: array}, copies that the
        next run does not change. A feed is an array of the planned shape and dtype, or a list or
        number that becomes one by a same-kind cast (a list of Python floats for a float32 input)."""
        with self._exclusive():
            return self._run(feeds, {})

    def run_in_place(self, feeds):
        """Run once on `feeds`, arrays of exactly the planned shapes and dtypes (taken as they are, unchecked), and
        leave the outputs in the arena, read through `view`: a run that allocates nothing, as executor.Generator
        runs each token."""
        with self._exclusive():
            self._run(feeds, {}, checked=True)

    def view(self, name):
        """The arena's view of tensor `name` of the plan (an input to write, an output to read after a run)."""
        return self._view(name)

    def _run(self, feeds, scalars, checked=False):
        """`run`, with the scalar inputs in `scalars` filled in place (no host array to copy); `checked`: the feeds
        are taken as they are and the outputs left in the arena (run_in_place)."""
        feeds = feeds if checked else self._feeds(feeds, scalars)
        with self.replay.stream if self.replay else nullcontext():
            if self.poison:
                base = self.plan.stats.get("persistent_bytes", 0)
                self.arena.bytes(base, self.plan.arena_bytes - base).fill(POISON)
            for name, value in scalars.items():
                self.arena.view(name).fill(value)
            for name in feeds:
                self.backend.copy_in(self.arena.view(name), feeds[name])
            self.updated = True
            if self.replay and self.replay.graph:
                self.replay.launch()
            else:
                self._steps()
                if self.replay:  # the first run's kernels ran one by one (compiling them); now record them
                    self.replay.capture(self.program, self._call)
            if self.replay:
                self.replay.stream.synchronize()
                with numpy_backend.allocating(self.copies[1], self.copies[0]):
                    return {name: self.arena.view(name).get() for name in self.plan.outputs}
        for group in {id(g): g for g in self.groups.values()}.values():
            group.flush()
        self.backend.synchronize()
        if checked:
            return None
        with self.backend.allocating(self.copies[1], self.copies[0], self.config):
            return {name: self.arena.view(name).copy() for name in self.plan.outputs}

    def _steps(self):
        """Every step's kernel in order, skipping the optimizer steps a failed amp-fp16 finite check gates, and
        poisoning what died after each step in poison mode."""
        copies = self.copy_stream
        with np.errstate(all="ignore"):  # IEEE results (overflow to inf, log 0) are the ops' own, as when folding
            if copies:
                copies.run(-1, "after")
            for k, bound in enumerate(self.program):
                if not (k in self.gate[1] and not self.updated):  # a gated step runs nothing, its copies neither
                    self._step(k, bound, copies)
                if k == self.gate[0]:
                    self.updated = bool(self.arena.view(self.plan.training["scaler"]["finite"]))
                for offset, nbytes, host in self.dead.get(k, ()):
                    if host:  # a copy may still read it
                        self._quiet()
                    self.arena.bytes(offset, nbytes, host).fill(POISON)
            if copies:
                copies.finish()

    def _step(self, k, bound, copies):
        """Step k's kernel (None: nothing to run), between the copies due before and after it."""
        if copies:
            copies.run(k, "before")
        if bound is not None:
            self._call(k, bound)
        if copies:
            copies.run(k, "after")

    def _quiet(self):
        """Wait for the device's queued work and copies: what the host reads or writes next is theirs no more."""
        self.backend.synchronize()
        if self.copy_stream:
            self.copy_stream.stream.synchronize()

    def _call(self, k, bound):
        fn, step, ins, outs, ws = bound
        try:
            fn(self.runtime.xp, step, ins, outs, ws)
        except (IndexError, ValueError) as e:
            raise RunError(f"step {k} ({step.op} {step.name!r}) cannot run on these feeds: {e}") from e
        except MemoryError as e:
            raise OutOfMemoryError(f"not enough memory to run step {k} ({step.op} {step.name!r}): "
                                   f"{first_line(e) or 'the allocation failed'}") from None

    def train_step(self, feeds):
        """One training step of a plan compiled with training=True: forward, backward and the optimizer
        updating the params in the arena. `feeds` are the model's inputs and the labels (or targets; a
        pipeline stage takes those it reads, each microbatch its rows); the learning rate is `self.lr`.
        Returns the loss before the update (None on a pipeline stage before the last, which has none)."""
        info = self.plan.training
        if not self.plan.trains:
            raise MemplanError("train_step needs a plan compiled with training=True")
        with self._exclusive():
            scalars = {info["lr"]: float(self.lr), info["step"]: float(self.steps_taken + 1)}
            outputs = self._run(stage_feeds(self.plan, feeds), scalars)
            self.steps_taken += int(self.updated)
        return None if info["loss"] is None else float(outputs[info["loss"]])

    @property
    def loss_scale(self):
        """The loss scale of an amp-fp16 plan (planner.loss_scaling) for its next step; None without one."""
        scaler = self.plan.training.get("scaler")
        if not scaler:
            return None
        return scaler["init"] * 2.0 ** float(self.arena.view(scaler["exponent"]))

    def parameters(self):
        """{name: host array} of the trained params (a copy of their current values in the arena; under
        ZeRO-3, this rank's shard of each, planner.parallel). Where an offloaded optimizer's master weights are of
        another type than the device's param (a 16-bit param, float32 master: planner/passes/offload.py), the
        master's (this rank's shard of it from ZeRO-1 on)."""
        names = self.plan.training.get("params") or [t.name for t in self.plan.tensors.values() if t.kind == "param"]
        masters = (self.plan.training.get("offload") or {}).get("masters", {})
        read = {name: masters[name] if name in masters and self.plan.tensors[masters[name]].dtype !=
                self.plan.tensors[name].dtype else name for name in names}
        return {name: np.array(self.arena.view(read[name]).get() if not self.plan.tensors[read[name]].host and
                               self.backend.xp is not np else self.arena.view(read[name])) for name in names}

    def set_parameters(self, values):
        """Write params (any of the plan's, trained or not, e.g. running statistics) into the arena (and an offloaded
        optimizer's master weights of each)."""
        masters = (self.plan.training.get("offload") or {}).get("masters", {})
        for name, value in values.items():
            t = self.plan.tensors.get(name)
            if t is None or t.kind != "param":
                raise FeedError(f"{name!r} is not a param of the plan")
            if tuple(np.shape(value)) != tuple(t.shape):
                raise FeedError(f"param {name!r}: expected shape {tuple(t.shape)}, got {tuple(np.shape(value))}")
            self.arena.view(name)[...] = self.backend.xp.asarray(np.asarray(value, dtype=np.dtype(t.dtype)))
            if name in masters:  # its master too, cut as the executor loads it
                master = masters[name]
                sharded = name in (self.plan.training.get("parallel") or {}).get("sharded", ())
                self.arena.load({master: value} if sharded else shards(self.plan, {master: value}, self.groups))

    def _feeds(self, feeds, scalars):
        """{input: array} of every input but the `scalars`, each fed once, checked by `_feed`."""
        if not isinstance(feeds, Mapping):
            raise FeedError(f"feeds must be a dict {{input name: array}}, got {type_name(feeds)}")
        expected = [n for n in self.plan.inputs if n not in scalars]
        unknown = sorted(set(feeds) - set(expected))
        missing = [n for n in expected if n not in feeds]
        if unknown or missing:
            raise FeedError(f"feeds must name exactly the inputs {expected}; missing {missing}, unknown {unknown}")
        with numpy_backend.allocating(sum(self.plan.tensors[n].nbytes for n in expected), "the feeds' arrays"):
            checked = {name: self._feed(name, feeds[name]) for name in expected}
        for name, (classes, ignore) in self.labels.items():
            check_labels(name, checked[name], classes, ignore)
        return checked

    def _feed(self, name, value):
        """An array feed of exactly the planned shape and dtype, as it is; a list or number as the
        array NumPy makes of it, when that has the planned shape and casts to the dtype by same kind."""
        t = self.plan.tensors[name]
        shape, dtype = tuple(t.shape), np.dtype(t.dtype)
        expected = f"input {name!r}: expected shape {shape} {t.dtype}"
        if isinstance(value, (np.ndarray, np.generic, self.backend.xp.ndarray)):
            if value.shape != shape or value.dtype != dtype:
                raise FeedError(f"{expected}, got {tuple(value.shape)} {value.dtype}")
            return value
        if not isinstance(value, (list, tuple, int, float, complex)):
            raise FeedError(f"{expected}, got {type_name(value)}")
        try:
            given = np.asarray(value)
        except (ValueError, OverflowError):
            raise FeedError(f"{expected}, got a {type_name(value)} that is not a rectangular array") from None
        if given.shape != shape or not np.can_cast(given.dtype, dtype, "same_kind"):
            raise FeedError(f"{expected}, got {type_name(value)} of shape {given.shape} {given.dtype}")
        cast = given.astype(dtype)
        if dtype.kind in "iu" and not np.array_equal(cast, given):
            raise FeedError(f"{expected}, got {type_name(value)} of values outside the range of {t.dtype}")
        return cast


def _thread_limit(threads, jit):
    """None for no cap, else a function making a context manager that caps the BLAS threads at `threads`
    (threadpoolctl), and with `jit` the compiled kernels' threads too."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise MemplanError(f"threads must be an int >= 1, got {threads!r}")
    from threadpoolctl import ThreadpoolController
    controller = ThreadpoolController()

    def capped():
        stack = ExitStack()
        stack.enter_context(controller.limit(limits=threads, user_api="blas"))
        if jit:
            from . import jit as compiled
            stack.enter_context(compiled.limit_threads(threads))
        return stack
    return capped


def _dead_after(plan):
    """{step: [(offset, nbytes, in the host arena)]}: the buffers whose every tensor is dead once the step has run,
    and the pooled workspace slot the step used."""
    dead = {}
    for root, (_, last) in {**plan.buffer_spans(), **plan.buffer_spans(host=True)}.items():
        if last < len(plan.steps):
            t = plan.tensors[root]
            dead.setdefault(last, []).append((t.offset, t.nbytes, t.host))
    for k, step in enumerate(plan.steps):
        if step.workspace and plan.tensors[step.workspace].lifetime is None:
            t = plan.tensors[step.workspace]
            dead.setdefault(k, []).append((t.offset, t.nbytes, False))
    return dead


def _outputs(plan):
    """(what they are, their bytes) of the copies of its outputs each run returns."""
    return "the copies of the outputs a run returns", sum(plan.tensors[n].nbytes for n in plan.outputs)


def check_memory(plan, backend="numpy", config=None, feeds=False, cuda_graph=False):
    """Raise OutOfMemoryError when running `plan` on `backend` (a name or a backend module) cannot fit in the
    memory the process can allocate: with `feeds` the random feeds as random_feeds makes them, then the arena, then
    the copies of the outputs each run returns, each sum in turn. Each part is counted on the memory that holds it:
    the host holds the feeds, and the outputs of a CUDA graph's replay. An Executor checks its arena and outputs when
    made; `memplan run` checks the feeds with them before it makes any."""
    backend = backends.get(backend) if isinstance(backend, str) else backend
    config = config or Config.from_env()
    device = [("the arena", plan.arena_bytes)] + ([] if cuda_graph else [_outputs(plan)])
    host = ([random_inputs(plan)[:2]] if feeds else []) + ([_outputs(plan)] if cuda_graph else []) + \
        [("the host arena", plan.host_arena_bytes)]
    if backend is numpy_backend:
        device, host = host + device, []
    _check_sums(backend, device, config)
    _check_sums(numpy_backend, host, config)


def _check_sums(backend, parts, config):
    """Check on `backend` each growing sum of `parts` ([(what, bytes)]), so that the first that does not fit is
    named with its parts and their sizes."""
    total, named = 0, []
    for what, nbytes in [part for part in parts if part[1]]:
        total += nbytes
        named.append(f"{what} ({format_bytes(nbytes)})")
        backend.check_room(total, what if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}", config)


__all__ = ["BusyError", "Executor", "FeedError", "OutOfMemoryError", "RunError", "check_memory", "random_feeds"]


def _check_weights(plan):
    """Refuse a plan of a weightless model (planner.deferred.Absent): it says what the model takes, but has
    nothing to compute with."""
    absent = plan.weights_absent
    if absent:
        more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
        raise MemplanError(f"this plan was made without the model's weights ({absent[0]!r}{more} have no values): "
                           "it says how much memory the model takes; to run it, plan the model with its weights")


def _check_graphable(backend, plan, poison, profile, ranks):
    """Raise MemplanError unless `plan` can run as one CUDA graph on `backend` with these options."""
    why = ("it needs the cupy backend" if backend.NAME != "cupy" else
           "poison mode writes between the steps" if poison else
           "profiling times each step" if profile else
           "its amp-fp16 loss scaling skips the update on the host" if (plan.training or {}).get("scaler") else
           "its optimizer runs on the host (offload)" if (plan.training or {}).get("offload") else
           "its collectives run between processes" if ranks > 1 else None)
    if why:
        raise MemplanError(f"cuda_graph=True cannot run this plan: {why}")


def _gate(plan):
    """(the step computing an amp-fp16 plan's finite check, the optimizer steps it gates): a step whose
    gradients overflowed runs no update, as GradScaler skips optimizer.step(). (None, ()) without one."""
    scaler = (plan.training or {}).get("scaler")
    if not scaler:
        return None, frozenset()
    check = next(k for k, s in enumerate(plan.steps) if scaler["finite"] in s.outputs)
    return check, frozenset(k for k, s in enumerate(plan.steps) if s.phase == "optimizer")
