"""to_torch: every zoo model run op by op in PyTorch against onnxruntime, every ONNX node test of an op it
has against the outputs the test ships, parameters and buffers, training mode, devices and errors."""
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import planner
from node_cases import RANDOM, as_planned, assert_outputs, params, supported_cases
from zoo_cases import CASES, feeds, input_shapes, reference, rel_l2, small_model

torch = pytest.importorskip("torch")
from executor.torch_module import to_torch  # noqa: E402  (needs torch)
from executor.torch_ops import form  # noqa: E402
from planner.ops.torch_forms import torch_dtype  # noqa: E402

pytestmark = pytest.mark.torch
BATCH = 2


def outputs(module, inputs, device="cpu"):
    """The module's outputs on `inputs` (NumPy arrays) in inference, as host arrays."""
    with torch.no_grad():
        got = module.eval().to(device)(**inputs)
    return {k: v.cpu().numpy() for k, v in got.items()}


@pytest.mark.parametrize("case", CASES)
def test_zoo_matches_onnxruntime(case):
    model, inputs, expected = reference(case, BATCH)
    got = outputs(to_torch(model, input_shapes(model, BATCH)), inputs)
    assert got.keys() == expected.keys()
    for name, want in expected.items():
        assert got[name].shape == want.shape
        assert rel_l2(got[name], want) < 1e-4, name


def _computable(dtype):
    """Whether PyTorch holds `dtype` and computes in it (it has few kernels for uint16 to uint64)."""
    try:
        torch_dtype(torch, dtype)
    except TypeError:
        return False
    return not (dtype.kind == "u" and dtype.itemsize > 1)


NODE_CASES = [c for c in supported_cases() if all(form(n.op_type) or n.op_type == "Constant" for n in c.model.graph.node)]


@pytest.mark.parametrize("case", params(NODE_CASES))
def test_node(case):
    """A case matches, or to_torch refuses the form of its op by name (skipped, with the reason)."""
    model, inputs, expected = as_planned(case)
    arrays = [np.asarray(v) for v in (*inputs.values(), *expected.values())]
    if not all(_computable(a.dtype) for a in arrays):
        pytest.skip("a dtype PyTorch does not compute in")
    graph = planner.load(model, {k: np.shape(v) for k, v in inputs.items()})
    if any(n.op == "Dropout" and n.attrs.get("training_mode") and n.attrs.get("ratio", 0.5) for n in graph.nodes):
        pytest.skip("random dropout")
    try:
        module = to_torch(graph)
        got = outputs(module, {k: np.asarray(v) for k, v in inputs.items()})
    except planner.UnsupportedOpError as e:
        assert any(n.op in str(e) for n in graph.nodes)
        pytest.skip(str(e))
    assert_outputs(got, expected, max(case.rtol, 1e-5), max(case.atol, 1e-6), values=case.name not in RANDOM)


def test_params_are_parameters_and_statistics_buffers():
    model = small_model("resnet18")
    graph = planner.load(model, input_shapes(model, BATCH))
    module = to_torch(graph)
    running = {i for n in graph.nodes if n.op == "BatchNormalization" for i in n.inputs[3:]}
    params = module.graph_parameters()
    assert set(params) == {t.name for t in graph.params()} - running
    assert set(module.graph_buffers()) == running
    assert {id(p) for p in module.parameters()} == {id(p) for p in params.values()}
    module.train()(**feeds(model, BATCH))["output"].square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())


def test_train_mode_is_onnx_training_batch_normalization():
    """module.train() on an inference BatchNormalization computes what the node with training_mode=1
    does in ONNX's reference, its running statistics left in the buffers."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5, 5), dtype=np.float32)
    stats = {name: rng.uniform(0.5, 1.5, 3).astype(np.float32) for name in ("scale", "bias", "mean", "var")}

    def model(outputs, **attrs):
        node = helper.make_node("BatchNormalization", ["x", *stats], outputs, momentum=0.8, **attrs)
        values = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph([node], "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                  values, [numpy_helper.from_array(v, k) for k, v in stats.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    y, mean, var = ReferenceEvaluator(model(["y", "m", "v"], training_mode=1)).run(None, {"x": x})
    module = to_torch(model(["y"])).train()
    np.testing.assert_allclose(module(x)["y"].detach().numpy(), y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(module.graph_buffers()["mean"].numpy(), mean, rtol=1e-6)
    np.testing.assert_allclose(module.graph_buffers()["var"].numpy(), var, rtol=1e-6)


def test_inputs_by_position_or_name():
    model = small_model("bert_base")
    module, inputs = to_torch(model, input_shapes(model, BATCH)).eval(), feeds(model, BATCH)
    by_name = outputs(module, inputs)
    with torch.no_grad():
        by_position = module(*(torch.as_tensor(inputs[n]) for n in module.graph.inputs))
    assert all(np.array_equal(by_position[k].numpy(), v) for k, v in by_name.items())
    with pytest.raises(TypeError, match="missing \\['attention_mask'\\]"):
        module(input_ids=torch.as_tensor(inputs["input_ids"]))


def test_an_op_without_a_torch_form_is_named():
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"])], "scatter",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("x", [4]), ("u", [1]))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array([[1]], np.int64), "i")])
    with pytest.raises(planner.UnsupportedOpError, match=r"to_torch: unsupported op types: ScatterND \(x1\)"):
        to_torch(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_the_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import frontends, planner, executor\n"
            "try:\n    import executor.torch_module\n"
            "except planner.MissingDependencyError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "needs PyTorch" in out


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["resnet18", "mobilenet_v2", "unet_resize", "bert_base", "gpt2_small"])
def test_runs_on_cuda(case, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # full float32 convolutions
    model, inputs, expected = reference(case, BATCH)
    got = outputs(to_torch(model, input_shapes(model, BATCH)), inputs, device="cuda")
    for name, want in expected.items():
        assert rel_l2(got[name], want) < 1e-4, name
