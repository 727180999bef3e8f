"""Depthwise convolutions (each group reads one channel): the kernel works every channel at once, tap by
tap, and matches onnxruntime whatever the chunks the workspace limit makes, its products in no more scratch
than the columns of a GEMM per group would take or planner.ops.nn.PRODUCTS (1 MiB)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner import Config

CASES = {  # name: (x shape, w shape, attrs)
    "3x3": ((2, 8, 9, 9), (8, 1, 3, 3), dict(pads=[1, 1, 1, 1])),
    "strided": ((3, 6, 12, 11), (6, 1, 3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2])),
    "multiplier 3": ((2, 4, 7, 7), (12, 1, 3, 3), dict(pads=[1, 1, 1, 1])),
    "dilated 5x5": ((1, 5, 16, 16), (5, 1, 5, 5), dict(dilations=[2, 2], pads=[4, 4, 4, 4])),
    "same_upper": ((2, 3, 10, 7), (3, 1, 4, 2), dict(auto_pad="SAME_UPPER", strides=[2, 1])),
    "1-d": ((4, 6, 30), (6, 1, 7), dict(pads=[3, 2])),
    "3-d": ((2, 4, 5, 6, 7), (8, 1, 3, 3, 3), dict(pads=[1] * 6)),
}


def model(x_shape, w_shape, bias, **attrs):
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[:1]).astype(np.float32), "b"))
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], group=x_shape[1], **attrs)
    graph = helper.make_graph([node], "depthwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("limit", [1, 700, 64 * 2 ** 20])
@pytest.mark.parametrize("jit", [False, None])
def test_depthwise_matches_onnxruntime_in_any_chunks(case, limit, jit):
    import onnxruntime as ort
    x_shape, w_shape, attrs = CASES[case]
    m = model(x_shape, w_shape, bias=limit == 700, **attrs)
    plan = planner.compile(m, {"x": x_shape}, config=Config(workspace_limit=limit))
    step = next(s for s in plan.steps if s.op == "Conv")
    assert [c.name for c in step.scratch] == ["product"]
    x = np.random.default_rng(0).standard_normal(x_shape, dtype=np.float32)
    got = Executor(plan, backend="numpy", poison=True, jit=jit).run({"x": x})["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mobilenets_largest_scratch_stays_its_first_convs_columns():
    """mobilenet_v2's arena is the one the GEMM per group planned: its largest scratch is the first conv's
    columns (27 x 112 x 112 floats an image), which the depthwise products stay within (its depthwise convs
    as convs: not fused into memplan.InvertedResidual, whose scratch tests/test_inverted_residual.py checks)."""
    for batch in (1, 8):
        plan = planner.compile("zoo:mobilenet_v2", {"input": (batch, 3, 224, 224)}, inverted_residual=False)
        assert plan.stats["workspace"]["largest"] == batch * 27 * 112 * 112 * 4
