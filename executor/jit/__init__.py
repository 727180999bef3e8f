"""Compiled CPU kernels (numba) for the steps NumPy cannot do in a few passes: a depthwise convolution tap
by tap, im2col's strided copies, an activation of a dozen ufuncs. The NumPy backend puts them over the
shared kernels when numba is installed (`pip install "memplan[cpu]"`) and MEMPLAN_JIT is not 0; each takes
the float32 arrays of C layout it was written for and hands anything else to the shared kernel. They write
into the same arena views and allocate nothing. Their loops run on every core with TBB (see threads.py).

Compiled on first use and cached beside this package (numba's cache), so a process pays the compilation
once per machine, not once per run.
"""
import numpy as np

from planner.threads import jit_wanted as wanted

from ..kernels import KERNELS, find


def available():
    """Whether numba imports."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def takes(*arrays):
    """Whether the compiled kernels take these arrays: float32 of C layout, omitted ones (None) aside."""
    return all(a is None or a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def generic(xp, step, ins, outs, ws):
    """The shared kernel of a step, for the arrays a compiled kernel does not take."""
    return find(KERNELS, step)(xp, step, ins, outs, ws)


def overrides():
    """{(domain, op): kernel} of the compiled kernels."""
    from . import attention, conv, elementwise, inverted_residual, winograd
    return {("memplan", "BiasActivation"): elementwise.bias_activation(generic),
            ("memplan", "ScaledDotProductAttention"): attention.scaled_dot_product_attention(generic),
            ("", "Conv"): conv.conv(generic),
            ("com.microsoft", "FusedConv"): conv.conv(generic),
            ("", "MaxPool"): conv.pool(generic),
            ("memplan", "WinogradConv"): winograd.winograd_conv(generic),
            ("memplan", "BatchedConv"): conv.batched(generic),
            ("memplan", "InvertedResidual"): inverted_residual.inverted_residual(generic)}


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
