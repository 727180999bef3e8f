"""Fixtures the test modules share: `backend` runs a test on NumPy and again, marked gpu, on CuPy; `cupy` is the
CuPy module for GPU-only tests."""
import pytest

import planner
from executor import backends


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def backend(request):
    """The executor backend a test runs on; its CuPy run skips without CuPy and a CUDA GPU."""
    if request.param == "cupy":
        try:
            backends.get("cupy")
        except planner.MemplanError:
            pytest.skip("needs CuPy and a CUDA GPU")
    return request.param


@pytest.fixture
def cupy():
    """The cupy module; the test skips without CuPy and a CUDA GPU."""
    try:
        return backends.get("cupy").xp
    except planner.MemplanError:
        pytest.skip("needs CuPy and a CUDA GPU")
