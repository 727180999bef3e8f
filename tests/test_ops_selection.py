"""The selection and scatter ops (planner/ops/selection.py, scatter.py) and CumProd: gradients against
finite differences, the forms the ONNX node tests leave out, and errors."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import planner
from executor import Executor, RunError
from test_autodiff import check, model, p, weighted


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, 1])
def test_cumprod_gradients_with_zeros(exclusive, reverse, axis):
    x = p(3, 4)
    x[1, 1] = x[2, 0] = x[2, 3] = 0.0  # products through a zero (and two zeros in one row)
    m = weighted([("CumProd", ["x", "axis"], ["a"], dict(exclusive=exclusive, reverse=reverse))], [3, 4],
                 dict(axis=np.array(axis, np.int64)), opset=26)
    check(m, x)
