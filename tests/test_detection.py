"""NonMaxSuppression planned at its bound: the kept rows, -1 rows after them, and their number beside."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import planner
from zoo_cases import run_on


def nms_model(read_by_gather=False, keep=5):
    inits = [numpy_helper.from_array(np.array([keep], np.int64), "keep"),
             numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.1], np.float32), "low")]
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "keep", "iou", "low"], ["selected"])]
    outputs = [helper.make_tensor_value_info("selected", T.INT64, None)]
    if read_by_gather:
        nodes.append(helper.make_node("Gather", ["scores", "selected"], ["picked"]))
        outputs = [helper.make_tensor_value_info("picked", T.FLOAT, None)]
    graph = helper.make_graph(nodes, "nms", [helper.make_tensor_value_info("boxes", T.FLOAT, [2, 50, 4]),
                                             helper.make_tensor_value_info("scores", T.FLOAT, [2, 3, 50])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_planned_at_its_bound_with_its_length_beside(backend):
    rng = np.random.default_rng(0)
    corner = rng.uniform(0, 10, (2, 50, 2)).astype(np.float32)
    feeds = {"boxes": np.concatenate([corner, corner + rng.uniform(1, 4, (2, 50, 2)).astype(np.float32)], -1),
             "scores": rng.uniform(0, 1, (2, 3, 50)).astype(np.float32)}
    m = nms_model()
    plan = planner.compile(m)
    assert plan.tensors["selected"].shape == (2 * 3 * 5, 3) and "selected.length" in plan.outputs
    got = run_on(backend, plan, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    n = int(got["selected.length"])
    assert n == len(want) and (got["selected"][n:] == -1).all()
    np.testing.assert_array_equal(got["selected"][:n], want)


def test_a_bounded_output_that_another_node_reads_is_refused():
    with pytest.raises(planner.ShapeError, match="only where it is a graph output"):
        planner.compile(nms_model(read_by_gather=True))
