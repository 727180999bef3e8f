"""The model zoo: every model at reduced size is a valid ONNX model that onnxruntime runs, and
memplan's shapes agree with onnxruntime's outputs and with ONNX's own shape inference."""

import numpy as np
import onnx
import pytest

import planner
from frontends import zoo
from planner import dtypes
from planner.errors import ModelError
from zoo_cases import BATCHES, CASES, feeds, input_shapes, small_model

ort = pytest.importorskip("onnxruntime")


def _concrete(model, batch):
    """A copy of the model whose inputs have concrete dims."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        for d, size in zip(vi.type.tensor_type.shape.dim, input_shapes(model, batch)[vi.name]):
            d.dim_value = size
    return fixed


def test_cases_cover_the_zoo():
    assert {name for name, _ in CASES.values()} == set(zoo.NAMES)


@pytest.mark.parametrize("case", CASES)
def test_valid_onnx(case):
    model = small_model(case)
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert all(n.domain == "" for n in model.graph.node)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("case", CASES)
def test_shapes_match_onnxruntime_and_onnx(case, batch):
    model = small_model(case)
    graph = planner.load(model, input_shapes(model, batch))
    for t in graph.tensors.values():
        assert t.is_static and all(type(d) is int for d in t.shape), f"{t.name}: {t.shape} {t.dtype}"

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    results = session.run(None, feeds(model, batch))
    for out, value in zip(session.get_outputs(), results):
        assert np.isfinite(value).all(), out.name
        assert graph.tensors[out.name].shape == value.shape, out.name
        assert graph.tensors[out.name].dtype == value.dtype, out.name

    inferred = onnx.shape_inference.infer_shapes(_concrete(model, batch), strict_mode=True, data_prop=True)
    compared = 0
    for vi in (*inferred.graph.value_info, *inferred.graph.output):
        t = vi.type.tensor_type
        if vi.name not in graph.tensors or not t.HasField("shape") or not all(d.HasField("dim_value") for d in t.shape.dim):
            continue
        assert graph.tensors[vi.name].shape == tuple(d.dim_value for d in t.shape.dim), vi.name
        assert graph.tensors[vi.name].dtype == dtypes.from_onnx(t.elem_type), vi.name
        compared += 1
    assert compared >= len(graph.nodes) // 2


def test_load_by_zoo_name():
    graph = planner.load("zoo:mlp", {"input": (2, 784)})
    assert graph.tensors["output"].shape == (2, 10)
    assert graph.tensors["output"].dtype == np.float32


def test_seeded_weights():
    first, again, other = (zoo.build("mlp", hidden=(8,), seed=s) for s in (0, 0, 1))
    assert first.SerializeToString() == again.SerializeToString()
    assert first.graph.initializer[0].raw_data != other.graph.initializer[0].raw_data


def test_unknown_name_or_option():
    with pytest.raises(ModelError, match="resnet50"):
        zoo.build("resnet51")
    with pytest.raises(ModelError, match="resolution"):
        zoo.build("resnet50", depth=3)
    with pytest.raises(ModelError, match="resnet51"):
        planner.load("zoo:resnet51")
