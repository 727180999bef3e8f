"""NegativeLogLikelihoodLoss, SwiGLU, MaxRoiPool and DeformConv beyond the backend node tests' cases:
gradients by finite differences, MaxRoiPool (which onnx ships no node case for) and DeformConv's forms
against onnxruntime, refusals."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner.errors import ShapeError
from test_autodiff import check, p, weighted

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("ignore", [None, 1])
@pytest.mark.parametrize("weights", [False, True])
def test_nll_gradients(reduction, ignore, weights):
    """(N, C, d1) log-probabilities: the label's, weighted, at each position; an ignored label gets none.
    The class weights are a constant, as in PyTorch they get no gradient."""
    labels = np.array([[0, 1, 2], [1, 2, 1]], np.int64)
    attrs = dict(reduction=reduction, **({} if ignore is None else dict(ignore_index=ignore)))
    w = ("Constant", [], ["w"], dict(value=numpy_helper.from_array(np.array([0.5, 2.0, 1.5]))))
    nodes = [w, ("NegativeLogLikelihoodLoss", ["x", "labels", "w"], ["a"], attrs)] if weights else \
        [("NegativeLogLikelihoodLoss", ["x", "labels"], ["a"], attrs)]
    m = weighted(nodes, [2, 3, 3], dict(labels=labels))
    check(m, p(2, 3, 3))


def test_nll_refusals():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    for labels, attrs, message in (([2, 3], {}, r"labels of shape \(2, 3\) do not index input of shape \(2, 3\)"),
                                   ([2], dict(reduction="max"), "reduction 'max' is not one of none, sum, mean")):
        node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y"], **attrs)
        graph = helper.make_graph([node], "nll", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(np.zeros(labels, np.int64), "t")])
        with pytest.raises(ShapeError, match=message):
            planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_swiglu_gradients(alpha):
    """Through the gate's Swish and the value, each a float64 input of the model (x, and a param)."""
    m = weighted([("SwiGLU", ["x", "v"], ["a"], dict(alpha=alpha))], [2, 5], dict(v=p(2, 5)), opset=28)
    check(m, p(2, 5))


def test_swiglu_refuses_broadcasting():
    fed = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("a", [2, 4]), ("b", [1, 4]))]
    graph = helper.make_graph([helper.make_node("SwiGLU", ["a", "b"], ["y"])], "swiglu", fed,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ShapeError, match=r"gate A \(2, 4\) float32 and value B \(1, 4\) float32 must have one shape"):
        planner.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 28)]))
