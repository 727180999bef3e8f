"""A first run does not wait for the compiled CPU kernels (executor/jit/compiling.py): on a cold numba cache a step
runs its NumPy kernel while a child process compiles its compiled one, the step switches once the child is done,
one line says that kernels compile, and none does when they come from the cache."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

pytest.importorskip("numba")

from executor import jit as compiled  # noqa: E402
from executor.jit import compiling  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POOL = (1, 3, 9, 9)

SCRIPT = """
import json, sys
import numpy as np
import onnx
import planner
from planner.cli import main
from executor import Executor
from executor.jit import compiling, conv

model, shape = sys.argv[1], tuple(int(d) for d in sys.argv[2].split("x"))
status = main(["run", model, "--input", "x:" + sys.argv[2], "--repeat", "1"])
plan = planner.compile(onnx.load(model), {"x": shape})
x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
want = Executor(plan, backend="numpy", jit=False).run({"x": x})["y"]
ex = Executor(plan, backend="numpy")
first = ex.run({"x": x})["y"]
ready = compiling.CHILD.wait(120)
after = ex.run({"x": x})["y"]
print(json.dumps(dict(status=status, ready=ready, deferred=compiling.deferred(), same=bool((first == want).all()
                      and (after == want).all()), loaded=sum(conv.max_pool.stats.cache_hits.values()))))
"""


def _pool_model(path):
    import onnx
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(POOL))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _run(model, cache):
    """SCRIPT's findings, its other output and its stderr, with numba's cache in `cache`."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT), MEMPLAN_JIT="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(model), "x".join(map(str, POOL))], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1]), done.stderr


def test_a_first_run_on_a_cold_cache_runs_numpy_kernels_while_a_child_compiles(tmp_path):
    """MaxPool, the kernel quickest to compile: its step runs NumPy's kernel and the command says so, then the
    compiled kernel the child put in the cache (loaded, never compiled here); the next process loads it from its
    first call, without a word."""
    model = tmp_path / "pool.onnx"
    _pool_model(model)
    got, out, err = _run(model, tmp_path / "cache")
    assert err.count("memplan: compiling the CPU kernels in the background") == 1 and "warning" not in err, err
    assert "; 1 step on the NumPy kernels while theirs compiled" in out
    assert got == {"status": 0, "ready": True, "deferred": 1, "same": True, "loaded": 1}, got
    got, out, err = _run(model, tmp_path / "cache")
    assert "compiling" not in err and "while theirs compiled" not in out and "with compiled kernels" in out
    assert got == {"status": 0, "ready": True, "deferred": 0, "same": True, "loaded": 1}, got


class _Child:
    """compiling.CHILD's stand-in: requests numbered in order, `done` as the test says."""

    def __init__(self):
        self.asked, self.done = [], set()

    def request(self, step, cache):
        self.asked.append((step, cache))
        return len(self.asked) - 1

    def compiled(self, number):
        return number in self.done


def test_a_deferred_step_runs_its_numpy_kernel_until_the_child_has_compiled_it(monkeypatch):
    child = _Child()
    monkeypatch.setattr(compiling, "CHILD", child)
    seen, cold = [], [True]

    def kernel(xp, step, ins, outs, ws):
        seen.append(("compiled", compiling._local.deferring))
        if cold[0] and compiling._local.deferring:
            raise compiling.Deferred("/cache")

    run = compiling.deferring(kernel, lambda xp, step, ins, outs, ws: seen.append(("numpy", step)))
    x, y = np.zeros((2, 3), np.float32), np.zeros(4, np.float64)

    def call():
        run(np, "step", [x, None], [y], {"cols": x})
    call()
    assert seen == [("compiled", True), ("numpy", "step")]
    assert child.asked == [(("step", [((2, 3), np.float32, True), None], [((4,), np.float64, True)],
                             {"cols": ((2, 3), np.float32, True)}), "/cache")]
    call()  # the child is not done: the NumPy kernel, and no second request
    assert seen[2:] == [("numpy", "step")] and len(child.asked) == 1
    child.done.add(0)
    call()  # done: the compiled kernel, compiling here whatever the step still misses
    assert seen[3:] == [("compiled", False)]
    cold[0] = False
    call()
    assert seen[4:] == [("compiled", True)] and len(child.asked) == 1
    cold[0] = True
    monkeypatch.setattr(compiling, "CHILD_BYTES", 8)  # arrays too large to hand the child: compiled here
    call()
    assert seen[5:] == [("compiled", True), ("compiled", False)] and len(child.asked) == 1


def test_the_one_line_says_so_once_and_a_deferred_compile_raises(monkeypatch, capsys):
    monkeypatch.setitem(compiling._once, "said", False)
    announcer = compiling._Announcer()

    class Ours:
        class py_func:
            __module__ = "executor.jit.conv"

        class stats:
            cache_path = "/somewhere"

    class Numbas(Ours):
        class py_func:
            __module__ = "numba.cpython.unicode"

    class Event:
        def __init__(self, dispatcher):
            self.data = {"dispatcher": dispatcher, "args": ()}

    announcer.on_start(Event(Numbas))
    assert capsys.readouterr().err == ""
    for _ in range(2):
        ev = Event(Ours)
        announcer.on_start(ev)
        announcer.on_end(ev)
    assert capsys.readouterr().err == "memplan: compiling the CPU kernels (first use; cached in /somewhere)\n"
    compiling._local.deferring = True
    try:
        with pytest.raises(compiling.Deferred):
            announcer.on_start(Event(Ours))
        announcer.on_start(Event(Numbas))  # numba's own functions compile inside ours: never deferred themselves
    finally:
        compiling._local.deferring = False


def test_a_child_that_fails_gives_the_compiled_kernels_up_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(compiled, "BROKEN", [])
    monkeypatch.setitem(compiling._once, "said", True)
    child = compiling.Child()
    with pytest.warns(RuntimeWarning, match="cannot be set up .*running the NumPy kernels"):
        child.request(("not a step", [], [], {}), str(tmp_path))
        assert not child.wait(120)
    assert compiled.BROKEN and child.pending() == 0
    assert child.process.wait(60) == 0  # asked nothing more, it has ended


def test_the_line_goes_above_an_open_progress_line():
    import io

    from planner.progress import Progress, note

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with Progress("memplan run", total=2, stream=stream) as bar:
        bar.update(1)
        note("memplan: compiling the CPU kernels")
    lines = [line.split("\r")[-1].rstrip() for line in stream.getvalue().split("\n")]
    assert lines[0] == "memplan: compiling the CPU kernels" and lines[1].startswith("memplan run: 1/2 ["), lines


def test_the_child_compiles_for_arrays_like_the_steps_own():
    """numba types a read-only array (a constant's) apart from a writeable one: the zeros the child runs a step's
    kernel on are read-only where the step's arrays are, so that the type the step needs is the one cached."""
    weights = np.ones((4, 3), np.float32)
    weights.flags.writeable = False
    ins = [np.ones((2, 4), np.float32), weights, None]
    zeros = compiling._zeros(compiling._specs(ins))
    assert [None if z is None else (z.shape, z.dtype, z.flags.writeable) for z in zeros] == \
        [((2, 4), np.float32, True), ((4, 3), np.float32, False), None]
    assert not any(z.any() for z in zeros if z is not None)
    ws = compiling._zeros(compiling._specs({"col": np.ones(5, np.float32)}))
    assert ws["col"].shape == (5,) and ws["col"].flags.writeable
