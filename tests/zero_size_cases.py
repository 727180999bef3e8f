"""Zero-size cases for tests/test_zero_size.py: one small model per registered op whose input has a batch
of 0 (or another dim of 0 where the op has no batch), its feeds and its oracle; and the edge cases where an
empty input gives a non-empty output, or none at all."""
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from executor.collectives import Single
from planner import ops
from planner.ops.composite import Composite
from planner.ops.elementwise import Elementwise

RNG = np.random.default_rng(0)
F32, I64, I32, U8 = np.float32, np.int64, np.int32, np.uint8


class Feed(NamedTuple):
    """A graph input of `shape` and `dtype`, fed random values (none when it is empty)."""

    shape: tuple
    dtype: np.dtype


class Case(NamedTuple):
    """One node of `op` reading `inputs` (Feeds, initializer arrays, "" for omitted ones) with `outputs`
    outputs. The oracle: `want` (the outputs, for memplan's own ops), else onnxruntime, or ONNX's
    reference where `reference`; `refused`: why the op has no value here (memplan and the oracle both
    refuse it). `extra` Feeds are graph inputs named x0, x1, ... that the node does not read (a subgraph
    captures them); `before` nodes run first."""

    op: str
    inputs: tuple
    attrs: dict = {}
    outputs: int = 1
    domain: str = ""
    opset: int = 21
    want: tuple | None = None
    reference: bool = False
    refused: str | None = None
    extra: tuple = ()
    before: tuple = ()


def f(*shape, dtype=F32):
    return Feed(tuple(shape), np.dtype(dtype))


def w(*shape, dtype=F32):
    """A random initializer."""
    return RNG.standard_normal(shape).astype(dtype)


def k(value, dtype=I64):
    """A constant initializer."""
    return np.asarray(value, dtype)


def case(op, *inputs, outputs=1, domain="", opset=21, want=None, reference=False, refused=None, extra=(),
         before=(), **attrs):
    return Case(op, inputs, attrs, outputs, domain, opset, want, reference, refused, extra, before)


def ms(op, *inputs, **options):
    return case(op, *inputs, domain="com.microsoft", **options)


def mp(op, *inputs, want, **options):
    """A memplan op, with its known outputs."""
    return case(op, *inputs, domain="memplan", want=want, **options)


def empty(*shape, dtype=F32):
    return np.zeros(shape, dtype)


TYPES = {"tensor(float)": F32, "tensor(int32)": I32, "tensor(int64)": I64, "tensor(uint32)": np.uint32,
         "tensor(bool)": np.bool_}


def _dtype(op, opset):
    """The first of float32, int32, int64, uint32 and bool that ONNX's schema of `op` at `opset` allows."""
    allowed = set(onnx.defs.get_schema(op, opset).type_constraints[0].allowed_type_strs)
    return next(dtype for name, dtype in TYPES.items() if name in allowed)


def _families():
    """One case for each plain elementwise entry and composite: input (0, 3), a second one (3,) that
    broadcasts to it."""
    out = {}
    for (domain, op), versions in ops.SCHEMAS.items():
        schema = versions[-1][1]
        if type(schema) not in (Elementwise, Composite):
            continue
        opset = max(21, schema.since)
        dtype = F32 if domain else _dtype(op, opset)
        inputs = (f(0, 3, dtype=dtype),) if schema.arity == 1 else (f(0, 3, dtype=dtype), f(3, dtype=dtype))
        attrs = {"Mod": {"fmod": 1}, "BitShift": {"direction": "LEFT"}}.get(op, {})
        out[domain, op] = case(op, *inputs, domain=domain, opset=opset, **attrs)
    return out


def body(nodes, inputs, outputs):
    """A subgraph of (op, inputs, outputs) nodes over typed `inputs` ((name, dtype, shape) triples)."""
    return helper.make_graph(
        [helper.make_node(op, i, o) for op, i, o in nodes], "body",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), shape)
         for n, t, shape in inputs],
        [onnx.ValueInfoProto(name=n) for n in outputs])


POOL = {"kernel_shape": [2, 2]}
RNN = {"hidden_size": 4}
CONV = (f(0, 2, 5, 5), w(3, 2, 3, 3), w(3))
LN = (f(0, 16), w(16), w(16))
RECV = {"shape": [0, 3], "tag": 7}

CASES = {**_families(), **{("", c.op): c for c in [
    case("AffineGrid", f(0, 2, 3), k([0, 1, 2, 2])),
    case("ArgMax", f(0, 3), axis=1),
    case("ArgMin", f(0, 3), axis=1),
    case("Attention", f(0, 2, 3, 4), f(0, 2, 5, 4), f(0, 2, 5, 4), opset=23, reference=True),  # onnxruntime: B >= 1
    case("AveragePool", f(0, 2, 4, 4), **POOL),
    case("BatchNormalization", f(0, 3, 2, 2), w(3), w(3), w(3), np.abs(w(3)) + 1),
    case("Bernoulli", f(0, 3)),
    case("BitCast", f(0, 3), to=TensorProto.INT32, opset=26),
    case("BlackmanWindow", k(0), reference=True),
    case("Cast", f(0, 3), to=TensorProto.INT64),
    case("CastLike", f(0, 3), k([1], I32)),
    case("CausalConvWithState", f(0, 2, 5), w(2, 1, 3), w(2), opset=27, outputs=2),
    case("CenterCropPad", f(0, 4, 4), k([2, 2]), axes=[1, 2]),
    case("Clip", f(0, 3), k(-1, F32), k(1, F32)),
    case("Col2Im", f(0, 4, 9), k([4, 4]), k([2, 2])),
    case("Concat", f(0, 3), f(0, 2), axis=1),
    case("ConstantOfShape", k([0, 3])),
    case("Conv", *CONV),
    case("ConvInteger", f(0, 2, 5, 5, dtype=U8), w(3, 2, 3, 3).astype(U8)),
    case("ConvTranspose", f(0, 2, 3, 3), w(2, 3, 3, 3)),
    case("CumProd", f(0, 3), k(1), opset=26),
    case("CumSum", f(0, 3), k(1)),
    case("DFT", f(0, 8, 1), "", k(1)),
    case("DeformConv", f(0, 2, 4, 4), w(3, 2, 2, 2), f(0, 8, 3, 3), kernel_shape=[2, 2]),
    case("DepthToSpace", f(0, 4, 2, 2), blocksize=2),
    case("DequantizeLinear", f(0, 3, dtype=U8), k(0.5, F32), k(1, U8)),
    case("Det", f(0, 3, 3)),
    case("Dropout", f(0, 3)),
    # the range of no values, widened to hold 0, is [0, 0], as for zeros (onnxruntime's scale is 1 here, 1/255 there)
    case("DynamicQuantizeLinear", f(0, 3), outputs=3, want=(empty(0, 3, dtype=U8), k(1 / 255, F32), k(0, U8))),
    case("Einsum", f(0, 3), w(3, 4), equation="ij,jk->ik"),
    case("Expand", f(0, 1), k([1, 3])),
    case("EyeLike", f(0, 3)),
    case("Flatten", f(0, 3, 4), axis=1),
    case("GRU", f(5, 0, 3), w(1, 12, 3), w(1, 12, 4), outputs=2, reference=True, **RNN),  # onnxruntime aborts
    case("Gather", f(0, 3), k([0, 2]), axis=1),
    case("GatherElements", f(0, 3), f(0, 2, dtype=I64), axis=1),
    case("GatherND", f(3, 4), f(0, 1, dtype=I64)),
    case("Gemm", f(0, 3), w(3, 4), w(4)),
    case("GlobalAveragePool", f(0, 2, 3, 3)),
    case("GlobalLpPool", f(0, 2, 3, 3)),
    case("GlobalMaxPool", f(0, 2, 3, 3)),
    case("GridSample", f(0, 1, 3, 3), f(0, 2, 2, 2)),
    # onnxruntime's and the reference's function bodies reshape to (0, groups, -1), which no batch of 0 can take
    case("GroupNormalization", f(0, 4, 2, 2), w(4), w(4), num_groups=2, want=(empty(0, 4, 2, 2),)),
    case("HammingWindow", k(0), reference=True),
    case("HannWindow", k(0), reference=True),
    case("Hardmax", f(0, 3)),
    case("Identity", f(0, 3)),
    case("If", f(dtype=np.bool_), extra=(f(0, 3),), then_branch=body([("Relu", ["x0"], ["t"])], [], ["t"]),
         else_branch=body([("Neg", ["x0"], ["e"])], [], ["e"])),
    case("InstanceNormalization", f(0, 3, 2, 2), w(3), w(3)),
    case("LRN", f(0, 3, 2, 2), size=3),
    case("LSTM", f(5, 0, 3), w(1, 16, 3), w(1, 16, 4), outputs=3, reference=True, **RNN),  # onnxruntime aborts
    case("LayerNormalization", *LN),
    case("LinearAttention", f(0, 3, 8), f(0, 3, 8), f(0, 3, 8), outputs=2, opset=27, q_num_heads=2,
         kv_num_heads=2, update_rule="linear", reference=True),
    case("LogSoftmax", f(0, 3)),
    case("Loop", k(2), "", f(0, 3), body=body([("Identity", ["c"], ["c_out"]), ("Add", ["v", "v"], ["v_out"])],
                                               [("n", I64, []), ("c", np.bool_, []), ("v", F32, None)],
                                               ["c_out", "v_out"])),
    case("LpNormalization", f(0, 3)),
    case("LpPool", f(0, 2, 4, 4), **POOL),
    case("MatMul", f(0, 3), w(3, 4)),
    case("MatMulInteger", f(0, 3, dtype=U8), w(3, 4).astype(U8)),
    case("MaxPool", f(0, 2, 4, 4), outputs=2, **POOL),
    case("MaxRoiPool", f(1, 2, 4, 4), f(0, 5), pooled_shape=[2, 2]),
    case("MaxUnpool", f(0, 2, 2, 2), f(0, 2, 2, 2, dtype=I64), **POOL, strides=[2, 2]),
    case("MeanVarianceNormalization", f(0, 3, 2, 2)),
    case("MelWeightMatrix", k(0), k(16), k(8000), k(0, F32), k(4000, F32)),
    case("Multinomial", f(0, 3), sample_size=2, want=(empty(0, 2, dtype=I32),)),  # onnxruntime: batch >= 1
    case("NegativeLogLikelihoodLoss", f(0, 3), f(0, dtype=I64), reduction="none"),
    case("NonMaxSuppression", f(1, 0, 4), f(1, 1, 0), k([3])),
    case("OneHot", f(0, dtype=I64), k(3), k([0, 1], F32)),
    case("PRelu", f(0, 3), w(3)),
    case("Pad", f(0, 3), k([0, 1, 0, 1])),
    case("QLinearConv", f(0, 2, 5, 5, dtype=U8), k(0.5, F32), k(1, U8), w(3, 2, 3, 3).astype(U8), k(0.5, F32),
         k(1, U8), k(0.25, F32), k(2, U8)),
    case("QLinearMatMul", f(0, 3, dtype=U8), k(0.5, F32), k(1, U8), w(3, 4).astype(U8), k(0.5, F32), k(1, U8),
         k(0.25, F32), k(2, U8)),
    case("QuantizeLinear", f(0, 3), k(0.5, F32), k(1, U8)),
    case("RMSNormalization", f(0, 16), w(16), opset=23),
    case("RNN", f(5, 0, 3), w(1, 4, 3), w(1, 4, 4), outputs=2, **RNN),
    case("RandomNormal", shape=[0, 3], want=(empty(0, 3),)),
    case("RandomNormalLike", f(0, 3), want=(empty(0, 3),)),
    case("RandomUniform", shape=[0, 3], want=(empty(0, 3),)),
    case("RandomUniformLike", f(0, 3), want=(empty(0, 3),)),
    case("Range", k(2, F32), k(2, F32), k(1, F32)),
    case("ReduceL1", f(0, 3), k([1])),
    case("ReduceL2", f(0, 3), k([1])),
    case("ReduceLogSum", f(0, 3), k([1])),
    case("ReduceLogSumExp", f(0, 3), k([1])),
    case("ReduceMax", f(0, 3), k([1])),
    case("ReduceMean", f(0, 3), k([1])),
    case("ReduceMin", f(0, 3), k([1])),
    case("ReduceProd", f(0, 3), k([1])),
    case("ReduceSum", f(0, 3), k([1])),
    case("ReduceSumSquare", f(0, 3), k([1])),
    case("Reshape", f(0, 3), k([-1, 3])),
    case("Resize", f(0, 1, 2, 2), "", k([1, 1, 2, 2], F32)),
    case("ReverseSequence", f(3, 0, 2), f(0, dtype=I64)),
    case("RoiAlign", f(1, 2, 4, 4), f(0, 4), f(0, dtype=I64), output_height=2, output_width=2),
    case("RotaryEmbedding", f(0, 3, 8), w(5, 2), w(5, 2), f(0, 3, dtype=I64), num_heads=2, opset=23),
    case("Scan", f(2, 0, 3), num_scan_inputs=1, body=body([("Relu", ["s"], ["r"])], [("s", F32, None)], ["r"])),
    case("STFT", f(0, 16, 1), k(4), "", k(8), opset=21),
    case("ScatterElements", f(0, 3), f(0, 2, dtype=I64), f(0, 2), axis=1),
    case("ScatterND", f(3, 4), f(0, 1, dtype=I64), f(0, 4)),
    case("Shape", f(0, 3)),
    case("SimplifiedLayerNormalization", f(0, 16), w(16)),
    case("Size", f(0, 3)),
    case("Slice", f(0, 5), k([1]), k([3]), k([1])),
    case("Softmax", f(0, 3)),
    # onnxruntime's and the reference's function bodies reshape to (0, 3, -1), as GroupNormalization's
    case("SoftmaxCrossEntropyLoss", f(0, 3), f(0, dtype=I64), reduction="none", want=(empty(0),)),
    case("SpaceToDepth", f(0, 1, 4, 4), blocksize=2),
    case("Split", f(0, 4), k([1, 3]), axis=1, outputs=2),
    case("Squeeze", f(0, 1, 3), k([1])),
    case("SwiGLU", f(0, 4), f(0, 4), opset=28, reference=True),
    case("TensorScatter", f(0, 2, 5, 4), f(0, 2, 1, 4), f(0, dtype=I64), opset=24),
    case("Tile", f(0, 3), k([2, 1])),
    case("TopK", f(0, 5), k([2]), outputs=2),
    case("Transpose", f(0, 3), perm=[1, 0]),
    case("Trilu", f(0, 3)),
    case("Unsqueeze", f(0, 3), k([1])),
    case("Where", f(0, 3, dtype=np.bool_), f(0, 3), f(3)),
]}, **{("com.microsoft", c.op): c for c in [
    ms("Attention", f(0, 3, 8), w(8, 24), w(24), num_heads=2),
    ms("BiasGelu", f(0, 4), w(4)),
    ms("EmbedLayerNormalization", f(0, 3, dtype=I32), f(0, 3, dtype=I32), w(10, 8), w(5, 8), w(2, 8), w(8), w(8),
       outputs=2),
    ms("FastGelu", f(0, 4), w(4)),
    ms("FusedConv", *CONV, activation="Relu"),
    ms("GroupQueryAttention", f(0, 1, 16), f(0, 1, 16), f(0, 1, 16), "", "", k([], I32), k(1, I32), outputs=3,
       num_heads=2, kv_num_heads=2, want=(empty(0, 1, 16), empty(0, 2, 1, 8), empty(0, 2, 1, 8))),  # onnxruntime dies
    ms("MultiHeadAttention", f(0, 3, 8), f(0, 3, 8), f(0, 3, 8), num_heads=2),
    ms("RotaryEmbedding", f(0, 3, 8), f(0, 3, dtype=I64), w(5, 2), w(5, 2), num_heads=2),
    ms("SimplifiedLayerNormalization", f(0, 16), w(16), want=(empty(0, 16),)),  # onnxruntime: in ONNX's domain
    ms("SkipLayerNormalization", f(0, 3, 8), f(0, 3, 8), w(8), w(8), w(8), outputs=4),
    ms("SkipSimplifiedLayerNormalization", f(0, 3, 8), f(0, 3, 8), w(8), outputs=4),
]}, **{("memplan", c.op): c for c in [
    mp("Adam", k(0.1, F32), k(1, F32), f(0, 3), f(0, 3), f(0, 3), f(0, 3), outputs=3, want=(empty(0, 3),) * 3),
    mp("AddLayerNormalization", f(0, 16), f(0, 16), w(16), w(16), outputs=2, want=(empty(0, 16),) * 2),
    mp("AllGather", f(0), shape=[0, 3], want=(empty(0, 3),)),
    mp("AllReduce", f(0, 3), want=(empty(0, 3),)),
    mp("Assign", f(0, 3), want=(empty(0, 3),)),
    mp("BatchedConv", *CONV, want=(empty(0, 3, 3, 3),)),
    mp("BiasActivation", f(0, 4), w(4), want=(empty(0, 4),)),
    mp("BiasActivationGrad", f(0, 4), f(0, 4), w(4), want=(empty(0, 4),)),
    mp("CacheWrite", f(0, 2, 5, 4), f(0, 2, 1, 4), k(2), want=(empty(0, 2, 5, 4),)),
    mp("SwapOut", f(0, 3), want=(empty(0, 3),)),
    mp("SwapIn", f(0, 3), want=(empty(0, 3),)),
    mp("Dropout", f(0, 3), k(1, F32), outputs=2, want=(empty(0, 3), empty(0, 3, dtype=np.bool_))),
    mp("InvertedResidual", f(0, 4, 5, 5), w(8, 4, 1, 1), w(8), w(8, 1, 3, 3), w(8), w(4, 8, 1, 1), w(4),
       want=(empty(0, 4, 5, 5),)),
    mp("LayerNormalizationGrad", f(0, 16), f(0, 16), w(16), outputs=3, want=(empty(0, 16), empty(16), empty(16))),
    mp("ParallelInput", f(0, 3), want=(empty(0, 3),)),
    mp("Recv", want=(empty(0, 3),), extra=(f(0, 3),), **RECV,
       before=(helper.make_node("Send", ["x0"], [], domain="memplan", tag=RECV["tag"]),)),
    mp("ReduceScatter", f(0, 3), want=(empty(0),)),
    mp("SGD", k(0.1, F32), f(0, 3), f(0, 3), want=(empty(0, 3),)),
    mp("ScaledDotProductAttention", f(0, 2, 3, 4), f(0, 2, 5, 4), f(0, 2, 5, 4), want=(empty(0, 2, 3, 4),)),
    mp("ScaledDotProductAttentionGrad", f(0, 2, 3, 4), f(0, 2, 5, 4), f(0, 2, 5, 4), "", f(0, 2, 3, 4), "",
       f(0, 2, 3, 4), outputs=3, want=(empty(0, 2, 3, 4), empty(0, 2, 5, 4), empty(0, 2, 5, 4))),
    mp("Select", f(dtype=np.bool_), f(0, 3), f(0, 3), want=(empty(0, 3),)),
    mp("Shard", f(0, 3), want=(empty(0),)),
    mp("SoftmaxCrossEntropyGrad", f(0, 3), f(0, dtype=I64), "", k(1, F32), want=(empty(0, 3),)),
    mp("WinogradConv", f(0, 2, 5, 5), w(3, 2, 3, 3), pads=[1, 1, 1, 1], want=(empty(0, 3, 5, 5),)),
]}}
CASES["memplan", "Send"] = CASES["memplan", "Recv"]

EMPTY_SET = ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
             "ReduceLogSum", "ReduceLogSumExp")
CHANNELS_0 = (f(2, 0, 5, 5), w(3, 0, 3, 3))
NO_VALUES = "the statistics of an empty set (onnxruntime refuses it)"
H0, C0 = w(1, 2, 4), w(1, 2, 4)

EDGES = {
    **{f"{op} over an empty axis": case(op, f(0, 3), k([0]), keepdims=0) for op in EMPTY_SET},
    "ReduceMax of int64 over an empty axis": case("ReduceMax", f(0, 3, dtype=I64), k([0])),
    "ReduceSum of everything": case("ReduceSum", f(0, 3)),
    # ONNX leaves the mean of an empty set undefined: NaN, as NumPy and PyTorch (onnxruntime gives 0)
    "ReduceMean over an empty axis": case("ReduceMean", f(0, 3), k([0]), keepdims=0, want=(np.full(3, np.nan, F32),)),
    "NegativeLogLikelihoodLoss mean of none": case("NegativeLogLikelihoodLoss", f(0, 3), f(0, dtype=I64),
                                                   want=(k(np.nan, F32),)),
    "SoftmaxCrossEntropyLoss mean of none": case("SoftmaxCrossEntropyLoss", f(0, 3), f(0, dtype=I64),
                                                 want=(k(np.nan, F32),)),
    "ArgMax over an empty axis": case("ArgMax", f(0, 3), refused="no index to give"),
    "ArgMin over an empty axis": case("ArgMin", f(0, 3), keepdims=0, refused="no index to give"),
    "MatMul over K = 0": case("MatMul", f(2, 0), w(0, 4)),
    "Gemm over K = 0": case("Gemm", f(2, 0), w(0, 4), w(4)),
    "Einsum over K = 0": case("Einsum", f(2, 0), w(0, 4), equation="ij,jk->ik"),
    "Conv of no channels": case("Conv", *CHANNELS_0, w(3)),
    "Conv 1x1 of no channels": case("Conv", f(2, 0, 5, 5), w(3, 0, 1, 1), w(3)),
    "ConvTranspose of no channels": case("ConvTranspose", f(2, 0, 3, 3), w(0, 3, 3, 3), w(3)),
    "FusedConv of no channels": ms("FusedConv", *CHANNELS_0, w(3), activation="Relu"),
    # onnxruntime leaves these outputs unwritten: the empty sums are 0, and y_zero_point once requantized
    "ConvInteger of no channels": case("ConvInteger", f(2, 0, 5, 5, dtype=U8), w(3, 0, 3, 3).astype(U8),
                                       want=(empty(2, 3, 3, 3, dtype=I32),)),
    "QLinearConv of no channels": case("QLinearConv", f(2, 0, 5, 5, dtype=U8), k(0.5, F32), k(1, U8),
                                       w(3, 0, 3, 3).astype(U8), k(0.5, F32), k(1, U8), k(0.25, F32), k(2, U8),
                                       want=(np.full((2, 3, 3, 3), 2, U8),)),
    "LRN of no channels": case("LRN", f(2, 0, 2, 2), size=3),
    "Conv of an empty image, all padding": case("Conv", f(1, 2, 0, 0), w(3, 2, 1, 1), w(3), pads=[1, 1, 1, 1]),
    "ConvTranspose of an empty image": case("ConvTranspose", f(1, 2, 0, 0), w(2, 3, 3, 3), w(3)),
    "DeformConv of an empty image": case("DeformConv", f(1, 2, 0, 0), w(3, 2, 1, 1), f(1, 2, 2, 2), kernel_shape=[1, 1],
                                         pads=[1, 1, 1, 1], refused="no pixels to sample"),
    "GridSample of an empty image": case("GridSample", f(1, 1, 0, 0), f(1, 2, 2, 2), refused="no pixels to sample"),
    "RoiAlign of an empty image": case("RoiAlign", f(1, 2, 0, 0), f(1, 4), f(1, dtype=I64), output_height=2,
                                       output_width=2),
    "MaxRoiPool of an empty image": case("MaxRoiPool", f(1, 2, 0, 0), f(1, 5), pooled_shape=[2, 2]),
    "Resize of an empty axis to 0": case("Resize", f(0, 1, 2, 2), "", "", k([0, 1, 4, 4])),
    "Resize of an empty axis to 2": case("Resize", f(1, 1, 0, 2), "", "", k([1, 1, 2, 2]), refused="no values"),
    "CenterCropPad of an empty batch": case("CenterCropPad", f(0, 4), k([2, 4])),
    "TensorScatter of no new tokens": case("TensorScatter", f(2, 2, 5, 4), f(2, 2, 0, 4), f(2, dtype=I64), opset=24),
    "Einsum of empty vectors": case("Einsum", f(0), f(0), equation="i,i->"),
    # onnxruntime's QLinearMatMul gives 0, not the output's zero point, for the empty sums (as QLinearConv above)
    "MatMulInteger over K = 0": case("MatMulInteger", f(2, 0, dtype=U8), w(0, 4).astype(U8),
                                     want=(empty(2, 4, dtype=np.int32),)),  # onnxruntime leaves it unwritten
    "QLinearMatMul over K = 0": case("QLinearMatMul", f(2, 0, dtype=U8), k(0.5, F32), k(1, U8), w(0, 4).astype(U8),
                                     k(0.5, F32), k(1, U8), k(0.25, F32), k(2, U8), want=(np.full((2, 4), 2, U8),)),
    "Concat of an empty piece": case("Concat", f(0, 3), f(2, 3), axis=0),
    "Split into an empty piece": case("Split", f(2, 4), k([0, 4]), axis=1, outputs=2),
    "Pad of an empty axis": case("Pad", f(0, 3), k([1, 0, 1, 0]), k(2.5, F32)),
    **{f"Pad {mode} of an empty axis": case("Pad", f(0, 3), k([1, 0, 1, 0]), mode=mode, refused="no value to copy")
       for mode in ("reflect", "edge", "wrap")},
    "BatchNormalization training on an empty batch": case(
        "BatchNormalization", f(0, 3, 2, 2), w(3), w(3), w(3), np.abs(w(3)) + 1, training_mode=1, outputs=3),
    "LayerNormalization over empty dims": case("LayerNormalization", f(4, 0), w(0), w(0), refused=NO_VALUES),
    "SimplifiedLayerNormalization over empty dims": case("SimplifiedLayerNormalization", f(4, 0), w(0),
                                                         refused=NO_VALUES),
    "RMSNormalization over empty dims": case("RMSNormalization", f(4, 0), w(0), opset=23, refused=NO_VALUES),
    "SkipLayerNormalization over empty dims": ms("SkipLayerNormalization", f(2, 3, 0), f(2, 3, 0), w(0), w(0),
                                                 refused=NO_VALUES),
    "AddLayerNormalization over empty dims": mp("AddLayerNormalization", f(4, 0), f(4, 0), w(0), want=None,
                                                refused=NO_VALUES),
    **{f"{op} over empty images": case(op, f(2, 3, 0, 0), refused=NO_VALUES)
       for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")},
    "OneHot of depth 0": case("OneHot", f(2, dtype=I64), k(0), k([0, 1], F32), refused="no class to mark"),
    "Det of a 0 x 0 matrix": case("Det", f(0, 0)),
    # after no time steps Y_h is initial_h, Y_c initial_c (onnxruntime gives zeros; ONNX's reference cannot run it)
    "RNN over no time steps": case("RNN", f(0, 2, 3), w(1, 4, 3), w(1, 4, 4), "", "", H0, outputs=2, hidden_size=4,
                                   want=(empty(0, 1, 2, 4), H0)),
    "LSTM over no time steps": case("LSTM", f(0, 2, 3), w(1, 16, 3), w(1, 16, 4), "", "", H0, C0, outputs=3,
                                    hidden_size=4, want=(empty(0, 1, 2, 4), H0, C0)),
    "EmbedLayerNormalization of empty sequences": ms("EmbedLayerNormalization", f(2, 0, dtype=I32),
                                                     f(2, 0, dtype=I32), w(10, 8), w(5, 8), w(2, 8), w(8), w(8),
                                                     outputs=2),
    "NonMaxSuppression of no classes": case("NonMaxSuppression", f(1, 3, 4), f(1, 0, 3), k([3])),
    "ScatterElements of no updates": case("ScatterElements", f(3, 4), f(0, 4, dtype=I64), f(0, 4)),
    "Gather of no indices": case("Gather", f(3, 4), k(np.zeros(0, I64))),
    "TopK of k = 0": case("TopK", f(3, 5), k([0]), outputs=2),
    "Expand to an empty dim": case("Expand", f(2, 1), k([2, 0])),
}
"""Where an empty input meets a non-empty output (or none): ONNX's values over an empty set, contractions
over no terms, padding and concatenation, and the refusals (`refused`: why the op has no value there)."""


class Loopback(Single):
    """One rank that receives what it sent itself."""

    def __init__(self):
        self.sent = {}

    def send(self, x, peer, tag):
        self.sent[tag] = x.copy()

    def recv(self, y, peer, tag):
        y[...] = self.sent.pop(tag)


def build(c):
    """(the case's model, its feeds)."""
    graph_inputs, inits, names, feeds, rng = [], [], [], {}, np.random.default_rng(0)
    specs = [*((f"i{j}", s) for j, s in enumerate(c.inputs)), *((f"x{j}", s) for j, s in enumerate(c.extra))]
    for name, spec in specs:
        if isinstance(spec, Feed):
            graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(spec.dtype),
                                                              spec.shape))
            feeds[name] = _values(spec, rng)
        elif isinstance(spec, np.ndarray):
            inits.append(numpy_helper.from_array(spec, name))
        if name.startswith("i"):
            names.append("" if isinstance(spec, str) else name)
    outputs = [f"o{j}" for j in range(c.outputs)]
    node = helper.make_node(c.op, names, outputs, domain=c.domain, **c.attrs)
    graph = helper.make_graph([*c.before, node], "zero", graph_inputs,
                              [onnx.ValueInfoProto(name=o) for o in outputs], inits)
    opsets = [helper.make_opsetid("", c.opset), *(helper.make_opsetid(d, 1) for d in ("com.microsoft", "memplan"))]
    return helper.make_model(graph, opset_imports=opsets), feeds


def _values(spec, rng):
    """Random values of a Feed: standard normal floats, 0 or 1 for integers and bools."""
    if spec.dtype == np.bool_:
        return np.asarray(rng.random(spec.shape) < 0.5)
    if spec.dtype.kind in "iu":
        return rng.integers(0, 2, spec.shape).astype(spec.dtype)
    return rng.standard_normal(spec.shape).astype(spec.dtype)


def oracle(c, m, feeds):
    """{output name: value} by the case's oracle."""
    if c.want is not None:
        return dict(zip((o.name for o in m.graph.output), c.want))
    if c.reference:
        return dict(zip((o.name for o in m.graph.output), ReferenceEvaluator(m).run(None, feeds)))
    import onnxruntime as ort
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip((o.name for o in m.graph.output), session.run(None, feeds)))


