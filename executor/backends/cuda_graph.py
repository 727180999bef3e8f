"""CUDA-graph replay of a plan: its bound kernels captured once on a stream of their own, then the whole plan
launched per run as one graph, with no Python per kernel. Nothing may allocate device memory while the
graph is captured (an allocation would be an address the graph keeps), so a kernel that allocates, or waits
on the host, fails the capture with the step named."""
from contextlib import contextmanager

from planner.errors import MemplanError


class CaptureError(MemplanError):
    """A step's kernel cannot run inside a CUDA graph: it allocates device memory or synchronises the host."""


class Replay:
    """The plan's kernels as one CUDA graph on `self.stream`: `capture(call)` records `call(k, bound)` for every
    bound step of `program`, once; `launch()` runs the graph."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graph = None

    def capture(self, program, call):
        """Record `call(k, bound)` for each step of `program` (bound None: nothing to run) into one graph."""
        cupy, stream = self.cupy, self.stream
        with refusing_allocations(cupy), stream:
            stream.begin_capture()
            try:
                for k, bound in enumerate(program):
                    if bound is not None:
                        _record(call, k, bound)
            finally:
                graph = stream.end_capture()
        self.graph = graph

    def launch(self):
        self.graph.launch(self.stream)


def _record(call, k, bound):
    step = bound[1]
    try:
        call(k, bound)
    except Exception as e:
        raise CaptureError(f"step {k} ({step.op} {step.name!r}) cannot be captured in a CUDA graph: "
                           f"{type(e).__name__}: {e}") from e


@contextmanager
def refusing_allocations(cupy):
    """CuPy allocations raise MemoryError inside the block (kernels must write only the arena)."""
    def refuse(nbytes):
        raise MemoryError(f"a kernel asked CuPy for {nbytes} bytes of device memory")
    with cupy.cuda.using_allocator(refuse):
        yield
