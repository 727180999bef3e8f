"""memplan.SwapOut and memplan.SwapIn on a CUDA stream of their own beside the compute stream, ordered with it by
events, so that the copies overlap the kernels as planner.timing models them. A value's copy out starts once the
step that makes it has run; its SwapOut, which stands where the copy must be over (the device bytes are free from
it), makes the compute stream wait for the copy. A copy back starts at its SwapIn, once the compute stream is past
the steps before it (the bytes it writes are free), and the first step reading it waits for it. The host arena is
pinned, so the copies run asynchronously; a step run on the host (an offloaded update) synchronises first."""
from functools import partial

from planner import ops


def transfer(src, dst, stream):
    """Copy `src` into `dst` on `stream`: device to pinned host (a CuPy array's get) or host to device (set)."""
    if hasattr(src, "get"):
        src.get(out=dst, stream=stream)
    else:
        dst.set(src, stream=stream)


class CopyStream:
    """The copies of `plan` (its SwapOut and SwapIn steps, `handled`, whose kernels the executor leaves out) as
    actions the executor runs before and after step k (`run(k, when)`; k = -1: before the first), on `cupy`'s
    streams; `view(name)` is a tensor's array in its arena. `finish()` makes the compute stream wait for every copy,
    at the end of a run (an offloaded param's copy back has no reader in the run that makes it)."""

    def __init__(self, cupy, plan, view, copy=transfer):
        self.cupy, self.copy = cupy, copy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.handled, self.actions = set(), {}
        made, first = {}, {}
        for k, step in enumerate(plan.steps):
            made.update((o, k) for o in step.outputs if o)
            for name in step.inputs:
                first.setdefault(name, []).append(k)
        for k, step in enumerate(plan.steps):
            if not ops.of(step).timed:  # not a copy between the arenas
                continue
            self.handled.add(k)
            done = cupy.cuda.Event()
            start = partial(self._start, view(step.inputs[0]), view(step.outputs[0]), done)
            if step.op == "SwapOut":
                self._add(made.get(step.inputs[0], -1), "after", start)
                self._add(k, "before", partial(self._wait, done))
            else:
                self._add(k, "before", start)
                readers = [r for r in first.get(step.outputs[0], ()) if r > k]
                if readers:
                    self._add(readers[0], "before", partial(self._wait, done))

    def _add(self, k, when, action):
        self.actions.setdefault((k, when), []).append(action)

    def run(self, k, when):
        """The actions due `when` ("before" or "after") step k."""
        for action in self.actions.get((k, when), ()):
            action()

    def finish(self):
        done = self.cupy.cuda.Event()
        done.record(self.stream)
        self._wait(done)

    def _start(self, src, dst, done):
        """The copy of `src` into `dst` on the copy stream, once the compute stream is past what it has queued."""
        ready = self.cupy.cuda.Event()
        ready.record(self.cupy.cuda.get_current_stream())
        self.stream.wait_event(ready)
        self.copy(src, dst, self.stream)
        done.record(self.stream)

    def _wait(self, done):
        self.cupy.cuda.get_current_stream().wait_event(done)
