"""Small hostile models, each seen to crash, exhaust memory or plan silently wrong before: each now
plans within a memory cap and a time cap, or fails with one MemplanError that names the node. The
invalid ones are also refused by onnxruntime, the oracle for what a valid model is. Valid ones that
describe absurd sizes plan without making what they describe, or are refused where planning would have to
build a constant past planner.ops.base.CONST_LIMIT or unroll past control_flow.MAX_UNROLLED."""
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from isolation import isolated

F = TensorProto.FLOAT


def model(nodes, inputs=(), inits=(), opset=17, outputs=("y",)):
    """A model of `nodes` with float inputs {name: shape} and initializers {name: array}."""
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in nodes], "hostile",
        [helper.make_tensor_value_info(n, F, s) for n, s in dict(inputs).items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in dict(inits).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def i64(*values):
    return np.array(values, np.int64)


W3 = {"w": np.ones((1, 1, 3, 3), np.float32)}
IMAGE = {"x": [1, 1, 8, 8]}

PLANNED = {  # name: (model, bytes of its output y); planning must not allocate what the model describes
    "range 2**29 floats": (model([("Range", ["a", "b", "c"], ["y"], {})], inits={
        "a": np.float32(0), "b": np.float32(2**29), "c": np.float32(1)}), 2**31),
    "range 2**40 ints": (model([("Range", ["a", "b", "c"], ["y"], {})], inits={
        "a": np.int64(0), "b": np.int64(2**40), "c": np.int64(1)}), 2**43),
    "ConstantOfShape 2**20 x 2**20": (model([("ConstantOfShape", ["s"], ["y"], {})], inits={"s": i64(2**20, 2**20)}),
                                      2**42),
    "Tile 2**30 times": (model([("Tile", ["c", "r"], ["y"], {})], inits={"c": np.ones(4, np.float32),
                                                                         "r": i64(2**30)}), 2**34),
    "HannWindow of 2**40": (model([("HannWindow", ["n"], ["y"], {})], inits={"n": i64(2**40)}), 2**42),
    "MelWeightMatrix of 2**20 bins": (model([("MelWeightMatrix", ["a", "b", "c", "d", "e"], ["y"], {})], inits={
        "a": i64(2**20), "b": i64(2**20), "c": i64(16000), "d": np.float32(0), "e": np.float32(8000)}),
        (2**19 + 1) * 2**20 * 4),
}

REFUSED = {  # name: (model, error class, message pattern)
    "Resize by 3e7": (model([("Resize", ["x", "", "s"], ["y"], {})], {"x": [1, 1, 2, 2]},
                            {"s": np.array([1, 1, 3e7, 3e7], np.float32)}),
                      "ShapeError", r"node 'Resize_0' \(Resize\): output 'y' of shape \(1, 1, 60000000, 60000000\) "
                                    r"float32 would hold 14,400,000,000,000,000 bytes; a tensor may hold at most 2\*\*48"),
    "Expand past int64": (model([("Expand", ["x", "s"], ["y"], {})], {"x": [1]}, {"s": i64(2**40, 2**40)}),
                          "ShapeError", r"\(Expand\): output 'y' of shape \(1099511627776, 1099511627776\)"),
    "Expand to 2**64 bytes": (model([("Expand", ["x", "s"], ["y"], {})], {"x": [1]}, {"s": i64(2**31, 2**31)}),
                              "ShapeError", r"would hold 18,446,744,073,709,551,616 bytes"),
    "Add with one input": (model([("Add", ["x"], ["y"], {})], {"x": [2]}),
                           "ModelError", r"node 'Add_0' \(Add\) is not valid ONNX at opset 17: has input size 1 "
                                         r"not in range \[min=2, max=2\]"),
    "Relu with three inputs": (model([("Relu", ["x", "x", "x"], ["y"], {})], {"x": [2]}),
                               "ModelError", r"\(Relu\) is not valid ONNX at opset 17: has input size 3"),
    "an unknown attribute": (model([("Relu", ["x"], ["y"], {"foo": 1})], {"x": [2]}),
                             "ModelError", r"Unrecognized attribute: foo for operator Relu"),
    "an attribute of the wrong type": (model([("Transpose", ["x"], ["y"], {"perm": 1})], {"x": [2]}),
                                       "ModelError", r"perm'. Expected: 'INTS', actual: 'INT'"),
    "a required input left empty": (model([("Conv", ["x", ""], ["y"], {})], IMAGE),
                                    "ModelError", r"input 1 is marked single but has an empty string"),
    "Conv stride 0": (model([("Conv", ["x", "w"], ["y"], {"strides": [0, 0]})], IMAGE, W3),
                      "ShapeError", r"node 'Conv_0' \(Conv\): strides \(0, 0\) must be at least 1"),
    "Conv dilation 0": (model([("Conv", ["x", "w"], ["y"], {"dilations": [0, 0]})], IMAGE, W3),
                        "ShapeError", r"dilations \(0, 0\) must be at least 1"),
    "Conv negative pads": (model([("Conv", ["x", "w"], ["y"], {"pads": [-1, 0, 0, 0]})], IMAGE, W3),
                           "ShapeError", r"pads \(-1, 0, 0, 0\) must be non-negative"),
    "Conv group 0": (model([("Conv", ["x", "w"], ["y"], {"group": 0})], IMAGE, W3),
                     "ShapeError", r"group 0 must be at least 1"),
    "MaxPool kernel 0": (model([("MaxPool", ["x"], ["y"], {"kernel_shape": [0, 0]})], IMAGE),
                         "ShapeError", r"\(MaxPool\): kernel_shape \(0, 0\) must be at least 1"),
    "an uneven Split at opset 17": (model([("Split", ["x"], ["a", "b"], {"axis": 0})], {"x": [5]}, outputs=("a", "b")),
                                    "ShapeError", r"a dimension of size 5 does not split evenly into 2 outputs"),
    "Not on floats": (model([("Not", ["x"], ["y"], {})], {"x": [2]}),
                      "ShapeError", r"\(Not\): input 'x' is float32, but Not takes bool there"),
    "Mod fmod=0 on floats": (model([("Mod", ["x", "x"], ["y"], {})], {"x": [2]}),
                             "ShapeError", r"Mod on floats needs fmod=1 before opset 28"),
    "Add of float32 and int64": (model([("Add", ["x", "k"], ["y"], {})], {"x": [2]}, {"k": i64(1, 2)}),
                                 "ShapeError", r"inputs 'x' \(float32\) and 'k' \(int64\) must have one dtype"),
    "DFT of length 2**40": (model([("DFT", ["x", "n"], ["y"], {"axis": 1})], {"x": [1, 8, 2]}, {"n": i64(2**40)}),
                            "ShapeError", r"node 'DFT_0' \(DFT\): its DFT matrix would hold 35,184,372,088,832 "
                                          r"elements \(16, 2199023255552\), more than the 16,777,216 memplan builds"),
    "STFT of frames of 2**20": (model([("STFT", ["x", "s", "", "l"], ["y"], {})], {"x": [1, 2**21, 1]},
                                      {"s": i64(1), "l": i64(2**20)}),
                                "ShapeError", r"node 'STFT_0' \(STFT\): the indices of its frames would hold "
                                              r"1,099,512,676,352 elements \(1048577, 1048576\)"),
    "AffineGrid of 2**15 x 2**15": (model([("AffineGrid", ["t", "s"], ["y"], {})], {"t": [1, 2, 3]},
                                          {"s": i64(1, 1, 2**15, 2**15)}, opset=20),
                                    "ShapeError", r"\(AffineGrid\): its grid of coordinates would hold 3,221,225,472"),
    "Resize of one axis to 2**39": (model([("Resize", ["x", "", "s"], ["y"], {"mode": "linear"})], {"x": [1, 1, 1, 2]},
                                          {"s": np.array([1, 1, 1, 2.0**38], np.float32)}),
                                    "ShapeError", r"\(Resize\): the table of its pass along axis 3 would hold "
                                                  r"1,099,511,627,776 elements \(2, 549755813888\)"),
    "LpPool of a 2**13 x 2**13 kernel": (model([("LpPool", ["x"], ["y"], {"kernel_shape": [2**13, 2**13]})],
                                               {"x": [1, 1, 2**13, 2**13]}),
                                         "ShapeError", r"\(LpPool\): its kernel of ones would hold 67,108,864"),
    "LinearAttention over 2**30 steps": (
        model([("LinearAttention", ["q", "q", "q"], ["y", "state"], {"q_num_heads": 1, "kv_num_heads": 1,
                                                                      "update_rule": "linear"})],
              {"q": [1, 2**30, 2]}, opset=27, outputs=("y", "state")),
        "ShapeError", r"\(LinearAttention\): unrolling it over 1,073,741,824 time steps makes at least 1,073,741,824 "
                      r"nodes, more than the 65,536 memplan unrolls"),
    "a constant Gather index out of range": (
        model([("Gather", ["x", "i"], ["y"], {})], {"x": [4, 2]}, {"i": i64(7)}),
        "ShapeError", r"\(Gather\): index 7 is out of range for a dimension of size 4 \(indices go from -4 to 3\)"),
}


def compile_bytes(data):
    """The planned bytes of output y of the serialized model `data`."""
    return planner.compile(onnx.load_from_string(data)).tensors["y"].nbytes


@pytest.mark.parametrize("name", PLANNED)
def test_huge_values_plan_without_being_made(name):
    m, arena = PLANNED[name]
    assert isolated(compile_bytes, m.SerializeToString()) == ("ok", arena)


@pytest.mark.parametrize("name", REFUSED)
def test_invalid_models_are_refused_naming_the_node(name):
    m, error, pattern = REFUSED[name]
    kind, detail = isolated(compile_bytes, m.SerializeToString())
    assert kind == "error" and detail.startswith(f"{error}: "), detail
    assert re.search(pattern, detail), detail


@pytest.mark.parametrize("name", [n for n in REFUSED if "2**" not in n and "int64" not in n and "3e7" not in n])
def test_onnxruntime_refuses_them_too(name):
    ort = pytest.importorskip("onnxruntime")
    m = REFUSED[name][0]
    with pytest.raises(Exception):
        session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        session.run(None, {i.name: np.ones(i.shape, np.float32) for i in session.get_inputs()})


W2 = {"w": np.ones(2, np.float32)}
XW = ("Mul", ["x", "w"], ["xw"], {})  # x times a weight, for training to differentiate
LSTM = {"W": np.ones((1, 8, 2), np.float32), "R": np.ones((1, 8, 2), np.float32)}

TRAINED = {  # name: (model, error class or None where it plans, message pattern); planned with training=True
    "CumProd over 2**20": (model([XW, ("CumProd", ["xw", "a"], ["y"], {})], {"x": [2**20, 2]}, {**W2, "a": i64(0)},
                                 opset=26),
                           "ShapeError", r"node 'CumProd_1' \(CumProd\): its gradient's triangle mask would hold "
                                         r"1,099,511,627,776 elements"),
    "Det of 2**10 x 2**10": (model([XW, ("Det", ["xw"], ["y"], {})], {"x": [2**10, 2**10]},
                                   {"w": np.ones(2**10, np.float32)}),
                             "ShapeError", r"\(Det\): the indices of its gradient's minors would hold "
                                           r"1,097,365,192,704 elements \(1024, 1024, 1046529\)"),
    "GridSample of 2**15 x 2**15 images": (model([XW, ("GridSample", ["xw", "g"], ["y"], {})],
                                                 {"x": [2**15, 2**15, 2, 2], "g": [2**15, 1, 1, 2]}, W2),
                                           "ShapeError", r"\(GridSample\): the offsets of its gradient's images would "
                                                         r"hold 1,073,741,824"),
    "LSTM over 2**30 steps": (model([("LSTM", ["x", "W", "R"], ["y"], {"hidden_size": 2})], {"x": [2**30, 1, 2]}, LSTM),
                              "ShapeError", r"node 'LSTM_0' \(LSTM\): unrolling its recurrence over 1,073,741,824 "
                                            r"time steps in 1 direction\(s\) makes at least"),
    "LSTM of a batch of 2**36": (model([("LSTM", ["x", "W", "R"], ["y"], {"hidden_size": 2})], {"x": [2, 2**36, 2]},
                                       LSTM), None, ""),
}


def train_bytes(data):
    """The arena bytes of a training step of the serialized model `data` (mean square of its output y)."""
    return planner.compile(onnx.load_from_string(data), training=True, loss="mse").arena_bytes


@pytest.mark.parametrize("name", TRAINED)
def test_gradients_bound_the_constants_they_build(name):
    m, error, pattern = TRAINED[name]
    kind, detail = isolated(train_bytes, m.SerializeToString())
    if error is None:
        assert kind == "ok", detail
    else:
        assert kind == "error" and detail.startswith(f"{error}: ") and re.search(pattern, detail), detail


def test_running_a_plan_larger_than_the_host_fails_before_allocating():
    plan = planner.compile(PLANNED["range 2**40 ints"][0])
    with pytest.raises(planner.MemplanError, match=r"not enough memory for the arena: 8.00 TiB"):
        Executor(plan, backend="numpy")


def test_an_input_bound_past_the_limit():
    m = model([("Relu", ["x"], ["y"], {})], {"x": ["a", "b"]})
    with pytest.raises(planner.ShapeError, match=r"input 'x' of shape \(1073741824, 1073741824\) float32 would hold"):
        planner.compile(m, {"x": (2**30, 2**30)})


def test_a_data_dependent_index_out_of_range_names_the_step():
    m = model([("Gather", ["w", "i"], ["y"], {})], inits={"w": np.ones((4, 2), np.float32)})
    m.graph.input.append(helper.make_tensor_value_info("i", TensorProto.INT64, [3]))
    run = Executor(planner.compile(m), backend="numpy")
    with pytest.raises(planner.MemplanError, match=r"step 0 \(Gather 'Gather_0'\) cannot run on these feeds: "
                                                   r"index 9 is out of bounds"):
        run.run({"i": i64(0, 9, 1)})


EXTERNAL = {  # external_data entries besides the location: the error each gets, for a 4x4 weight (read with the
    # model) and a 128x128 one (read when needed, planner.deferred; its file checked with the model)
    "an offset past the end": ({"offset": "100000"}, r"offset \(100000\) exceeds file size \({size}\)"),
    "a length past the end": ({"length": "100000"}, r"length \(100000\) exceeds available data"),
    "a huge length": ({"length": str(2**62)}, r"length \(4611686018427387904\) exceeds available data"),
    "a non-numeric offset": ({"offset": "abc"}, r"invalid literal for int\(\)"),
    "a negative offset": ({"offset": "-4"}, r"offset must be non-negative"),
    "a short length": ({"length": "8"},
                       {4: r"cannot be read \(cannot reshape array of size 2 into shape \(4, ?4\)\)",
                        128: r"cannot be read \(it holds 8 bytes, where a 128x128 float32 takes 65536\)"}),
    "a NUL byte in the location": ({"location": "w\0.bin"}, r"location 'w\\x00.bin' holds a NUL byte"),
}


@pytest.mark.parametrize("side", [4, 128])
@pytest.mark.parametrize("name", EXTERNAL)
def test_bad_external_data_is_a_model_error(tmp_path, name, side):
    fields, pattern = EXTERNAL[name]
    pattern = pattern[side] if isinstance(pattern, dict) else pattern.format(size=side * side * 4)
    weight = np.ones((side, side), np.float32)
    m = model([("MatMul", ["x", "w"], ["y"], {})], {"x": [2, side]}, {"w": weight})
    (tmp_path / "w.bin").write_bytes(weight.tobytes())
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", **fields}.items():
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(planner.ModelError, match=rf"initializer 'w'.*{pattern}"):
        planner.compile(str(tmp_path / "m.onnx"))


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    from planner import cli
    onnx.save(REFUSED["Add with one input"][0], tmp_path / "add.onnx")
    assert cli.main(["report", str(tmp_path / "add.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memplan: error: node 'Add_0' (Add) is not valid ONNX") and err.count("\n") == 1
