"""The one process-wide setting memplan makes, before NumPy loads OpenBLAS: where the executor's compiled
kernels will run (numba installed, MEMPLAN_JIT not 0), OpenBLAS's threads sleep after 2^18 cycles (0.1 ms)
without a GEMM instead of 2^28 (0.1 s), so that they do not spin on the cores the next compiled loop needs:
mobilenet_v2 ran 1.6x faster and resnet50 1.2x, while bert_base's back-to-back GEMMs keep their threads
awake. Without the compiled kernels it is left alone (NumPy's passes between GEMMs would then wake them
up each time: 6% slower). It takes effect only where OpenBLAS loads after memplan; a value the user set
is kept."""
import os
from importlib.util import find_spec


def jit_wanted():
    """Whether MEMPLAN_JIT allows the compiled kernels (anything but 0, false, no or off)."""
    return os.environ.get("MEMPLAN_JIT", "1").strip().lower() not in ("0", "false", "no", "off")


def quiet_blas():
    """Set OPENBLAS_THREAD_TIMEOUT as the module says, where it is not set."""
    if jit_wanted() and find_spec("numba") is not None:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")


def cores():
    """The cores this process may run on: the compiled kernels' threads, fit's worker processes."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
