"""Shape rules and constant folding checked against the ONNX backend node tests' own outputs."""
import numpy as np
import pytest
from onnx import defs

import planner
from planner import ops
from planner.ops.detection import LENGTH
from node_cases import NO_CASES, as_planned, params, supported_cases

CASES = supported_cases()


@pytest.mark.parametrize("case", params(CASES))
def test_shapes_and_values(case):
    model, inputs, expected = as_planned(case)
    graph = planner.load(model, {k: np.shape(v) for k, v in inputs.items()})
    for name, want in expected.items():
        want = np.asarray(want)
        got = graph.tensors[name]
        if name + LENGTH in graph.outputs:  # planned at its bound
            assert got.shape[1:] == want.shape[1:] and got.shape[0] >= want.shape[0], name
        else:
            assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
        assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    values = {**inputs, **{t.name: t.data for t in graph.tensors.values() if t.data is not None}}
    for node in graph.nodes:
        schema = ops.of(node, graph.opsets)
        if schema.evaluate is None or not all(i in values for i in node.inputs if i):
            continue
        with np.errstate(all="ignore"):
            outs = schema.evaluate(node, *(values.get(i) for i in node.inputs))
        for name, got in zip(node.outputs, outs):
            values[name] = got
            if name in expected:
                np.testing.assert_allclose(np.asarray(got, dtype=expected[name].dtype), expected[name],
                                           rtol=case.rtol, atol=case.atol, err_msg=name)


def test_every_op_has_cases():
    """Each supported ONNX op is exercised by at least one backend node test (memplan's own training
    ops, of the memplan domain, by tests/test_training_plan.py; the ops onnx has no case for, where
    NO_CASES says)."""
    covered = {n.op_type for c in CASES for n in c.model.graph.node}
    onnx_ops = {op for domain, op in ops.SCHEMAS if not domain and defs.has(op)}  # not ONNX Runtime's own
    assert onnx_ops - covered == set(NO_CASES)


def test_views_are_the_reshaping_ops():
    views = {op for (domain, op), versions in ops.SCHEMAS.items() for _, s in versions if s.identity}
    assert views == {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "ParallelInput"}
