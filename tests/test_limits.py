"""Running what cannot fit: the arena, the output copies and the random feeds are measured against the memory the
process can get (available memory, a memory cgroup, ulimit -v and -d) and refused in one line naming both sizes;
an allocation that fails anyway is the same one line. A numba whose threading layer cannot start leaves the NumPy
kernels, with one warning."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

import planner
from executor import Executor, OutOfMemoryError, check_memory, random_feeds
from executor import jit as compiled
from executor.backends import cupy_backend, memory, numpy_backend
from planner import Config, cli

GIB = 1 << 30


def model(path, nodes, inputs, initializers=()):
    """An ONNX file of float32 `nodes` with `inputs` {name: dims} and one output, y."""
    graph = helper.make_graph(nodes, "limits", [helper.make_tensor_value_info(n, TensorProto.FLOAT, d)
                                                for n, d in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers))
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def memplan(*argv, limit=None, prelude=""):
    """Run the memplan command in a child whose address space is held to `limit` bytes (ulimit -v), after the
    Python `prelude`."""
    def held():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    code = f"{prelude}\nimport sys\nfrom planner.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                          preexec_fn=held if limit else None)


def test_a_4gib_output_under_an_address_space_limit_is_one_line(tmp_path):
    shape = numpy_helper.from_array(np.array([GIB], np.int64), "shape")
    path = model(tmp_path / "expand.onnx", [helper.make_node("Expand", ["x", "shape"], ["y"])], {"x": [1]}, [shape])
    done = memplan("run", path, "--backend", "numpy", limit=3 * GIB)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("memplan: error: not enough memory for random feeds of the inputs x (4 B) and the "
                                  "arena (4.00 GiB): 4.00 GiB (4,294,967,556 bytes) needed, "), done.stderr
    assert "available under the address-space limit (ulimit -v 3.00 GiB, " in done.stderr, done.stderr


def test_16gib_of_random_feeds_are_refused_before_any_is_made(tmp_path, monkeypatch, capsys):
    path = model(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])], {"x": ["n", "m"]})
    monkeypatch.setattr(memory, "_available", lambda meminfo: (12 * GIB, "available on the host"))
    assert cli.main(["run", path, "--input", "x:4x1073741824", "--backend", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memplan: error: not enough memory for random feeds of the inputs "
                                                   "x: 16.00 GiB (17,179,869,184 bytes) needed, "), err


def test_the_room_is_the_tightest_limit_known(monkeypatch):
    for name, room in (("_available", 9), ("_committable", 7), ("_cgroup", None)):
        monkeypatch.setattr(memory, name, lambda *args, room=room, name=name: room and (room, name))
    monkeypatch.setattr(memory, "_rlimit", lambda kind, *args: (8, kind) if kind == "RLIMIT_AS" else None)
    assert memory.host_room() == (7, "_committable")
    with pytest.raises(OutOfMemoryError, match=r"^not enough memory for the arena: 8 B \(8 bytes\) needed, 7 B "
                                               r"\(7 bytes\) _committable; use a smaller batch$"):
        numpy_backend.check_room(8, "the arena")
    numpy_backend.check_room(7, "the arena")


@pytest.mark.parametrize("version, files, room", [
    ("v2", {"memory.max": "1073741824", "memory.current": "805306368",
            "memory.stat": "anon 1\ninactive_file 268435456"}, 512 << 20),
    ("v2", {"memory.max": "max", "memory.current": "5", "memory.stat": ""}, None),
    ("v1", {"memory.limit_in_bytes": "2147483648", "memory.usage_in_bytes": "2147483648",
            "memory.stat": "total_inactive_file 0"}, 0),
    ("v1", {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": "1", "memory.stat": ""}, None),
])
def test_a_memory_cgroup_is_its_limit_less_what_it_holds(tmp_path, monkeypatch, version, files, room):
    root, *names = memory.CGROUPS[version]
    group = tmp_path / "fs" / "job" / "task"
    group.mkdir(parents=True)
    for name, text in files.items():
        (group / name).write_text(text + "\n")
    (tmp_path / "cgroup").write_text("0::/job/task\n" if version == "v2" else "4:memory:/job/task\n1:cpu:/\n")
    monkeypatch.setitem(memory.CGROUPS, version, (str(tmp_path / "fs"), *names))
    real_open = open
    monkeypatch.setattr(memory, "open", lambda path, *a: real_open(tmp_path / "cgroup" if path == "/proc/self/cgroup"
                                                                    else path, *a), raising=False)
    found = memory._cgroup()
    assert (found and found[0]) == room
    if room is not None:
        assert found[1].startswith("available in the memory cgroup (limit ")


def test_an_allocation_that_fails_anyway_is_the_same_one_line(monkeypatch):
    plan = planner.compile("zoo:mlp", {"input": (2, 784)})

    def refused(*args, **keywords):
        raise MemoryError("Unable to allocate 4.00 GiB for an array with shape (4294967296,) and data type uint8\n"
                          "and more")

    monkeypatch.setattr(numpy_backend, "room", lambda config=None: None)
    monkeypatch.setattr("executor.Arena", refused)
    with pytest.raises(OutOfMemoryError, match=r"^not enough memory for the arena: .* needed \(the allocation failed: "
                                               r"Unable to allocate 4.00 GiB .* uint8\); use a smaller batch$"):
        Executor(plan, backend="numpy")
    monkeypatch.setattr("executor.feeds._random", refused)
    with pytest.raises(OutOfMemoryError, match=r"^not enough memory for random feeds of the inputs input: 6.12 KiB "
                                               r"\(6,272 bytes\) needed \(the allocation failed: Unable"):
        random_feeds(plan)


def test_a_device_counts_what_it_holds_and_the_host_the_rest(monkeypatch):
    plan = planner.compile("zoo:mlp", {"input": (2, 784)})
    outputs = sum(plan.tensors[n].nbytes for n in plan.outputs)
    monkeypatch.setattr(cupy_backend, "free_bytes", lambda: plan.arena_bytes)
    monkeypatch.setattr(numpy_backend, "room", lambda config=None: (10 ** 6, "available on the host"))
    free = Config(pool_reserve_percent=0)
    with pytest.raises(OutOfMemoryError, match=r"the arena \(.*\) and the copies of the outputs a run returns \(.*\): "
                                               rf".*\({plan.arena_bytes + outputs:,} bytes\) needed, .* usable on the "
                                               r"device"):
        check_memory(plan, cupy_backend, free, feeds=True)
    check_memory(plan, cupy_backend, free, feeds=True, cuda_graph=True)  # a replay's outputs are host arrays
    feeds = plan.tensors["input"].nbytes
    monkeypatch.setattr(numpy_backend, "room", lambda config=None: (feeds, "available on the host"))
    with pytest.raises(OutOfMemoryError, match=r"random feeds of the inputs input \(.*\) and the copies .* available "
                                               r"on the host"):
        check_memory(plan, cupy_backend, free, feeds=True, cuda_graph=True)

    class DeviceOutOfMemory(MemoryError):
        """What cupy.cuda.memory.OutOfMemoryError is."""

    with pytest.raises(OutOfMemoryError, match=r"for the arena: .* usable on the device .* \(the allocation failed: "
                                               r"Out of memory allocating 512 bytes\)"):
        with cupy_backend.allocating(512, "the arena", free):
            raise DeviceOutOfMemory("Out of memory allocating 512 bytes")


def tbb():
    """Whether the compiled kernels run on numba's TBB threading layer here."""
    if not compiled.available():
        return False
    from executor.jit import threads
    return threads.PARALLEL


NO_TBB = 'import sys\nsys.modules["numba.np.ufunc.tbbpool"] = None  # its library does not load, as under ulimit -v'


@pytest.mark.skipif(not tbb(), reason="numba's TBB threading layer is not installed")
def test_a_threading_layer_that_cannot_start_leaves_the_numpy_kernels_with_one_warning():
    checks = textwrap.dedent("""
        import warnings
        import numpy as np
        from executor import Executor, random_feeds
        import planner
        code = main(["run", "zoo:lenet", "--batch", "2", "--repeat", "1", "--backend", "numpy"])
        plan = planner.compile("zoo:lenet", {"input": (2, 1, 28, 28)})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # told once in the process: the command's warning was the one
            ex = Executor(plan, backend="numpy")
        feeds = random_feeds(plan)
        want = Executor(plan, backend="numpy", jit=False).run(feeds)
        same = all(np.array_equal(want[n], v) for n, v in ex.run(feeds).items())
        print("exit", code, "compiled", ex.jit, "same", same)
        """)
    done = subprocess.run([sys.executable, "-c", f"{NO_TBB}\nfrom planner.cli import main\n{checks}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == (
        "memplan: warning: the compiled CPU kernels cannot be set up (ValueError: No threading layer could be "
        "loaded.); running the NumPy kernels\n"), done.stderr
    assert "compiled kernels" not in done.stdout and done.stdout.endswith("exit 0 compiled False same True\n")


@pytest.mark.skipif(not compiled.available(), reason="numba is not installed")
def test_a_kernel_numba_cannot_compile_gives_the_compiled_kernels_up(monkeypatch):
    from numba.core.errors import TypingError

    from executor.jit import conv

    def uncompilable(*args):
        raise TypingError("Failed in nopython mode pipeline (step: nopython frontend)\nmore lines")

    monkeypatch.setattr(compiled, "BROKEN", [])
    monkeypatch.setattr(conv, "max_pool", uncompilable)
    plan = planner.compile("zoo:lenet", {"input": (2, 1, 28, 28)})
    feeds = random_feeds(plan)
    want = Executor(plan, backend="numpy", jit=False).run(feeds)
    ex = Executor(plan, backend="numpy", jit=True)
    with pytest.warns(RuntimeWarning, match=r"cannot be set up \(TypingError: Failed in nopython mode pipeline "
                                            r"\(step: nopython frontend\)\); running the NumPy kernels$"):
        got = ex.run(feeds)
    assert all(np.allclose(got[n], want[n], rtol=1e-5, atol=1e-6) for n in want)
    assert not Executor(plan, backend="numpy").jit
    with pytest.raises(planner.MemplanError, match="TypingError"):
        Executor(plan, backend="numpy", jit=True)
