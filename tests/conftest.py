"""Fixtures the test modules share: `backend` runs a test on NumPy and again, marked gpu, on CuPy; `cupy` is the
CuPy module for GPU-only tests. Without CuPy and a CUDA GPU the tests marked gpu are deselected as they are
collected, rather than started and skipped one by one."""
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


def _cuda():
    try:
        backends.get("cupy")
    except planner.MemplanError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
