"""ONNX Runtime's contrib activations and normalisations (domain "com.microsoft", version 1), as its
transformer optimizer and Optimum's exports write them: Gelu, FastGelu, QuickGelu, BiasGelu,
SkipLayerNormalization, SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization and BERT's
EmbedLayerNormalization. All are composites: planning replaces them by the ops they are made of.
The attention ops are in contrib_attention.py."""
import numpy as np

from .registry import register, schema
from .attention import given, output, wants, widening
from .base import FLOATS, Schema, axis as to_axis, broadcast, constant_shape, normalised_dims
from .composite import Composite
from ..dtypes import to_onnx
from ..errors import ShapeError

DOMAIN = "com.microsoft"
ONE_TYPE = (("T",), {"T": FLOATS})
"""The contrib activations' type constraint: every input one float type."""


class Biased(Composite):
    """An activation of X plus an optional bias that broadcasts to X (BiasGelu, FastGelu)."""

    arity = None
    types = ONE_TYPE

    def infer(self, node, ins):
        x, *bias = ins
        for info in filter(None, bias):
            if info.rank != 1 or info.shape[0] != x.shape[-1]:
                raise ShapeError(f"the bias must be 1-D of the input's last dim {x.shape[-1]}, got {info.shape}")
        return super().infer(node, ins)


def _gelu(b, node, x):
    return b.op("Gelu", x)


def _fast_gelu(b, node, x, bias=None):
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), of x + bias: ONNX's tanh Gelu."""
    return b.op("Gelu", x if bias is None else b.op("Add", x, bias), approximate="tanh")


def _bias_gelu(b, node, x, bias):
    return b.op("Gelu", b.op("Add", x, bias))


def _quick_gelu(b, node, x, alpha):
    return b.op("Mul", x, b.op("Sigmoid", b.op("Mul", x, b.const(alpha, x))))


register(Composite("Gelu", _gelu, domain=DOMAIN, types=ONE_TYPE))
register(Composite("QuickGelu", _quick_gelu, {"alpha": 1.702}, domain=DOMAIN, types=ONE_TYPE))
register(Biased("FastGelu", _fast_gelu, domain=DOMAIN))
register(Biased("BiasGelu", _bias_gelu, domain=DOMAIN))


class SkipNormalization(Schema):
    """SkipLayerNormalization and SkipSimplifiedLayerNormalization (with `rms`): s = input + skip
    (+ bias), normalised over its last dim (centred first unless `rms`), times gamma (plus beta).
    Outputs: the result, the mean (zeros with `rms`, as ONNX Runtime's) and 1 / std over the last dim
    (float32, shape (..., 1)), and s.
    Statistics are taken in float32 for narrow floats."""

    domain = DOMAIN
    defaults = {"epsilon": 1e-12}

    def __init__(self, op, rms):
        self.op, self.rms = op, rms
        weights = ("gamma",) if rms else ("gamma", "beta")
        self.inputs = ("input", "skip", *weights, "bias")
        self.types = (("T",) * len(self.inputs), {"T": FLOATS - {"tensor(double)"}})

    def infer(self, node, ins):
        t = given(self.inputs, ins)
        x = t["input"]
        if x.rank not in (2, 3):
            raise ShapeError(f"the input must be 2-D or 3-D, got shape {x.shape}")
        normalised_dims(x.shape, x.rank - 1)
        if broadcast(x.shape, t["skip"].shape) != x.shape:
            raise ShapeError(f"skip of shape {t['skip'].shape} does not broadcast to the input's {x.shape}")
        for name in set(t) - {"input", "skip"}:
            if t[name].shape != (x.shape[-1],):
                raise ShapeError(f"{name} must have the hidden size's shape ({x.shape[-1]},), got {t[name].shape}")
        stats = (*x.shape[:-1], 1)
        return [(x.shape, x.dtype), (stats, np.dtype(np.float32)), (stats, np.dtype(np.float32)), (x.shape, x.dtype)]

    def decompose(self, b, node):
        t = given(self.inputs, node.inputs)
        dtype = b.dtype(t["input"])
        widen = widening(self, b, dtype)
        total = b.op("Add", t["input"], t["skip"])
        if "bias" in t:
            total = b.op("Add", total, t["bias"])
        y, mean, inv = normalised(b, widen(total), [-1], self.attr(node, "epsilon"), self.rms, widen(t["gamma"]))
        if "beta" in t:
            y = b.op("Add", y, widen(t["beta"]))
        if mean is None and wants(node, 1):
            mean = b.op("ConstantOfShape", shape=[*b.shape(t["input"])[:-1], 1], value=np.zeros(1, np.float32))
        y = b.cast(y, dtype) if self.accumulation(dtype) != dtype else y
        return [y, *(output(b, name, node, k) for k, name in enumerate((mean, inv, total), 1))]


def normalised(b, x, axes, epsilon, rms, scale):
    """(x - mean) / sqrt(var + epsilon) * scale, or with `rms` x / sqrt(mean(x^2) + epsilon) * scale,
    over `axes`; and the mean (None with `rms`) and 1 / sqrt(...), kept over `axes`."""
    mean = None
    if not rms:
        mean = b.op("ReduceMean", x, axes=axes, keepdims=1)
        x = b.op("Sub", x, mean)
    square = b.op("ReduceMean", b.op("Mul", x, x), axes=axes, keepdims=1)
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", square, b.const(epsilon, scale))))
    return b.op("Mul", b.op("Mul", x, inv), scale), mean, inv


@schema("SimplifiedLayerNormalization")  # where ONNX Runtime's LLaMA fusion writes it
@schema("SimplifiedLayerNormalization", domain=DOMAIN)
class SimplifiedLayerNormalization(Schema):
    """SimplifiedLayerNormalization (RMS norm; ONNX Runtime defines it in ONNX's own domain, version 1):
    X / sqrt(mean(X^2) + epsilon) * scale over the dims from `axis`; outputs Y (scale's dtype) and
    1 / sqrt(...) (stash_type's dtype), computed in float32 for narrow floats."""

    defaults = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    types = (("T", "V"), {"T": FLOATS, "V": FLOATS})

    def infer(self, node, ins):
        x, scale = ins
        first = to_axis(self.attr(node, "axis"), x.rank)
        dims = normalised_dims(x.shape, first)
        if broadcast(dims, scale.shape) != dims:
            raise ShapeError(f"scale of shape {scale.shape} does not broadcast to the normalised dims {dims}")
        if self.attr(node, "stash_type") not in (1, 11):
            raise ShapeError(f"stash_type must be 1 (float) or 11 (double), got {self.attr(node, 'stash_type')}")
        stash = np.dtype(np.float64 if self.attr(node, "stash_type") == 11 else np.float32)
        return [(x.shape, scale.dtype), ((*x.shape[:first], *[1] * (x.rank - first)), stash)]

    def decompose(self, b, node):
        x, scale = node.inputs
        rank = len(b.shape(x))
        axes = list(range(to_axis(self.attr(node, "axis"), rank), rank))
        stash = np.float64 if self.attr(node, "stash_type") == 11 else np.float32
        wide = np.result_type(stash, self.accumulation(b.dtype(x)))
        x_wide = b.cast(x, wide) if wide != b.dtype(x) else x
        y, _, inv = normalised(b, x_wide, axes, self.attr(node, "epsilon"), True,
                               b.cast(scale, wide) if wide != b.dtype(scale) else scale)
        return [b.cast(y, b.dtype(scale)) if wide != b.dtype(scale) else y,
                output(b, b.cast(inv, stash) if wide != stash else inv, node, 1)]


register(SkipNormalization("SkipLayerNormalization", rms=False))
register(SkipNormalization("SkipSimplifiedLayerNormalization", rms=True))


@schema("EmbedLayerNormalization", domain=DOMAIN)
class EmbedLayerNormalization(Schema):
    """EmbedLayerNormalization (BERT's embeddings): the word, position (position_ids, or 0 to S - 1) and
    segment embeddings of the ids, summed and layer-normalised; mask_index, each batch's count of ones
    in mask (zeros without one); embedding_sum, the sum before normalising."""

    names = ("input_ids", "segment_ids", "word_embedding", "position_embedding", "segment_embedding", "gamma",
             "beta", "mask", "position_ids")
    defaults = {"epsilon": 1e-12, "mask_index_type": 1}
    types = (("I", "I", "T", "T", "T", "T", "T", "I", "I"),
             {"I": frozenset({"tensor(int32)"}), "T": frozenset({"tensor(float)", "tensor(float16)"})})

    def infer(self, node, ins):
        t = given(self.names, ins)
        ids, words = t["input_ids"], t["word_embedding"]
        hidden = words.shape[-1]
        if ids.rank != 2 or ("segment_ids" in t) != ("segment_embedding" in t):
            raise ShapeError(f"input_ids must be (batch, sequence), got {ids.shape}; segment_ids and "
                             "segment_embedding must be given together")
        for name in ("segment_ids", "mask"):
            if name in t and t[name].shape != ids.shape:
                raise ShapeError(f"{name} must have input_ids' shape {ids.shape}, got {t[name].shape}")
        for name in ("position_embedding", "segment_embedding"):
            if name in t and (t[name].rank != 2 or t[name].shape[1] != hidden):
                raise ShapeError(f"{name} must be (rows, {hidden}), got {t[name].shape}")
        if "position_ids" in t and t["position_ids"].shape not in (ids.shape, (1, ids.shape[1])):
            raise ShapeError(f"position_ids must be {ids.shape} or (1, {ids.shape[1]}), got {t['position_ids'].shape}")
        out = ((*ids.shape, hidden), words.dtype)
        return [out, ((ids.shape[0],), ids.dtype), out]

    def decompose(self, b, node):
        t = given(self.names, node.inputs)
        ids = t["input_ids"]
        batch, seq = b.shape(ids)
        positions = t.get("position_ids")
        if not positions:
            positions = b.const(np.arange(constant_shape(node, "its positions", seq)[0])[None], ids)
        total = b.op("Add", b.op("Gather", t["word_embedding"], ids, axis=0),
                     b.op("Gather", t["position_embedding"], positions, axis=0))
        if "segment_ids" in t:
            total = b.op("Add", total, b.op("Gather", t["segment_embedding"], t["segment_ids"], axis=0))
        dtype = b.dtype(t["word_embedding"])
        widen = widening(self, b, dtype)
        y, _, _ = normalised(b, widen(total), [-1], self.attr(node, "epsilon"), False, widen(t["gamma"]))
        if "beta" in t:
            y = b.op("Add", y, widen(t["beta"]))
        if "mask" in t:
            ones = b.op("Cast", b.op("Equal", t["mask"], b.const(1, t["mask"])), to=to_onnx(np.int32))
            lengths = b.op("ReduceSum", ones, axes=[1], keepdims=0)
        else:
            lengths = b.op("ConstantOfShape", shape=[batch], value=np.zeros(1, np.int32))
        y = b.cast(y, dtype) if self.accumulation(dtype) != dtype else y
        return [y, output(b, lengths, node, 1), output(b, total, node, 2)]
