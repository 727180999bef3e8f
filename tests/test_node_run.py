"""Every ONNX backend node test of a supported op, planned and run by the executor with poison on,
against the outputs the test ships."""
import numpy as np
import pytest

import planner
from executor import Executor
from node_cases import REFUSED, as_planned, params, supported_cases
from planner.errors import PlanError

CASES = supported_cases()
NOT_RUN = {**REFUSED, **{name: (PlanError, "strings have no place in a byte arena")
                         for name in ("test_equal_string", "test_equal_string_broadcast")}}


@pytest.mark.parametrize("case", params(CASES, NOT_RUN))
def test_node(case):
    model, inputs, expected = as_planned(case)
    plan = planner.compile(model, {k: np.shape(v) for k, v in inputs.items()}, schedule="file")
    feeds = {k: np.asarray(v) for k, v in inputs.items()}
    got = Executor(plan, backend="numpy", poison=True).run(feeds)
    for name, want in expected.items():
        want = np.asarray(want)
        assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
        if want.dtype.kind in "fc" or want.dtype.name in ("bfloat16",) or "float8" in want.dtype.name:
            np.testing.assert_allclose(got[name].astype(np.float64), want.astype(np.float64),
                                       rtol=case.rtol, atol=case.atol, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], want, err_msg=name)
