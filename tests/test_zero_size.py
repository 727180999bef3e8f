"""Every registered op on a zero-size tensor (a batch of 0, or another dim of 0 where the op has no
batch), planned and run with poison on against onnxruntime (or ONNX's reference, or the known result of
memplan's own ops); the edge cases where an empty input gives a non-empty output; where the op has no
value on an empty input, memplan refuses it with a one-line ShapeError, as onnxruntime does. Every
strategy and workspace mode plans zero-byte tensors, and a training step runs on an empty batch."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from node_cases import assert_outputs
from planner import ops
from planner.errors import ShapeError
from planner.ir import op_name
from zero_size_cases import CASES, EDGES, Loopback, build, k, oracle, w
from zoo_cases import input_shapes, run_on, small_model


def check(c, backend):
    """The case planned and run on `backend` with poison on, against its oracle; or, `refused`, a one-line
    ShapeError naming the node, where the oracle fails too."""
    m, feeds = build(c)
    shapes = {name: value.shape for name, value in feeds.items()}
    if c.refused:
        with pytest.raises(ShapeError) as refusal:
            planner.compile(m, shapes)
        assert "\n" not in str(refusal.value) and f"({op_name(c.domain, c.op)})" in str(refusal.value)
        if c.domain != "memplan":
            with pytest.raises(Exception):  # onnxruntime's errors have no common class but Exception
                oracle(c, m, feeds)
        return
    plan = planner.compile(m, shapes, schedule="file")
    group = Loopback()
    got = run_on(backend, plan, feeds, group=group)
    assert not group.sent, "a rank sent what it never received (a skipped Recv)"
    assert_outputs(got, oracle(c, m, feeds), rtol=1e-5, atol=1e-6)


def _params():
    return [pytest.param(key, id=".".join(filter(None, key))) for key in sorted(CASES)]


@pytest.mark.parametrize("key", _params())
def test_op_on_zero_size(key, backend):
    check(CASES[key], backend)


def test_every_op_has_a_case():
    """A newly registered op must come with its zero-size case (and a case with no op is a mistake)."""
    assert sorted(set(ops.SCHEMAS) - set(CASES)) == [] and sorted(set(CASES) - set(ops.SCHEMAS)) == []


@pytest.mark.parametrize("name", sorted(EDGES))
def test_empty_input_edge(name, backend):
    check(EDGES[name], backend)


def _chain():
    """x (0, 16) through LayerNormalization (its scratch), Gemm, Relu and a sum over the empty batch: an
    empty output y and a non-empty one s (zeros); and u (2, 0) times an empty param z (0, 8): p, zeros."""
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["n"]),
             helper.make_node("Gemm", ["n", "w", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
             helper.make_node("ReduceSum", ["y", "axes"], ["s"]), helper.make_node("MatMul", ["u", "z"], ["p"])]
    weights = {"scale": w(16), "bias": w(16), "w": w(16, 8), "b": w(8), "axes": k([0]), "z": w(0, 8)}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("x", [0, 16]), ("u", [2, 0]))]
    graph = helper.make_graph(nodes, "chain", inputs, [onnx.ValueInfoProto(name=n) for n in ("y", "s", "p")],
                              [numpy_helper.from_array(v, n) for n, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("mode", ["pool", "tensor"])
@pytest.mark.parametrize("strategy", ["naive", "inplace", "share", "bestfit", "optimal"])
def test_every_strategy_places_zero_byte_tensors(strategy, mode, tmp_path):
    """The allocators, liveness and verify take zero-byte tensors (and an empty scratch layout), and the plan
    survives its JSON."""
    feeds = {"x": np.zeros((0, 16), np.float32), "u": np.zeros((2, 0), np.float32)}
    plan = planner.compile(_chain(), strategy=strategy, config=planner.Config(workspace_mode=mode))
    assert {"x", "u", "z", "n", "h", "y"} <= {name for name, t in plan.tensors.items() if t.nbytes == 0}
    plan.to_json(tmp_path / "plan.json")
    again = planner.Plan.from_json(tmp_path / "plan.json")
    again.verify()
    got = run_on("numpy", again, feeds)
    assert got["y"].shape == (0, 8) and not got["s"].any() and not got["p"].any()
    assert got["s"].shape == (1, 8) and got["p"].shape == (2, 8)


@pytest.mark.torch
@pytest.mark.parametrize("case", ["mlp", "lenet"])
def test_training_step_on_an_empty_batch(case):
    """One training step of a zoo model on a batch of 0, as PyTorch's copy takes it: the loss the mean of
    nothing (NaN), the gradients sums over no rows (zeros), the params where they were."""
    pytest.importorskip("torch")
    from test_training import batch_of, train_memplan, train_torch
    model = small_model(case)
    data = [batch_of(model, 0)]
    for optimizer in ("sgd", "adam"):
        losses, params, start = train_memplan(model, 0, data, optimizer=optimizer)
        torch_losses, torch_params, _ = train_torch(model, 0, data, optimizer=optimizer)
        assert np.isnan(losses).all() and np.isnan(torch_losses).all()
        for name, value in params.items():
            np.testing.assert_array_equal(value, torch_params[name], err_msg=name)
            np.testing.assert_array_equal(value, start[name], err_msg=name)


def test_training_step_of_a_transformer_on_an_empty_batch():
    """bert_base's training step on a batch of 0 runs memplan's fused norm and activation ops and their
    gradients on empty rows: the loss NaN, their parameter gradients zeros, so Adam leaves every param."""
    model = small_model("bert_base")
    plan = planner.compile(model, input_shapes(model, 0), training=True, loss="cross_entropy", optimizer="adam")
    assert {"LayerNormalizationGrad", "BiasActivationGrad"} <= {s.op for s in plan.steps}
    ex = Executor(plan, backend="numpy", poison=True)
    start = ex.parameters()
    feeds = {name: np.zeros(plan.tensors[name].shape, plan.tensors[name].dtype)
             for name in ("input_ids", "attention_mask", "labels")}
    assert np.isnan(ex.train_step(feeds))
    for name, value in ex.parameters().items():
        np.testing.assert_array_equal(value, start[name], err_msg=name)
