"""Folding inference BatchNormalization into the Conv before it: the steps go, the results stay (with and
without the pass, and onnxruntime's), and where folding would be wrong (training, a second reader of the
convolution, statistics computed while running) nothing is folded."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor, FeedError
from pass_properties import assert_same, onnxruntime
from zoo_cases import feeds, input_shapes, small_model

RNG = np.random.default_rng(7)


def conv_bn(channels=8, groups=1, bias=True, rank=2, extra_reader=False, epsilon=1e-3):
    """x -> Conv (with random weights) -> BatchNormalization (random statistics) -> y, as an ONNX model."""
    kernel = [3] * rank
    w = RNG.standard_normal((channels, 4 // groups, *kernel)).astype(np.float32)
    stats = [RNG.uniform(0.5, 2, channels), RNG.standard_normal(channels), RNG.standard_normal(channels),
             RNG.uniform(0.1, 3, channels)]
    inits = [numpy_helper.from_array(w, "w")]
    inits += [numpy_helper.from_array(v.astype(np.float32), n) for v, n in zip(stats, ("s", "beta", "mean", "var"))]
    conv_inputs = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(RNG.standard_normal(channels).astype(np.float32), "b"))
        conv_inputs.append("b")
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], pads=[1] * 2 * rank, group=groups),
             helper.make_node("BatchNormalization", ["c", "s", "beta", "mean", "var"], ["y"], epsilon=epsilon)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                               [2, 4, *[9] * rank])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model, **options):
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    plan = planner.compile(model, {"x": shape}, **options)
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    return plan, Executor(plan, backend="numpy", poison=True).run({"x": x}), x


@pytest.mark.parametrize("groups, bias, rank", [(1, True, 2), (1, False, 2), (4, True, 2), (2, False, 1), (1, True, 3)])
def test_folding_changes_no_result(groups, bias, rank):
    import onnxruntime as ort
    model = conv_bn(groups=groups, bias=bias, rank=rank)
    folded, got, x = run(model)
    kept, want, _ = run(model, fold_batchnorm=False)
    assert [s.op for s in folded.steps] == ["Conv"] and "BatchNormalization" in [s.op for s in kept.steps]
    scale = np.abs(want["y"]).max()
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6 * scale)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got["y"], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5 * scale)


def test_a_convolution_read_elsewhere_is_not_folded():
    plan, got, _ = run(conv_bn(extra_reader=True))
    assert [s.op for s in plan.steps].count("BatchNormalization") == 1


def test_training_plans_keep_the_batch_statistics():
    model = conv_bn()
    plan = planner.compile(model, {"x": (2, 4, 9, 9)}, training=True, loss="mse")
    assert any(s.op == "BatchNormalization" for s in plan.steps)


def test_the_folded_weights_are_not_the_exported_params():
    """Writing the exported weight into a folded plan is refused: it would no longer be what runs."""
    plan, _, _ = run(conv_bn())
    with pytest.raises(FeedError, match="'w' is not a param"):
        Executor(plan, backend="numpy").set_parameters({"w": np.zeros((8, 4, 3, 3), np.float32)})


@pytest.mark.parametrize("case", ["resnet18", "mobilenet_v2"])
def test_zoo_networks_fold_every_batchnorm_with_the_same_outputs(case):
    model = onnx.ModelProto()
    model.CopyFrom(small_model(case))
    rng = np.random.default_rng(1)
    for init in model.graph.initializer:
        if "running" in init.name or "var" in init.name or "mean" in init.name:
            value = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array((value + rng.uniform(0.1, 1, value.shape)).astype(value.dtype), init.name))
    shapes, inputs = input_shapes(model, 2), feeds(model, 2)
    plans = [planner.compile(model, shapes, fold_batchnorm=f) for f in (True, False)]
    assert not any(s.op == "BatchNormalization" for s in plans[0].steps)
    assert sum(s.op == "BatchNormalization" for s in plans[1].steps) > 0
    outs = [Executor(p, backend="numpy", poison=True).run(inputs) for p in plans]
    for name in outs[1]:
        np.testing.assert_allclose(outs[0][name], outs[1][name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("change, epsilon, folds", [
    ({"var": 0.0}, 0.0, False), ({"var": -0.5}, 1e-5, False), ({"var": -1e-3}, 1e-3, False),
    ({"s": 3e38, "var": 0.01, "mean": 0.0}, 0.0, False), ({"mean": np.inf}, 1e-3, False),
    ({"beta": np.nan}, 1e-3, False), ({"var": np.inf}, 1e-3, False),
    ({"var": 1e-12}, 0.0, True), ({"s": 0.0}, 0.0, True), ({"s": -1.5}, 0.0, True)])
def test_odd_statistics_fold_only_where_the_results_stay_ieee(change, epsilon, folds):
    """Epsilon 0 and a variance 0 (or one epsilon cancels), a variance below 0, statistics that are not finite,
    a scale over the variance's root past float32's range: the unfolded op's infinities and NaNs, where
    onnxruntime has them (the BatchNormalization stays); a tiny variance, a scale 0 or below folds. The feeds
    hold NaN and both infinities."""
    model = conv_bn(bias=False, epsilon=epsilon)
    for init in model.graph.initializer:
        if init.name in change:
            array = numpy_helper.to_array(init).copy()
            array[3] = change[init.name]
            init.CopyFrom(numpy_helper.from_array(array, init.name))
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    x[0, 1, 2, 3], x[1, 2, 5, 5], x[1, 0, 0, 8] = np.nan, np.inf, -np.inf
    plans = [planner.compile(model, {"x": x.shape}, fold_batchnorm=f) for f in (True, False)]
    assert ("BatchNormalization" not in [s.op for s in plans[0].steps]) == folds
    want = onnxruntime(model, {"x": x})["y"]
    for plan in plans:
        assert_same(Executor(plan, backend="numpy").run({"x": x})["y"], want, atol=1e-4, scaled=True)
