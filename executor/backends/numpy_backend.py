"""The CPU backend: NumPy arrays, the shared kernel table, and the host GEMMs on MKL where it runs (installed
as planner.ops.into's GEMM for NumPy arrays when the backend loads)."""
import numpy as xp  # noqa: F401  (the backend's array module)

from planner.errors import MemplanError
from planner.ops import into

from .. import jit as compiled
from .. import mkl
from ..kernels import KERNELS
from . import memory

NAME = "numpy"
into.install(xp, mkl.gemm)
kernels = KERNELS
fuse = None
"""NumPy fuses nothing: every op runs its array form."""
_compiled = {}
"""The tables with the compiled kernels, by whether they defer compiling to a child process (jit=None)."""


def table(jit=None):
    """The kernel table: the shared one, with executor.jit's compiled kernels over it when `jit` is True, or
    when it is None and numba is installed and MEMPLAN_JIT allows them. For None a kernel not yet in numba's
    cache runs its shared form while a child process compiles it (executor/jit/compiling.py); for True it
    compiles first. A numba that cannot set them up (no writable cache, a threading layer that cannot start) is
    a MemplanError for jit=True, and for None one warning in the process and the shared table from then on."""
    asked = jit
    if jit is None:
        jit = compiled.wanted() and compiled.available()
    elif jit and not compiled.available():
        raise MemplanError('jit=True needs numba: pip install "memplan[cpu]"')
    if not jit:
        return kernels
    if compiled.BROKEN:
        if asked:
            raise MemplanError(compiled.describe(compiled.BROKEN[0]))
        return kernels
    defer = asked is None
    if defer not in _compiled:
        try:
            made = compiled.overrides()
        except Exception as e:  # numba's own failures have no common class
            if asked:
                raise MemplanError(compiled.describe(e)) from e
            compiled.give_up(e, stacklevel=3)  # the Executor's maker
            return kernels
        from ..jit import compiling
        compiling.install()
        if defer:
            made = {key: compiling.deferring(kernel, compiled.generic) for key, kernel in made.items()}
        _compiled[defer] = {**kernels, **made}
    return _compiled[defer]


def room(config=None):
    """(bytes, where) of the host memory a new allocation can take (executor.backends.memory), or None where no
    limit is known; `config` is the GPU's (its pool reserve)."""
    return memory.host_room()


def check_room(nbytes, what, config=None):
    """Raise OutOfMemoryError when `what` (its `nbytes`) cannot fit in the host memory the process can allocate."""
    memory.check(nbytes, what, room())


def allocating(nbytes, what, config=None):
    """A block allocating `what` (`nbytes`) on the host: its MemoryError becomes the one-line OutOfMemoryError."""
    return memory.allocating(nbytes, what, room)


def copy_in(view, value):
    """Write a feed into its arena view."""
    view[...] = value


def host_arena(nbytes):
    """The host arena's buffer of `nbytes` (Arena.host)."""
    return xp.empty(max(nbytes, 1), dtype=xp.uint8)


def synchronize():
    pass


def used_bytes():
    """Device memory in use: none on the host."""
    return None


def holds(dtype):
    """Every dtype NumPy knows, ml_dtypes' (bfloat16, float8, int4) included."""
    return True


class Runtime:
    """What an executor's kernels run with on the host: NumPy, each step its table's kernel."""
    xp = xp
    libraries = {}

    def bind(self, step, fn, ins, outs, workspace):
        return fn


def runtime(tf32=False):
    """The host's Runtime (`tf32` is the GPU's)."""
    return Runtime()


def copies(plan, view):
    """The copies between the arenas run in place, as steps like any other (a GPU runs them on a stream of their
    own: cupy_backend.copies)."""
    return None


def host_step(kernel, synchronize):
    """A step of another backend run by NumPy's `kernel` on the host arena's arrays, once the device's queued copies
    into them are done (`synchronize`)."""
    def run(_, step, ins, outs, ws):
        synchronize()
        kernel(xp, step, ins, outs, ws)
    return run
