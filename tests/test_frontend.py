"""ONNX frontend, IR validation and input binding: each bad input gets its own specific error."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from planner import ModelError, ShapeError, UnsupportedOpError
from planner.errors import SURFACE


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def small_model():
    w = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    return model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                 [vi("x", ["batch", 64])], [vi("y", ["batch", 64])], [w])


def test_binds_dynamic_batch_and_types_every_tensor():
    g = planner.load(small_model(), {"x": (8, 64)})
    assert {k: (t.shape, str(t.dtype), t.kind) for k, t in g.tensors.items()} == {
        "x": ((8, 64), "float32", "input"), "w": ((64, 64), "float32", "param"),
        "h": ((8, 64), "float32", "activation"), "y": ((8, 64), "float32", "output")}
    assert g.inputs == ("x",) and g.outputs == ("y",)
    np.testing.assert_array_equal(g.tensors["w"].data, np.arange(4096, dtype=np.float32).reshape(64, 64))


def test_missing_file(tmp_path):
    with pytest.raises(ModelError, match="no such model file"):
        planner.load(tmp_path / "nope.onnx")


def test_not_an_onnx_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a protobuf\n" * 10)
    with pytest.raises(ModelError, match="not a readable ONNX model|no graph"):
        planner.load(path)


def test_truncated_file(tmp_path):
    path = tmp_path / "m.onnx"
    data = small_model().SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError):
        planner.load(path, {"x": (1, 64)})


def test_unknown_ops_are_all_listed_with_counts():
    m = model([helper.make_node("FancyOp", ["x"], ["a"]), helper.make_node("FancyOp", ["a"], ["b"]),
               helper.make_node("Relu", ["b"], ["c"]),
               helper.make_node("Gizmo", ["c"], ["y"], domain="com.example")],
              [vi("x", [2])], [vi("y", [2])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError, match=r"FancyOp \(x2\).*com\.example\.Gizmo \(x1\)") as e:
        planner.load(m)
    assert e.value.counts == {"FancyOp": 2, "com.example.Gizmo": 1}


def test_unbound_dynamic_dim_names_the_input_and_shows_the_syntax():
    with pytest.raises(ShapeError, match=r"input 'x' has unbound dimension 'batch' \(shape \(batch, 64\)\); bind it "
                                         r"with input_shapes=\{'x': \(8, 64\)\}$"):
        planner.load(small_model())
    token = SURFACE.set("cli")
    try:
        with pytest.raises(ShapeError, match=r"bind it with --input x:8x64 \(or --batch 8 for the first dim"):
            planner.load(small_model())
    finally:
        SURFACE.reset(token)


def test_every_unbound_dim_is_named_with_an_example_of_the_inputs_rank():
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    m = model([helper.make_node("Identity", ["ids"], ["y"])], [ids], [vi("y", None)])
    with pytest.raises(ShapeError, match=r"unbound dimensions 'batch' and 'seq' \(shape \(batch, seq\)\); bind them "
                                         r"with input_shapes=\{'ids': \(8, 128\)\}"):
        planner.load(m)


def test_bad_bindings():
    with pytest.raises(ShapeError, match="rank 2"):
        planner.load(small_model(), {"x": (8, 64, 1)})
    with pytest.raises(ShapeError, match="size 64"):
        planner.load(small_model(), {"x": (8, 32)})
    with pytest.raises(ShapeError, match="model's inputs are 'x'"):
        planner.load(small_model(), {"image": (8, 64)})


def test_dim_names_shared_between_inputs():
    m = model([helper.make_node("Add", ["a", "b"], ["y"])], [vi("a", ["n", 3]), vi("b", ["n", 3])], [vi("y", None)])
    assert planner.load(m, {"a": (5, 3)}).tensors["y"].shape == (5, 3)
    with pytest.raises(ShapeError, match="bound to both 5 and 6"):
        planner.load(m, {"a": (5, 3), "b": (6, 3)})


def test_cyclic_graph():
    m = model([helper.make_node("Relu", ["x2"], ["x1"]), helper.make_node("Relu", ["x1"], ["x2"]),
               helper.make_node("Add", ["x", "x2"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(ModelError, match="cycle"):
        planner.load(m)


def test_dangling_input_and_duplicate_writer():
    m = model([helper.make_node("Add", ["x", "ghost"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(ModelError, match="'ghost'"):
        planner.load(m)
    m = model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(ModelError, match="written more than once"):
        planner.load(m)


def test_out_of_range_opset():
    with pytest.raises(ModelError, match=r"opset 6 is not supported \(memplan reads opsets 11 to \d+, and 7 to 10 "):
        planner.load(model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=6))


def test_older_opset_is_upgraded():
    graph = planner.load(model([helper.make_node("Clip", ["x"], ["y"], min=0.0, max=6.0)], [vi("x", [2])],
                               [vi("y", [2])], opset=9))
    assert graph.opsets[""] == 11 and (graph.nodes[0].attrs["min"], graph.nodes[0].attrs["max"]) == (0.0, 6.0)


def _save_with_external_data(model_dir, location, data_path):
    """Save small_model() to model_dir/m.onnx with its weight stored at data_path, referenced as location."""
    m = small_model()
    w = m.graph.initializer[0]
    data_path.write_bytes(w.raw_data)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": str(4096 * 4)}.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    model_dir.mkdir(exist_ok=True)
    onnx.save(m, model_dir / "m.onnx")
    return model_dir / "m.onnx"


@pytest.mark.parametrize("location", ["weights.bin", "data/weights.bin"])
def test_external_data_is_loaded(tmp_path, location):
    (tmp_path / "data").mkdir()
    path = _save_with_external_data(tmp_path, location, tmp_path / location)
    g = planner.load(path, {"x": (2, 64)})
    np.testing.assert_array_equal(g.tensors["w"].data.ravel(), np.arange(4096, dtype=np.float32))


@pytest.mark.parametrize("location", ["../weights.bin", "{tmp}/weights.bin"])
def test_external_data_outside_the_model_directory_is_refused(tmp_path, location):
    path = _save_with_external_data(tmp_path / "model", location.format(tmp=tmp_path), tmp_path / "weights.bin")
    with pytest.raises(ModelError, match="outside the model's directory"):
        planner.load(path, {"x": (2, 64)})


def test_declared_output_shape_must_agree():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [3, 2])])
    with pytest.raises(ShapeError, match="declared with shape"):
        planner.load(m)


def test_legacy_softmax_keeps_its_flattening_semantics():
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])], opset=11)
    g = planner.load(m)
    assert [n.op for n in g.nodes] == ["Flatten", "Softmax", "Reshape"]
    assert g.tensors["y"].shape == (2, 3, 4)


def test_paddle_style_shape_chains_and_unknown_dims():
    """Opset 11, '?' dims, Shape -> Gather -> Unsqueeze -> Concat -> Reshape, and Resize with computed sizes."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["?", 3, None, -1])
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
        helper.make_node("Mul", ["hw", "two_1d"], ["hw2"]),
        helper.make_node("Slice", ["s", "zero_1d", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "none", "none", "sizes"], ["up"], mode="nearest"),  # opset 11: roi, scales given
    ]
    inits = [i64("zero", 0), i64("minus1", [-1]), i64("two", [2]), i64("four", [4]),
             i64("two_1d", [2, 2]), i64("zero_1d", [0]), numpy_helper.from_array(np.zeros(0, np.float32), "none")]
    m = model(nodes, [x], [vi("flat", None), vi("up", None)], inits, opset=11)
    g = planner.load(m, {"x": (4, 3, 5, 6)})
    assert g.tensors["flat"].shape == (4, 90) and g.tensors["up"].shape == (4, 3, 10, 12)
    assert [n.op for n in g.nodes] == ["Reshape", "Resize"]
    assert g.nodes[1].attrs["sizes"] == [4, 3, 10, 12]
    with pytest.raises(ShapeError, match=r"unknown dimensions at axes 0, 2 and 3 \(shape \(\?, 3, \?, \?\)\); bind "
                                         r"them with input_shapes=\{'x': \(8, 3, 128, 128\)\}"):
        planner.load(m)
