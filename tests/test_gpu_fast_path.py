"""The GPU's fast path (executor/backends): GEMMs on cuBLAS through nvmath, convolutions on cuDNN's graphs,
the whole plan replayed as one CUDA graph, and the device bytes an executor takes being its arena and the
libraries' handles. The GEMM's stride and batch logic is checked on the host too, against a stand-in cuBLAS
that computes column-major products from raw pointers as cuBLAS does."""
import ctypes
import os
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

import planner
from executor import Executor
from executor.backends import cublas
from zoo_cases import feeds, input_shapes, rel_l2, small_model

GRAPH_CASES = ("resnet50", "mobilenet_v2", "bert_base", "gpt2_small", "unet")


class Device(np.ndarray):
    """A host array posing as a device one: `.data.ptr` is its address, as on CuPy."""

    @property
    def data(self):
        return SimpleNamespace(ptr=self.ctypes.data)


def _at(ptr, dtype, shape, strides):
    """The array of `shape` and element `strides` at address `ptr` (a view of the memory, not a copy)."""
    dtype = np.dtype(dtype)
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
    raw = np.ctypeslib.as_array((ctypes.c_char * (extent * dtype.itemsize)).from_address(ptr))
    return np.lib.stride_tricks.as_strided(raw.view(dtype), shape, [s * dtype.itemsize for s in strides])


def stand_in_cublas():
    """A module with nvmath.bindings.cublas's names whose GEMMs compute C = alpha op(A) op(B) + beta C on host
    memory, column-major with leading dims, as cuBLAS does."""
    types = {0: np.float32, 1: np.float64, 2: np.float16}
    m = ModuleType("nvmath.bindings.cublas")
    m.Operation = SimpleNamespace(N=0, T=1)
    m.PointerMode = SimpleNamespace(HOST=0)
    m.Math = SimpleNamespace(DEFAULT_MATH=0, TF32_TENSOR_OP_MATH=3)
    m.ComputeType = SimpleNamespace(COMPUTE_32F=68)
    m.create = lambda: 1
    m.set_workspace = m.set_pointer_mode = m.set_math_mode = m.set_stream = lambda *args: None

    def batched(dtype, handle, ta, tb, rows, cols, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, count,
                scalar=None):
        scalar = scalar or dtype
        alpha = _at(alpha, scalar, (), ())[()]
        size = np.dtype(dtype).itemsize
        for i in range(count):
            left = _at(a + i * sa * size, dtype, (rows, k) if ta == 0 else (k, rows), (1, lda))
            right = _at(b + i * sb * size, dtype, (k, cols) if tb == 0 else (cols, k), (1, ldb))
            left, right = left if ta == 0 else left.T, right if tb == 0 else right.T
            _at(c + i * sc * size, dtype, (rows, cols), (1, ldc))[...] = alpha * (left.astype(np.float64)
                                                                                 @ right.astype(np.float64))

    m.sgemm = lambda h, ta, tb, r, c_, k, al, a, lda, b, ldb, be, c, ldc: batched(
        np.float32, h, ta, tb, r, c_, k, al, a, lda, 0, b, ldb, 0, be, c, ldc, 0, 1)
    m.dgemm = lambda h, ta, tb, r, c_, k, al, a, lda, b, ldb, be, c, ldc: batched(
        np.float64, h, ta, tb, r, c_, k, al, a, lda, 0, b, ldb, 0, be, c, ldc, 0, 1)
    m.sgemm_strided_batched = lambda h, ta, tb, r, c_, k, al, *rest: batched(np.float32, h, ta, tb, r, c_, k, al, *rest)
    m.dgemm_strided_batched = lambda h, ta, tb, r, c_, k, al, *rest: batched(np.float64, h, ta, tb, r, c_, k, al, *rest)
    m.gemm_ex = lambda h, ta, tb, r, c_, k, al, a, at, lda, b, bt, ldb, be, c, ct, ldc, compute, algo: batched(
        types[ct], h, ta, tb, r, c_, k, al, a, lda, 0, b, ldb, 0, be, c, ldc, 0, 1, scalar=np.float32)
    m.gemm_strided_batched_ex = (
        lambda h, ta, tb, r, c_, k, al, a, at, lda, sa, b, bt, ldb, sb, be, c, ct, ldc, sc, count, compute, algo:
        batched(types[ct], h, ta, tb, r, c_, k, al, a, lda, sa, b, ldb, sb, be, c, ldc, sc, count, scalar=np.float32))
    return m


@pytest.fixture
def host_gemm(monkeypatch):
    """cublas.Gemm over host arrays, its cuBLAS the stand-in; CuPy's parts (broadcast_to, matmul) NumPy's."""
    bindings = ModuleType("nvmath.bindings")
    bindings.cublas = stand_in_cublas()
    monkeypatch.setitem(sys.modules, "nvmath", ModuleType("nvmath"))
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublas", bindings.cublas)
    cupy = SimpleNamespace(broadcast_to=lambda x, shape: np.broadcast_to(x, shape, subok=True), matmul=None,
                           cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=0)))
    gemm = cublas.Gemm(cupy)
    gemm.cupy.matmul = lambda a, b, out: pytest.fail("the product fell back to CuPy's matmul")
    return gemm


def _operands(rng, dtype, case):
    """(a, b, out) as Device arrays: the operands' layouts that `case` names, out rows contiguous."""
    (batch_a, batch_b, m, k, n), layout = case

    def made(batch, rows, cols, how):
        if how == "t":  # the transpose of a contiguous matrix: contiguous columns
            contiguous = rng.standard_normal((*batch, cols, rows)).astype(dtype).view(Device)
            return contiguous.swapaxes(-1, -2)
        if how == "rows":  # every other row of a taller matrix: a row stride past the row's end
            return rng.standard_normal((*batch, 2 * rows, cols)).astype(dtype).view(Device)[..., ::2, :]
        return rng.standard_normal((*batch, rows, cols)).astype(dtype).view(Device)

    a, b = made(batch_a, m, k, layout[0]), made(batch_b, k, n, layout[1])
    batch = np.broadcast_shapes(batch_a, batch_b)
    wide = np.zeros((*batch, m, n + 3), dtype).view(Device)
    return a, b, wide[..., :n] if layout[2] == "rows" else np.zeros((*batch, m, n), dtype).view(Device)


GEMM_CASES = [(((), (), 5, 7, 3), ("c", "c", "c")), (((), (), 5, 7, 3), ("t", "c", "c")),
              (((), (), 5, 7, 3), ("c", "t", "c")), (((), (), 4, 6, 2), ("t", "t", "rows")),
              (((), (), 4, 6, 2), ("rows", "c", "rows")), (((), (), 1, 6, 1), ("c", "c", "c")),
              (((3,), (3,), 4, 5, 6), ("c", "c", "c")), (((2, 3), (2, 3), 4, 5, 6), ("c", "t", "c")),
              (((2, 3), (), 4, 5, 6), ("c", "c", "c")), (((), (3,), 4, 5, 6), ("t", "c", "c"))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", GEMM_CASES, ids=lambda c: "-".join(map(str, c[0])) + "-" + "".join(c[1]))
def test_cublas_gemm_takes_strided_and_batched_operands_as_numpy_multiplies_them(host_gemm, dtype, case):
    a, b, out = _operands(np.random.default_rng(0), dtype, case)
    host_gemm.matmul(a, b, out)
    want = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert rel_l2(out, want) < (2e-3 if dtype == np.float16 else 1e-6)


def test_cublas_gemm_leaves_to_cupy_what_one_call_cannot_take(host_gemm):
    """Integer products, operands strided in both dims, and batches whose strides do not collapse."""
    leftover = []
    host_gemm.cupy.matmul = lambda a, b, out: leftover.append(a.shape)
    rng = np.random.default_rng(1)
    ints = np.ones((2, 2), np.int64).view(Device)
    host_gemm.matmul(ints, ints, np.zeros((2, 2), np.int64).view(Device))
    both = rng.standard_normal((8, 8)).astype(np.float32).view(Device)[::2, ::2]
    host_gemm.matmul(both, both, np.zeros((4, 4), np.float32).view(Device))
    mixed = rng.standard_normal((2, 3, 4, 4)).astype(np.float32).view(Device)[:, ::2]
    host_gemm.matmul(mixed, mixed, np.zeros((2, 2, 4, 4), np.float32).view(Device))
    assert len(leftover) == 3


def _plan(case, batch=2):
    model = small_model(case)
    return planner.compile(model, input_shapes(model, batch), device="cuda"), feeds(model, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GRAPH_CASES)
def test_a_cuda_graph_replays_the_plan_as_numpy_runs_it_and_allocates_nothing(case, cupy):
    plan, inputs = _plan(case)
    want = Executor(plan, backend="numpy").run(inputs)
    ex = Executor(plan, backend="cupy", cuda_graph=True)
    first = ex.run(inputs)  # kernels one by one, then the capture
    assert ex.replay.graph is not None

    def refuse(nbytes):
        raise AssertionError(f"a replayed run allocated {nbytes} bytes of device memory")
    other = {k: v[::-1].copy() if v.dtype.kind == "f" else v for k, v in inputs.items()}
    with cupy.cuda.using_allocator(refuse):
        again, changed = ex.run(inputs), ex.run(other)
    for name, value in want.items():
        assert isinstance(again[name], np.ndarray)
        assert rel_l2(first[name], value) < 1e-4 and rel_l2(again[name], value) < 1e-4, name
    changed_want = Executor(plan, backend="numpy").run(other)
    for name, value in changed_want.items():
        assert rel_l2(changed[name], value) < 1e-4, name


def test_cuda_graph_mode_needs_the_gpu():
    plan, _ = _plan("mlp")
    with pytest.raises(planner.MemplanError, match="cupy backend"):
        Executor(plan, backend="numpy", cuda_graph=True)


@pytest.mark.gpu
def test_cuda_graph_mode_refuses_what_cannot_replay(cupy):
    plan, _ = _plan("mlp")
    with pytest.raises(planner.MemplanError, match="poison"):
        Executor(plan, backend="cupy", cuda_graph=True, poison=True)
    with pytest.raises(planner.MemplanError, match="profiling"):
        Executor(plan, backend="cupy", cuda_graph=True, profile=True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["resnet50", "mobilenet_v2", "unet", "densenet121"])
def test_convolutions_run_on_cudnn_as_on_numpy(case, cupy):
    pytest.importorskip("cudnn")
    plan, inputs = _plan(case)
    ex = Executor(plan, backend="cupy")
    assert ex.libraries["cudnn"] == "in use", ex.libraries
    convs = [s.name for s in plan.steps if s.op in ("Conv", "FusedConv")]
    declined = {name: why for name, why in ex.runtime.convs.declined.items() if name in convs}
    assert len(declined) < len(convs), declined
    got, want = ex.run(inputs), Executor(plan, backend="numpy").run(inputs)
    for name, value in want.items():
        assert rel_l2(got[name].get(), value) < 1e-4, name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_cublas_gemm_on_the_device_matches_cupy(dtype, cupy):
    pytest.importorskip("nvmath")
    gemm = cublas.Gemm(cupy)
    rng = np.random.default_rng(2)
    for (batch_a, batch_b, m, k, n), layout in GEMM_CASES:
        a = cupy.asarray(rng.standard_normal((*batch_a, m, k)).astype(dtype))
        b = cupy.asarray(rng.standard_normal((*batch_b, n, k)).astype(dtype)).swapaxes(-1, -2)
        out = cupy.zeros((*np.broadcast_shapes(batch_a, batch_b), m, n), dtype)
        gemm.matmul(a, b, out)
        want = np.matmul(a.get().astype(np.float64), b.get().astype(np.float64))
        assert rel_l2(out.get(), want) < (2e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") != "1",
                    reason="cudaMemGetInfo counts the whole device: run alone, not beside other workers (.ci/gpu does)")
@pytest.mark.parametrize("case", ["resnet50", "bert_base"])
def test_the_device_bytes_an_executor_takes_are_its_arena_once_the_library_handles_exist(case, cupy):
    from executor.backends import cupy_backend
    plan, inputs = _plan(case, batch=8)
    pool = cupy.get_default_memory_pool()
    Executor(plan, backend="cupy").run(inputs)  # the process's library handles, and their kernels loaded
    pool.free_all_blocks()
    before = cupy_backend.used_bytes()
    ex = Executor(plan, backend="cupy")
    ex.run(inputs)
    taken = cupy_backend.used_bytes() - before
    page = 2 << 20  # the driver's granularity
    assert plan.arena_bytes - page <= taken <= plan.arena_bytes * 1.01 + page, taken


@pytest.mark.parametrize("activation", ["Sigmoid", "Tanh", "Gelu-none", "Gelu-tanh", "Swish"])
def test_the_gpu_bias_activation_formulas_are_the_host_kernels(activation):
    """The CUDA expressions of executor/backends/cupy_fused.py, evaluated on the host, against
    planner/ops/bias_activation.py's NumPy forms of act and act'."""
    from scipy.special import erf
    from executor.backends import cupy_fused
    from planner.ops import bias_activation
    name, _, approximate = activation.partition("-")
    v = np.linspace(-6, 6, 241)
    step = SimpleNamespace(attrs={"activation": name, "approximate": approximate or "none", "alpha": 1.702})
    names = {"v": v, "alpha": 1.702, "exp": np.exp, "tanh": np.tanh, "erf": erf}
    for table, derivative in ((cupy_fused.VALUES, False), (cupy_fused.SLOPES, True)):
        entry = table[name]
        formula = entry[step.attrs["approximate"]] if isinstance(entry, dict) else entry
        got = eval(formula, {}, names)
        fn, attrs = bias_activation._options(step, derivative)
        want, t, u = v.copy(), np.empty_like(v), np.empty_like(v)
        fn(np, want, t, u, **attrs)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=f"{activation} derivative={derivative}")


@pytest.mark.parametrize("shape,strides,given", [
    ((2, 240, 1, 1), [240, 1, 1, 1], [240, 1, 240, 240]),  # 1x1 images: read as channels-last
    ((40, 240, 1, 1), [240, 1, 1, 1], [240, 1, 240, 240]),  # a 1x1 kernel
    ((1, 64, 1), [64, 1, 1], [64, 1, 64]),  # a 1-D conv's single position
    ((2, 64, 3, 3), [576, 9, 3, 1], [576, 9, 3, 1]),  # images larger than 1x1 keep their strides
    ((2, 64, 1, 1), [64, 2, 1, 1], [64, 2, 1, 1]),  # channels not contiguous: left as they are
])
def test_cudnn_reads_unit_images_as_channels_last(shape, strides, given):
    from executor.backends.cudnn_conv import unit_spatial
    assert unit_spatial(list(shape), strides) == given
