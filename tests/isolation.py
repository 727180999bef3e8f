"""Run a function in a forked child under a memory cap and a time cap, so that hostile input that
would exhaust either (or crash the interpreter) fails one test, not the test run."""
import os
import pickle
import resource
import signal
import sys
import traceback

import planner

MEMORY_CAP = 1 << 30
"""Address space a child may add to what the test process already holds."""
TIME_CAP = 60
"""Seconds a child may take."""


def isolated(fn, *args):
    """Run fn(*args) in a forked child under the caps: ("ok", value), ("error", MemplanError class name
    and message), or ("crash", traceback) for any other exception, a signal or the time cap."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            pages = int(open("/proc/self/statm").read().split()[0])
            limit = pages * os.sysconf("SC_PAGE_SIZE") + MEMORY_CAP
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.alarm(TIME_CAP)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            try:
                result = ("ok", fn(*args))
            except planner.MemplanError as e:
                result = ("error", f"{type(e).__name__}: {e}")
            except BaseException:
                result = ("crash", traceback.format_exc())
            with os.fdopen(write, "wb") as f:
                pickle.dump(result, f)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return "crash", f"the child ended without a result (wait status {status}: signal {status & 0x7f})"
    return pickle.loads(data)
