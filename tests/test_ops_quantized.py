"""The quantized ops against onnxruntime beyond the ONNX node cases: per-axis and blocked
(De)QuantizeLinear, integer products summed exactly in int32, per-channel QLinearConv; their scratch
in the workspace; and the refusals of shapes and types they do not take."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import planner
from executor import Executor
from test_no_hidden_allocations import BOUND, allocations
from zoo_cases import run_on

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)


def model(op, inputs, consts, out_type, opset=21, **attrs):
    """A one-node model: `inputs` fed ({name: array}), `consts` initializers; one output `y`."""
    fed = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for n, v in inputs.items()]
    node = helper.make_node(op, [*inputs, *consts], ["y"], **attrs)
    graph = helper.make_graph([node], op, fed, [helper.make_tensor_value_info("y", out_type, None)],
                              [numpy_helper.from_array(v, n) for n, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_both(backend, m, inputs):
    """(memplan's y, onnxruntime's y) on `inputs`, memplan with poison on."""
    plan = planner.compile(m, {k: v.shape for k, v in inputs.items()})
    got = run_on(backend, plan, inputs)["y"]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    return got, want


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("block_size", [0, 4, 3])
def test_quantize_per_axis_and_blocked(dtype, block_size, backend):
    """Per axis 1 of (2, 10, 3), or in blocks of 4 (the last one short) or 3 along it."""
    x = RNG.normal(0, 4, (2, 10, 3)).astype(np.float32)
    shape = (10,) if not block_size else (2, -(-10 // block_size), 3)
    scale = RNG.uniform(0.02, 0.2, shape).astype(np.float32)
    zero = RNG.integers(-5, 5, shape).astype(dtype) + (128 if dtype == np.uint8 else 0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    got, want = run_both(backend, model("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}, elem, axis=1,
                               block_size=block_size), {"x": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_saturates_and_rounds_half_to_even(dtype, backend):
    x = np.array([-1e9, -7e4, -3e4, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3e4, 7e4, 1e9, np.inf, -np.inf], np.float32)
    consts = {"s": np.array(1, np.float32), "z": np.array(3, dtype)}
    got, want = run_both(backend, model("QuantizeLinear", {"x": x}, consts, helper.np_dtype_to_tensor_dtype(np.dtype(dtype))),
                         {"x": x})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("block_size", [0, 2, 4])
def test_dequantize_per_axis_and_blocked(dtype, block_size, backend):
    """Per axis 0 of (6, 5), or in blocks of 2 or 4 (the last one short) along it."""
    x = RNG.integers(0, 100, (6, 5)).astype(dtype)
    shape = (6,) if not block_size else (-(-6 // block_size), 5)
    scale = RNG.uniform(0.02, 0.2, shape).astype(np.float32)
    zero = RNG.integers(0, 20, shape).astype(dtype)
    got, want = run_both(backend, model("DequantizeLinear", {"x": x}, {"s": scale, "z": zero}, TensorProto.FLOAT, axis=0,
                               block_size=block_size), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dequantize_to_float16_and_from_int4():
    """output_dtype narrows the float32 result; int4 values and zero points come through ml_dtypes."""
    import ml_dtypes
    x = RNG.integers(-8, 8, (4, 6)).astype(ml_dtypes.int4)
    scale = RNG.uniform(0.5, 2, (4, 2)).astype(np.float32)
    zero = RNG.integers(-2, 2, (4, 2)).astype(ml_dtypes.int4)
    m = model("DequantizeLinear", {}, {"x": x, "s": scale, "z": zero}, TensorProto.FLOAT16, opset=23, axis=1,
              block_size=3, output_dtype=TensorProto.FLOAT16)
    plan = planner.compile(m)
    got = Executor(plan, backend="numpy").run({})["y"]
    want = (x.astype(np.float32) - np.repeat(zero.astype(np.float32), 3, 1)) * np.repeat(scale, 3, 1)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want.astype(np.float16))


@pytest.mark.parametrize("block_size", [0, 3])
def test_torch_forms_match(block_size):
    """executor.torch_module runs QuantizeLinear then DequantizeLinear (blocks with a short last one) and
    QLinearMatMul as memplan's kernels do."""
    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch
    x = RNG.normal(0, 4, (2, 10, 3)).astype(np.float32)
    shape = (10,) if not block_size else (2, 4, 3)
    consts = {"s": RNG.uniform(0.02, 0.2, shape).astype(np.float32), "z": RNG.integers(-5, 5, shape).astype(np.int8)}
    m = model("QuantizeLinear", {"x": x}, consts, TensorProto.FLOAT, axis=1, block_size=block_size)
    m.graph.node[0].output[0] = "q"
    m.graph.node.append(helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1, block_size=block_size))
    a = RNG.integers(0, 255, (3, 10)).astype(np.uint8)
    mm = model("QLinearMatMul", {"a": a}, {}, TensorProto.UINT8)
    mm.graph.node[0].input[:] = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    mm.graph.initializer.extend(numpy_helper.from_array(v, n) for n, v in {
        "sa": np.array(0.05, np.float32), "za": np.array(120, np.uint8),
        "b": RNG.integers(-128, 127, (10, 4)).astype(np.int8), "sb": RNG.uniform(0.01, 0.03, 4).astype(np.float32),
        "zb": np.zeros(4, np.int8), "sy": np.array(0.3, np.float32), "zy": np.array(7, np.uint8)}.items())
    for graph, inputs in ((m, {"x": x}), (mm, {"a": a})):
        plan = planner.compile(graph, {k: v.shape for k, v in inputs.items()})
        want = Executor(plan, backend="numpy").run(inputs)["y"]
        with torch.no_grad():
            got = to_torch(graph, {k: v.shape for k, v in inputs.items()})(**inputs)["y"].numpy()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.int8, np.uint8), (np.uint8, np.uint8)])
def test_matmul_integer_sums_exactly(a_type, b_type, backend):
    """Long rows of extreme values: sums beyond float32's integers, exact in int32; B's zero point per column."""
    a = RNG.integers(np.iinfo(a_type).min, np.iinfo(a_type).max, (2, 3, 4096), endpoint=True).astype(a_type)
    b = RNG.integers(np.iinfo(b_type).min, np.iinfo(b_type).max, (4096, 5), endpoint=True).astype(b_type)
    zb = RNG.integers(0, 5, (5,)).astype(b_type)
    got, want = run_both(backend, model("MatMulInteger", {"a": a}, {"b": b, "za": np.array(3, a_type), "zb": zb},
                               TensorProto.INT32, opset=13), {"a": a})
    np.testing.assert_array_equal(got, want)
    exact = (a.astype(np.int64) - 3) @ (b.astype(np.int64) - zb)
    np.testing.assert_array_equal(got, exact)


def test_qlinear_matmul_per_column(backend):
    a = RNG.integers(0, 255, (3, 7, 16)).astype(np.uint8)
    b = RNG.integers(-128, 127, (16, 6)).astype(np.int8)
    consts = {"sa": np.array(0.05, np.float32), "za": np.array(120, np.uint8), "b": b,
              "sb": RNG.uniform(0.01, 0.03, 6).astype(np.float32), "zb": np.zeros(6, np.int8),
              "sy": np.array(0.9, np.float32), "zy": np.array(7, np.uint8)}
    m = model("QLinearMatMul", {"a": a}, {}, TensorProto.UINT8, opset=21)
    m.graph.node[0].input[:] = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    m.graph.initializer.extend(numpy_helper.from_array(v, n) for n, v in consts.items())
    got, want = run_both(backend, m, {"a": a})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [{"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 1, 2, 1]},
                                   {"group": 2, "dilations": [2, 1]}, {"auto_pad": "SAME_UPPER"}])
def test_conv_integer(attrs, backend):
    """Padding holds x's zero point; w's zero point one value (onnxruntime's), or one per output channel
    (against ONNX's reference, onnxruntime having no such form)."""
    x = RNG.integers(0, 255, (2, 4, 9, 8)).astype(np.uint8)
    w = RNG.integers(0, 255, (6, 4 // attrs.get("group", 1), 3, 3)).astype(np.uint8)
    consts = {"w": w, "zx": np.array(131, np.uint8), "zw": np.array(127, np.uint8)}
    got, want = run_both(backend, model("ConvInteger", {"x": x}, consts, TensorProto.INT32, opset=13, **attrs), {"x": x})
    np.testing.assert_array_equal(got, want)
    m = model("ConvInteger", {"x": x}, {**consts, "zw": RNG.integers(100, 150, 6).astype(np.uint8)},
              TensorProto.INT32, opset=13, **attrs)
    got = Executor(planner.compile(m, {"x": x.shape}), backend="numpy", poison=True).run({"x": x})["y"]
    np.testing.assert_array_equal(got, ReferenceEvaluator(m).run(None, {"x": x})[0])


def test_qlinear_conv_per_channel_with_bias(backend):
    x = RNG.integers(0, 255, (2, 3, 7, 7)).astype(np.uint8)
    w = RNG.integers(-127, 127, (4, 3, 3, 3)).astype(np.int8)
    consts = {"sx": np.array(0.02, np.float32), "zx": np.array(128, np.uint8), "w": w,
              "sw": RNG.uniform(0.005, 0.02, 4).astype(np.float32), "zw": np.zeros(4, np.int8),
              "sy": np.array(0.1, np.float32), "zy": np.array(100, np.uint8),
              "bias": RNG.integers(-2000, 2000, 4).astype(np.int32)}
    m = model("QLinearConv", {"x": x}, consts, TensorProto.UINT8, opset=13, pads=[1, 1, 1, 1])
    m.graph.node[0].input[:] = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"]
    got, want = run_both(backend, m, {"x": x})
    assert np.abs(got.astype(int) - want).max() <= 1  # onnxruntime requantizes in float32, memplan in float64
    assert np.mean(got == want) > 0.99


def test_dynamic_quantize_linear():
    x = RNG.normal(1, 3, (64, 33)).astype(np.float32)
    m = model("DynamicQuantizeLinear", {"x": x}, {}, TensorProto.UINT8, opset=13)
    m.graph.node[0].output[:] = ["y", "scale", "zero"]
    m.graph.output.extend(helper.make_tensor_value_info(n, t, None)
                          for n, t in (("scale", TensorProto.FLOAT), ("zero", TensorProto.UINT8)))
    plan = planner.compile(m, {"x": x.shape})
    got = Executor(plan, backend="numpy", poison=True).run({"x": x})
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for name, value in zip(("y", "scale", "zero"), want):
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger"])
def test_scratch_is_planned(op):
    """Large enough that a temporary of the data's size would show: every copy is in the workspace."""
    if op in ("QuantizeLinear", "DequantizeLinear"):
        x = RNG.normal(0, 5, (128, 256)).astype(np.float32) if op == "QuantizeLinear" else \
            RNG.integers(-128, 127, (128, 256)).astype(np.int8)
        m = model(op, {"x": x}, {"s": np.full((128, 32), 0.1, np.float32), "z": np.ones((128, 32), np.int8)},
                  TensorProto.UNDEFINED, opset=23, axis=1, block_size=8, **({"output_dtype": TensorProto.FLOAT16}
                                                                  if op == "DequantizeLinear" else {}))
    elif op == "MatMulInteger":
        x = RNG.integers(0, 255, (256, 128)).astype(np.uint8)
        m = model(op, {"x": x}, {"b": RNG.integers(0, 255, (128, 64)).astype(np.uint8)}, TensorProto.INT32)
    else:
        x = RNG.integers(0, 255, (2, 8, 64, 64)).astype(np.uint8)
        m = model(op, {"x": x}, {"w": RNG.integers(0, 255, (8, 8, 3, 3)).astype(np.uint8)}, TensorProto.INT32,
                  pads=[1, 1, 1, 1])
    plan = planner.compile(m, {"x": x.shape})
    assert any(step.workspace for step in plan.steps)
    ex = Executor(plan, backend="numpy")
    seen, _ = allocations(ex, lambda: ex.run({"x": x}))
    assert all(n <= BOUND for _, n in seen), seen


@pytest.mark.parametrize("op,consts,attrs,message", [
    ("QuantizeLinear", {"s": np.ones(3, np.float32)}, {"axis": 1}, "neither one value nor one per index"),
    ("QuantizeLinear", {"s": np.ones((4, 2), np.float32)}, {"axis": 1, "block_size": 2},
     "need a scale of shape \\(4, 3, 1, 1\\)"),
    ("QuantizeLinear", {"s": np.ones(5, np.float32), "z": np.ones(5, np.int8)}, {"output_dtype": TensorProto.UINT8},
     "differs from the zero point's dtype"),
    ("DequantizeLinear", {"s": np.ones(5, np.float32), "z": np.ones(4, np.int8)}, {}, "zero point's shape"),
    ("MatMulInteger", {"b": np.ones((5, 2), np.int8), "za": np.ones(3, np.int8)}, {}, "does not broadcast"),
    ("MatMulInteger", {"b": np.ones((5, 2), np.int8), "za": np.ones(4, np.int8), "zb": np.ones((5, 1), np.int8)}, {},
     "one value or one per column of B"),
    ("ConvInteger", {"w": np.ones((2, 4, 1, 1), np.int8)}, {}, "do not agree on channels"),
    ("ConvInteger", {"w": np.ones((2, 5, 1, 1), np.int8), "zx": np.ones(5, np.int8)}, {}, "x's zero point"),
    ("BitCast", {}, {"to": TensorProto.INT16}, "the widths must be equal"),
])
def test_refusals(op, consts, attrs, message):
    """Bad scales, zero points, dtypes and shapes are a ShapeError naming what is wrong."""
    x = np.ones((4, 5, 1, 1), np.int8 if op in ("DequantizeLinear", "MatMulInteger", "ConvInteger") else np.float32)
    if op == "MatMulInteger":
        x = x.reshape(4, 5)
    m = model(op, {"x": x}, consts, TensorProto.UNDEFINED, opset=26 if op == "BitCast" else 21, **attrs)
    with pytest.raises(planner.ShapeError, match=message):
        planner.compile(m, {"x": x.shape})
