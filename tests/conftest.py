"""Fixtures the test modules share: `backend` runs a test on NumPy and again, marked gpu, on CuPy; `cupy` is the
CuPy module for GPU-only tests. Without CuPy and a CUDA GPU the tests marked gpu are deselected as they are
collected, rather than started and skipped one by one."""
import pytest

import planner
from executor import backends


def _cuda():
    """Whether CuPy and a CUDA GPU are usable."""
    try:
        backends.get("cupy")
    except planner.MemplanError:
        return False
    return True


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def backend(request):
    """The executor backend a test runs on; its CuPy run skips without CuPy and a CUDA GPU."""
    if request.param == "cupy" and not _cuda():
        pytest.skip("needs CuPy and a CUDA GPU")
    return request.param


@pytest.fixture
def cupy():
    """The cupy module; the test skips without CuPy and a CUDA GPU."""
    if not _cuda():
        pytest.skip("needs CuPy and a CUDA GPU")
    return backends.get("cupy").xp


def pytest_collection_modifyitems(config, items):
    """Without CuPy and a CUDA GPU, deselect the tests marked gpu as they are collected."""
    if _cuda():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
