"""Compiling the CPU kernels without making a run wait. numba compiles a kernel the first time it meets its
argument types and caches the result (beside this package, or in NUMBA_CACHE_DIR), so only a machine's first run
pays: a minute of one core for mobilenet_v2's kernels. A table made `deferring` (the Executor's default, jit=None)
does not wait: a step whose kernel would compile runs its shared NumPy kernel, and a child process runs the
compiled kernel on zeros of the step's shapes, compiling into numba's cache whatever the step needs; the step
runs compiled from its first call after the child has done so (loaded from the cache; a step runs whole on one
form or the other). Told jit=True, kernels compile in the process. Either way one line on stderr says that they
compile; none when they come from the cache."""
import base64
import os
import pickle
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from numba.core import event

from planner.progress import note

OURS = __name__.rpartition(".")[0] + "."
"""The prefix of the modules whose compilation is ours to defer and announce."""
CHILD_BYTES = 1 << 30
"""A step whose arrays take more than this compiles in the process: the child would hold them a second time."""
_lock = threading.Lock()
_local = threading.local()
_once = {"listening": False, "said": False}
"""Whether this process listens to numba's compile events, and whether it has said that kernels compile."""


class Deferred(Exception):
    """A kernel met argument types it was not compiled for, under `deferring`; its cache is at `cache`."""

    def __init__(self, cache):
        super().__init__("a compiled kernel is not in numba's cache yet")
        self.cache = cache


class CompileFailed(Exception):
    """The child process could not compile a step's kernels (its one-line reason)."""


class _Announcer(event.Listener):
    """numba's compile events (a kernel compiling, not one loaded from the cache): under `deferring` one of ours is
    deferred; otherwise it compiles here, with the kernels it calls, and the first of ours says so, once a
    process."""

    def on_start(self, ev):
        dispatcher = ev.data["dispatcher"]
        if not dispatcher.py_func.__module__.startswith(OURS):
            return
        if getattr(_local, "deferring", False):
            raise Deferred(dispatcher.stats.cache_path)
        announce(dispatcher.stats.cache_path)

    def on_end(self, ev):
        pass


def install():
    """Listen to numba's compile events (once a process)."""
    with _lock:
        if not _once["listening"]:
            _once["listening"] = True
            event.register("numba:compile", _Announcer())


def announce(cache, meanwhile=""):
    """The one line, the first time a process compiles a kernel (into `cache`; `meanwhile`: what runs while it
    compiles elsewhere)."""
    with _lock:
        if _once["said"]:
            return
        _once["said"] = True
    note(f"memplan: compiling the CPU kernels{meanwhile} (first use; cached in {cache})")


def deferring(kernel, generic):
    """`kernel`, running `generic` (the shared kernel) in its place for a step whose compiled kernel the child
    process is compiling. Once the child has compiled it, whatever the step still misses compiles here, as it does
    for a step whose arrays are too large to hand the child (CHILD_BYTES)."""
    waiting = {}
    """{id(step): the child's request for it}"""

    def run(xp, step, ins, outs, ws):
        asked = waiting.get(id(step))
        if asked is not None and not CHILD.compiled(asked):
            return generic(xp, step, ins, outs, ws)
        try:
            result = _calling(kernel, asked is None, xp, step, ins, outs, ws)
        except Deferred as e:
            if _arrays_bytes(ins, outs, ws) > CHILD_BYTES:
                return _calling(kernel, False, xp, step, ins, outs, ws)
            waiting[id(step)] = CHILD.request((step, _specs(ins), _specs(outs), _specs(ws)), e.cache)
            return generic(xp, step, ins, outs, ws)
        waiting.pop(id(step), None)
        return result
    return run


def _calling(kernel, defer, *args):
    """kernel(*args), its compiling deferred (raising Deferred) when `defer`, else done here."""
    _local.deferring = defer
    try:
        return kernel(*args)
    finally:
        _local.deferring = False


def deferred():
    """How many steps this process has run on their NumPy kernels while the child process compiled theirs."""
    return len(CHILD.asked) if CHILD.owner == os.getpid() else 0


def _arrays_bytes(*groups):
    """The bytes of the arrays in `groups` (lists with None for omitted ones, or dicts)."""
    return sum(a.nbytes for group in groups for a in (group.values() if isinstance(group, dict) else group)
               if a is not None)


def _specs(arrays):
    """(shape, dtype, writeable) of each array (None for an omitted one), which the child makes zeros of: numba
    compiles a read-only array (a constant's) as another type than a writeable one."""
    if isinstance(arrays, dict):
        return {name: (a.shape, a.dtype, a.flags.writeable) for name, a in arrays.items()}
    return [None if a is None else (a.shape, a.dtype, a.flags.writeable) for a in arrays]


def _zeros(specs):
    """Arrays of zeros as `_specs` describes them."""
    def zeros(shape, dtype, writeable):
        array = np.zeros(shape, dtype)
        array.flags.writeable = writeable
        return array
    if isinstance(specs, dict):
        return {name: zeros(*spec) for name, spec in specs.items()}
    return [None if spec is None else zeros(*spec) for spec in specs]


class Child:
    """The process compiling deferred steps' kernels into numba's cache: one a process, started at the first
    request. It reads requests on its stdin and answers each on its stdout once compiled; when this process ends
    (its stdin closes) it compiles what it was asked and stops, so that the next run finds them cached."""

    def __init__(self):
        self.changed = threading.Condition()
        self.owner = None
        self._reset()

    def _reset(self):
        self.process, self.asked, self.done, self.failed = None, {}, set(), False

    def compiled(self, number):
        """Whether the child has compiled the kernels of request `number`."""
        return number in self.done

    def pending(self):
        """How many requests the child has not answered."""
        return 0 if self.failed or self.owner != os.getpid() else len(self.asked) - len(self.done)

    def request(self, step, cache):
        """The number of the request to compile the kernels of `step` (the step, its arrays' specs) into `cache`,
        asked once; the child starts at the first. One that cannot start or fails gives the compiled kernels up
        for the process, with one warning."""
        from . import give_up
        data = pickle.dumps(step)
        with self.changed:
            if self.owner != os.getpid():  # none yet, or a forked process's copy of its parent's
                self.owner = os.getpid()
                self._reset()
            if data in self.asked:
                return self.asked[data]
            number = self.asked[data] = len(self.asked)
            if self.failed:
                return number
            try:
                if self.process is None:
                    self._start()
                    announce(cache, " in the background, the NumPy kernels running meanwhile")
                self.process.stdin.write(base64.b64encode(pickle.dumps((number, step, cache))) + b"\n")
                self.process.stdin.flush()
            except OSError as e:
                self.failed = True
                give_up(e, stacklevel=4)
        return number

    def wait(self, timeout=None):
        """Wait until the child has answered every request, or `timeout` seconds have passed; whether it has
        compiled them all."""
        with self.changed:
            self.changed.wait_for(lambda: self.failed or not self.pending(), timeout)
            return not self.failed and not self.pending()

    def _start(self):
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
                   NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        errors = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-c", SERVE],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env)
        threading.Thread(target=self._read, args=(self.process, errors), daemon=True).start()

    def _read(self, process, errors):
        """Mark each answered request compiled; on a failure (an answer saying so, or a child that ended with
        requests unanswered), give the compiled kernels up with its reason."""
        for line in process.stdout:
            number, _, reason = line.decode().rstrip("\n").partition(" ")
            if reason:
                return self._fail(reason)
            with self.changed:
                self.done.add(int(number))
                self.changed.notify_all()
        if process.wait() == -signal.SIGINT:  # Ctrl-C reached it too: the NumPy kernels go on, without a word
            self._fail(None)
        elif process.returncode:
            errors.seek(0)
            lines = errors.read().decode(errors="replace").strip().splitlines()
            self._fail(lines[-1] if lines else f"exit status {process.returncode}")

    def _fail(self, reason):
        """Give the compiled kernels up for `reason` (none: without a word), let the child end, and wake whoever
        waits."""
        from . import give_up
        if reason:
            give_up(CompileFailed(reason), stacklevel=1)
        with self.changed:
            self.failed = True
            try:
                self.process.stdin.close()
            except OSError:  # it has ended already
                pass
            self.changed.notify_all()


CHILD = Child()


SERVE = f"from executor.backends import numpy_backend; from {__name__} import serve; serve(numpy_backend.table(True))"
"""The child's program: `serve` with the NumPy backend's kernel table, the compiled kernels over the shared ones."""


def serve(table):
    """The child: for each request read from stdin, run the step's kernel in `table` on zeros of its arrays' shapes
    (numba compiles what it needs into its cache, one compile at a time among the processes sharing that cache),
    answering 'NUMBER' on stdout once done or 'NUMBER reason' where it failed. Whatever else writes on stdout
    (numba's debug switches) goes to stderr."""
    from executor import kernels

    from . import BROKEN, reason
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    if hasattr(os, "nice"):
        os.nice(10)
    requests = queue.Queue()
    threading.Thread(target=_queue_lines, args=(sys.stdin.buffer, requests), daemon=True).start()
    for line in iter(requests.get, None):
        number, (step, ins, outs, ws), cache = pickle.loads(base64.b64decode(line))
        try:
            with _one_at_a_time(cache):
                kernels.find(table, step)(np, step, _zeros(ins), _zeros(outs), _zeros(ws))
            answer = f"{number}" + (f" {reason(BROKEN[0])}" if BROKEN else "")
        except Exception as e:  # numba's own failures have no common class
            answer = f"{number} {reason(e)}"
        try:
            print(answer, file=answers, flush=True)
        except BrokenPipeError:  # the process that asked has ended: keep filling the cache
            answers = open(os.devnull, "w")


def _queue_lines(stream, lines):
    """Put each line of `stream` in the queue `lines` as it comes (so that the process asking never waits on a
    full pipe), then None."""
    for line in stream:
        lines.put(line)
    lines.put(None)


@contextmanager
def _one_at_a_time(directory):
    """A lock on numba's cache directory across processes (a second child loads from the cache what the first
    compiled); none where flock is not available."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(os.path.join(directory, "memplan-compiling.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
