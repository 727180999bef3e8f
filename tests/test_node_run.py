"""Every ONNX backend node test of a supported op, planned and run by the executor with poison on,
against the outputs the test ships."""
import numpy as np
import pytest

import planner
from executor import Executor
from node_cases import RANDOM, REFUSED, as_planned, assert_outputs, params, supported_cases
from planner.errors import PlanError

CASES = supported_cases()
NOT_RUN = {**REFUSED, **{name: (PlanError, "strings have no place in a byte arena")
                         for name in ("test_equal_string", "test_equal_string_broadcast")},
           **{name: (AssertionError, "the expected outputs carry float32 FFT rounding (1.9e-7 where the exact value "
                                     "is 0) beyond the case's atol of 1e-7; memplan's DFT gives 3e-15 there")
              for name in ("test_dft_inverse", "test_dft_inverse_opset19")}}


@pytest.mark.parametrize("case", params(CASES, NOT_RUN))
def test_node(case):
    model, inputs, expected = as_planned(case)
    plan = planner.compile(model, {k: np.shape(v) for k, v in inputs.items()}, schedule="file")
    feeds = {k: np.asarray(v) for k, v in inputs.items()}
    assert_outputs(Executor(plan, backend="numpy", poison=True).run(feeds), expected, case.rtol, case.atol,
                   values=case.name not in RANDOM)


ML_DTYPES = ("FLOAT8", "E4M3", "E5M2", "INT4", "UINT4", "FLOAT4", "BFLOAT16", "BF16", "INT2", "UINT2")
FMOD_EDGES = (AssertionError, "CuPy's float mod differs from NumPy's on infinities and signed zeros")
NOT_ON_GPU = {**{k: v for k, v in NOT_RUN.items() if not k.startswith("test_dft_inverse")},  # cuFFT's rounding is in
              **{c.name: (planner.MemplanError, "CuPy has no bfloat16, 8-, 4- or 2-bit types")
                 for c in CASES if any(t in c.name.upper() for t in ML_DTYPES)},
              **{f"test_mod_float_edge_cases_fmod_0_{t}": FMOD_EDGES for t in ("float16", "float32", "float64")},
              **{name: (planner.MemplanError, "CuPy has no multiplying scatter")
                 for name in ("test_scatternd_multiply", "test_scatter_elements_with_reduction_mul")}}


@pytest.mark.gpu
@pytest.mark.parametrize("case", params(CASES, NOT_ON_GPU))
def test_node_on_gpu(case):
    """The same cases on CuPy (correctness; the zoo tests check that running allocates nothing)."""
    from executor import backends
    try:
        backends.get("cupy")
    except planner.MemplanError:
        pytest.skip("needs CuPy and a CUDA GPU")
    model, inputs, expected = as_planned(case)
    plan = planner.compile(model, {k: np.shape(v) for k, v in inputs.items()}, schedule="file")
    got = Executor(plan, backend="cupy", poison=True).run({k: np.asarray(v) for k, v in inputs.items()})
    assert_outputs({k: v.get() for k, v in got.items()}, expected, max(case.rtol, 1e-5), max(case.atol, 1e-6),
                   values=case.name not in RANDOM)
