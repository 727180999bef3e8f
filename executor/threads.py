"""The cores the executor's host kernels (and fit's worker processes) may run on: the executor's question, never
the planner's, so that a plan is the same whatever machine makes it."""
import os


def cores():
    """The cores this process may run on: the compiled kernels' threads, fit's worker processes."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
