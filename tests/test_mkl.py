"""Host GEMMs on MKL (executor/mkl.py): every layout it takes gives NumPy's product, every one it cannot
read in place is declined with nothing written, MEMPLAN_MKL=0 turns it off, an Executor's `threads` cap reaches
it, and a whole model computes the same on MKL as with it switched off (NumPy's OpenBLAS, numba's np.dot)."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import planner
from executor import Executor, mkl
from frontends import zoo
from planner.ops import into

pytestmark = pytest.mark.skipif(not mkl.available(), reason="MKL is not installed (the memplan[cpu] extra)")

SHAPES = [(3, 4, 5), (1, 4, 5), (3, 1, 5), (3, 4, 1), (1, 1, 1), (7, 9, 2)]


def operands(rng, dtype, m, k, n, transposed_a, transposed_b):
    """A (m, k) and B (k, n), each a transposed view of a stored matrix where asked."""
    a = rng.standard_normal((k, m) if transposed_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transposed_b else (k, n)).astype(dtype)
    return a.T if transposed_a else a, b.T if transposed_b else b


def taken(a, b, out):
    """Whether mkl.matmul took the product; if so, out must be a @ b. NaN first, so that a skipped write shows."""
    out[...] = np.nan
    if not mkl.matmul(a, b, out):
        assert np.isnan(out).all(), "a declined product wrote its output"
        return False
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)
    return True


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("transposed_a,transposed_b", list(itertools.product((False, True), repeat=2)))
def test_matrices_and_stacks_by_their_strides(dtype, m, k, n, transposed_a, transposed_b):
    rng = np.random.default_rng(0)
    a, b = operands(rng, dtype, m, k, n, transposed_a, transposed_b)
    assert taken(a, b, np.empty((m, n), dtype))
    assert taken(a, b, np.empty((m, n + 3), dtype)[:, :n])  # a block of rows of a wider matrix
    assert taken(rng.standard_normal((m, k + 2)).astype(dtype)[:, :k], b, np.empty((m, n), dtype))
    stack_a, stack_b = rng.standard_normal((4, m, k)).astype(dtype), rng.standard_normal((4, k, n)).astype(dtype)
    assert taken(a, stack_b, np.empty((4, m, n), dtype))  # one matrix for every image: a conv's weights
    assert taken(stack_a, b, np.empty((4, m, n), dtype))
    assert taken(stack_a, stack_b, np.empty((4, m, n + 2), dtype)[:, :, :n])
    four_a, four_b = rng.standard_normal((2, 3, m, k)).astype(dtype), rng.standard_normal((2, 3, k, n)).astype(dtype)
    assert taken(four_a, four_b, np.empty((2, 3, m, n), dtype))  # batch dims that collapse into one


def test_what_it_cannot_read_in_place_is_declined():
    rng = np.random.default_rng(1)
    a, b = operands(rng, np.float32, 3, 4, 5, False, False)
    four_a, four_b = rng.standard_normal((2, 3, 3, 4)).astype(np.float32), rng.standard_normal((2, 3, 4, 5))
    assert not taken(a[::-1], b, np.empty((3, 5), np.float32))  # negative strides
    assert not taken(a, b, np.empty((5, 3), np.float32).T)  # an output with contiguous columns
    assert not taken(a, b.astype(np.float64), np.empty((3, 5), np.float64))  # mixed dtypes
    assert not taken(a.astype(np.float16), b.astype(np.float16), np.empty((3, 5), np.float16))
    assert not taken(four_a[:1], four_b.astype(np.float32), np.empty((2, 3, 3, 5), np.float32))  # broadcast batch
    four_b = four_b.astype(np.float32).transpose(1, 0, 2, 3)
    assert not taken(four_a.transpose(1, 0, 2, 3), four_b, np.empty((3, 2, 3, 5), np.float32))  # batch dims apart
    assert not taken(a, b[:, :1].reshape(4), np.empty(3, np.float32)[:, None])  # a vector
    overlapping = as_strided(np.empty(16, np.float32), (2, 3, 5), (4, 20, 4))  # 16: its last element
    assert not taken(a, np.ones((2, 4, 5), np.float32), overlapping)  # outputs that overlap


def test_overlapping_inputs_are_read_in_place():
    source = np.arange(40, dtype=np.float32)
    windows = as_strided(source, (4, 3, 5), (4, 20, 4))  # each matrix one element on from the last
    assert taken(windows, np.ones((4, 5, 2), np.float32), np.empty((4, 3, 2), np.float32))


def test_into_matmul_falls_back_to_numpy():
    out = np.empty((2, 2), np.float16)
    into.matmul(np, np.eye(2, dtype=np.float16), np.full((2, 2), 3, np.float16), out)
    np.testing.assert_array_equal(out, np.full((2, 2), 3, np.float16))


def test_memplan_mkl_0_turns_it_off():
    code = "from executor import mkl; print(mkl.available())"
    env = {**os.environ, "MEMPLAN_MKL": "0"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_executor_thread_cap_reaches_mkl():
    from threadpoolctl import threadpool_info
    plan = planner.compile(zoo.build("mlp"), {"input": (4, 784)})
    executor = Executor(plan, backend="numpy", threads=1)
    seen = []

    def spy(a, b, out):
        seen.extend(p["num_threads"] for p in threadpool_info() if p["internal_api"] == "mkl")
        return mkl.matmul(a, b, out)
    into.install(np, spy)
    try:
        executor.run({"input": np.ones((4, 784), np.float32)})
    finally:
        into.install(np, mkl.gemm)
    assert seen and set(seen) == {1}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_a_model_computes_the_same_with_mkl_switched_off(name):
    from executor.jit import blas
    plan = planner.compile(zoo.build(name, resolution=64, classes=10), {"input": (2, 3, 64, 64)})
    feeds = {"input": np.random.default_rng(2).standard_normal((2, 3, 64, 64), dtype=np.float32)}
    executor = Executor(plan, backend="numpy")
    ours = {k: v.copy() for k, v in executor.run(feeds).items()}
    on_mkl = blas.sgemm()
    with mkl.switched_off():
        assert not mkl.available() and not mkl.matmul(np.eye(2), np.eye(2), np.empty((2, 2)))
        assert blas.sgemm() is not on_mkl  # the compiled kernels' GEMM: numba's np.dot
        theirs = executor.run(feeds)
    assert mkl.available() and blas.sgemm() is on_mkl
    for name, value in ours.items():
        np.testing.assert_allclose(value, theirs[name], rtol=1e-4, atol=1e-4)


def test_the_executors_gemm_leaves_a_few_rows_to_numpy():
    """mkl.gemm: a product of FEW_ROWS rows or fewer (a decoded token's) is NumPy's BLAS's; more, MKL's."""
    b = np.ones((8, 3), np.float32)
    assert not mkl.gemm(np.ones((mkl.FEW_ROWS, 8), np.float32), b, np.empty((mkl.FEW_ROWS, 3), np.float32))
    out = np.empty((mkl.FEW_ROWS + 1, 3), np.float32)
    assert mkl.gemm(np.ones((mkl.FEW_ROWS + 1, 8), np.float32), b, out) == mkl.available()
