"""`mapped(f, items, workers)`: f over items in forked worker processes, yielded in order. The planner is pure
Python, so this is how independent plans (a pipeline's stages) use more than one core. `f` may be a closure: the
workers inherit it by fork, and only its results cross back, pickled."""
import multiprocessing
import pickle
import signal
import threading
from contextlib import contextmanager

from .errors import MemplanError

_WORK = None
"""The function the workers forked from this process run (set just before they fork)."""


def mapped(f, items, workers=1):
    """f(item) for each of `items`, in their order: one after the other in this process where `workers` is 1, fork
    is missing or this process is daemonic (which may fork no workers), else in `workers` forked processes. A
    generator closed early ends its workers."""
    workers = min(workers, len(items))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods() or \
            multiprocessing.current_process().daemon:
        yield from map(f, items)
        return
    global _WORK
    _WORK = f
    with forking():
        pool = multiprocessing.get_context("fork").Pool(workers)
    try:
        yield from pool.imap(_run, items)
    finally:
        _WORK = None
        pool.terminate()
        pool.join()


@contextmanager
def forking():
    """Fork inside it: Ctrl-C waits until the forks are done, as a KeyboardInterrupt raised in an at-fork hook
    (logging's) is printed and lost rather than stopping the command; the workers inherit SIGINT blocked, and the
    parent ends them. The mask holds this thread alone: a SIGINT another thread takes (a BLAS pool's, a test
    runner's) is held by a handler that keeps it, raised again once the forking is over."""
    held = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum)) if main else None
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if main:
            signal.signal(signal.SIGINT, previous)
            if held:
                signal.raise_signal(signal.SIGINT)


def portable(error):
    """`error`, or a MemplanError saying the same where it would not come back whole from a pickle (an exception
    whose arguments do not rebuild it), as what crosses from a worker must."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return MemplanError(f"{type(error).__name__}: {error}")


def _run(item):
    try:
        return _WORK(item)
    except Exception as e:
        raise portable(e) from None
