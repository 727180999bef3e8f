"""planner.forked.mapped: a function over items in forked workers, in order, as in this process; what a worker
raises comes back raised, whole or as a MemplanError where it would not cross a pickle."""
import multiprocessing

import pytest

from planner import MemplanError, forked

needs_fork = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")


class Unpicklable(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


def test_one_worker_runs_in_this_process():
    seen = []
    assert list(forked.mapped(lambda x: seen.append(x) or x * x, [3, 1, 2])) == [9, 1, 4]
    assert seen == [3, 1, 2]


@needs_fork
def test_workers_keep_the_order_and_run_closures():
    offset = 10
    assert list(forked.mapped(lambda x: x + offset, list(range(7)), workers=2)) == list(range(10, 17))


@needs_fork
def test_errors_cross_from_the_workers():
    def fail(x):
        if x == 2:
            raise ValueError("two")
        return x
    with pytest.raises(ValueError, match="two"):
        list(forked.mapped(fail, [1, 2, 3], workers=2))

    def odd(x):
        raise Unpicklable(x, "more")
    with pytest.raises(MemplanError, match="Unpicklable: 1 and more"):
        list(forked.mapped(odd, [1, 2], workers=2))


def test_ctrl_c_waits_until_the_forks_are_done():
    """A SIGINT that arrives while workers are forked is raised once the forking is over, not inside it."""
    import os
    import signal
    reached = False
    with pytest.raises(KeyboardInterrupt):
        with forked.forking():
            os.kill(os.getpid(), signal.SIGINT)
            reached = True
    assert reached
