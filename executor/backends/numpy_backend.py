"""The CPU backend: NumPy arrays, the shared kernel table."""
import os
import warnings

import numpy as xp  # noqa: F401  (the backend's array module)

from planner.errors import MemplanError
from planner.units import format_bytes

from .. import jit as compiled
from ..kernels import KERNELS

NAME = "numpy"
kernels = KERNELS
fuse = None
"""NumPy fuses nothing: every op runs its array form."""
_compiled = {}


def table(jit=None):
    """The kernel table: the shared one, with executor.jit's compiled kernels over it when `jit` is True, or
    when it is None and numba is installed and MEMPLAN_JIT allows them. A numba that cannot set them up
    (no writable cache, say) is a MemplanError for jit=True, and a warning and the shared table for None."""
    asked = jit
    if jit is None:
        jit = compiled.wanted() and compiled.available()
    elif jit and not compiled.available():
        raise MemplanError('jit=True needs numba: pip install "memplan[cpu]"')
    if not jit:
        return kernels
    if not _compiled:
        try:
            overrides = compiled.overrides()
        except Exception as e:  # numba's own failures have no common class
            message = f"the compiled CPU kernels cannot be set up ({type(e).__name__}: {e})"
            if asked:
                raise MemplanError(message) from e
            warnings.warn(f"{message}; running the NumPy kernels", RuntimeWarning, stacklevel=3)
            return kernels
        _compiled.update(kernels)
        _compiled.update(overrides)
    return _compiled


def free_bytes():
    """Host memory a new allocation can take: MemAvailable from /proc/meminfo, else the free physical
    pages (os.sysconf), else None where neither is known."""
    return _meminfo_available() or _sysconf_available()


def _meminfo_available():
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _sysconf_available():
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_room(nbytes, what, config=None):
    """Raise MemplanError when `what` (its `nbytes`) cannot fit in the host's available memory; `config`
    is unused here (its pool reserve is the GPU's)."""
    free = free_bytes()
    if free is not None and nbytes > free:
        raise MemplanError(f"not enough memory for {what}: {format_bytes(nbytes)} ({nbytes:,} bytes) needed, "
                           f"{format_bytes(free)} ({free:,} bytes) available on the host; use a smaller batch")


def copy_in(view, value):
    """Write a feed into its arena view."""
    view[...] = value


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
