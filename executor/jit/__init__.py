"""Compiled CPU kernels (numba) for the steps NumPy cannot do in a few passes: a depthwise convolution tap
by tap, im2col's strided copies, an activation of a dozen ufuncs. The NumPy backend puts them over the
shared kernels when numba is installed (`pip install "memplan[cpu]"`) and MEMPLAN_JIT is not 0; each takes
the float32 arrays of C layout it was written for and hands anything else to the shared kernel. They write
into the same arena views and allocate nothing. Their loops run on every core with TBB (see threads.py).

Compiled on first use and cached beside this package (numba's cache), so the compilation is paid once per
machine, not once per run, and a first run does not wait for it (compiling.py: the shared kernels run while a
child process compiles). Where numba cannot import, compile or start its threads (TBB under a low
address-space limit: "No threading layer could be loaded"), the steps run their shared kernels, with one warning.
"""
import pkgutil
import re
import warnings
from importlib import import_module
from importlib.util import find_spec

import numpy as np

from planner.config import jit_wanted as wanted

from ..kernels import KERNELS, OVERRIDES, find


BROKEN = []
"""The numba failure that stopped the compiled kernels in this process, if one has: from then on every step runs
its shared kernel."""


def available():
    """Whether numba is installed (whether it imports is for `overrides` to find)."""
    return find_spec("numba") is not None


def takes(*arrays):
    """Whether the compiled kernels take these arrays: float32 of C layout, omitted ones (None) aside."""
    return all(a is None or a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def generic(xp, step, ins, outs, ws):
    """The shared kernel of a step, for the arrays a compiled kernel does not take."""
    return find(KERNELS, step)(xp, step, ins, outs, ws)


def overrides():
    """{(domain, op): kernel} of the compiled kernels (each registered with `@override("jit", ...)` beside its code,
    made over the shared kernel), numba's threading layer started first (else numba starts it in the first
    parallel loop), so that one that cannot start fails here; each kernel guarded by `_guarded`."""
    from . import threads
    for module in pkgutil.iter_modules(__path__):  # every module registers its kernels when imported
        import_module(f"{__name__}.{module.name}")
    threads.start()
    return {key: _guarded(make(generic)) for key, make in OVERRIDES["jit"].items()}


def _guarded(kernel):
    """`kernel`, giving the compiled kernels up for the step's shared one the first time numba fails to compile or
    launch a loop: that fails before the loop runs, and a kernel writing over its input does so in one loop, so
    the shared kernel computes the step whole."""
    def run(xp, step, ins, outs, ws):
        if not BROKEN:
            try:
                return kernel(xp, step, ins, outs, ws)
            except Exception as e:
                if not _numba_failure(e):
                    raise
                give_up(e)
        return generic(xp, step, ins, outs, ws)
    return run


def _numba_failure(error):
    """Whether `error` is numba's own, not the data's: a compilation error, memory the compiler could not get (the
    compiled kernels allocate nothing, NumPy's little), a threading layer that cannot start."""
    from numba.core.errors import NumbaError
    return isinstance(error, (NumbaError, MemoryError)) or \
        isinstance(error, ValueError) and "threading layer" in str(error)


def describe(error):
    """One line on a numba failure (its messages run to several lines of hints)."""
    return f"the compiled CPU kernels cannot be set up ({reason(error)})"


def reason(error):
    """An error's type and the first line of its message."""
    from ..backends.memory import first_line
    message = re.sub(r"\x1b\[[0-9;]*m", "", first_line(error))  # numba highlights its messages for a terminal
    return f"{type(error).__name__}{': ' + message if message else ''}"


def give_up(error, stacklevel=2):
    """Stop the compiled kernels for the rest of the process after `error`, with one warning line (shown at the
    caller `stacklevel` frames up)."""
    if not BROKEN:
        BROKEN.append(error)
        warnings.warn(f"{describe(error)}; running the NumPy kernels", RuntimeWarning, stacklevel=stacklevel + 1)


def limit_threads(n):
    """A context manager running numba's parallel loops on at most `n` threads."""
    import numba
    from contextlib import contextmanager

    @contextmanager
    def capped():
        before = numba.get_num_threads()
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        try:
            yield
        finally:
            numba.set_num_threads(before)
    return capped()
