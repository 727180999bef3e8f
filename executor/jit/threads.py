"""How the compiled loops use the cores: with TBB installed (memplan[cpu] brings it where it has wheels),
numba's TBB threading layer runs them on every core, and it is safe both in several Python threads and in a
forked child; without it they run on one thread, since numba's other layers are not (GNU OpenMP's aborts a
child forked after it ran, the workqueue aborts on a second thread)."""
from importlib import metadata

import numba


def _tbb():
    try:
        metadata.version("tbb")
    except metadata.PackageNotFoundError:
        return False
    return True


PARALLEL = _tbb()
"""Whether the kernels compile with parallel=True."""
if PARALLEL:
    numba.config.THREADING_LAYER = "tbb"


def start():
    """Start numba's threading layer now (numba starts it at the first parallel loop or question about threads),
    raising its error here where it cannot: TBB's library does not load under a low address-space limit. Without
    TBB the loops are serial and numba chooses its layer when a kernel asks for the thread count."""
    if PARALLEL:
        numba.get_num_threads()
