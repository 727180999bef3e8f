"""Fold an inference BatchNormalization into the convolution before it: y = (conv(x, W) + b - mean) * s
+ beta with s = scale / sqrt(var + epsilon) is conv(x, W * s) + (b - mean) * s + beta, one step and one
pass over the output fewer, as onnxruntime and TensorRT fold it. Only in inference plans (training
normalises by batch statistics), only where W, b and the statistics are constants of float32 or float64
and the convolution's output is read by the BatchNormalization alone. Where a statistic, scale / sqrt(var +
epsilon) in the statistics' dtype (as the unfolded op computes it) or the folded bias is not finite (epsilon 0
and a variance 0, a variance below 0: the unfolded op's infinities and NaNs, which folded weights would spread
otherwise), the BatchNormalization stays as it is: a check of C values. The folded weights are new
tensors (`<W>/folded_bn`), so Executor.set_parameters of the old names is refused, never silently
ignored. CompileOptions(fold_batchnorm=False) keeps the graph as it is."""
import numpy as np

from ..deferred import Absent, computed
from ..ir import Node, Tensor
from .base import rewrite_pass
from .pattern import Op, constant, rewrite

FOLDABLE = (np.float32, np.float64)


def _patterns():
    for conv in (Op("Conv", "x", "w", name="conv"), Op("Conv", "x", "w", "b", name="conv")):
        yield Op("BatchNormalization", conv, "scale", "beta", "mean", "var", name="bn")


class _Folder:
    def __init__(self, graph):
        self.graph, self.fresh, self.count = graph, {}, 0

    def build(self, m):
        bn, conv = m.named["bn"], m.named["conv"]
        if bn.attrs.get("training_mode", 0) or any(bn.outputs[1:]):
            return None
        w = constant(self.graph, m.bindings["w"], absent=True)
        if w is None or w.dtype.type not in FOLDABLE:
            return None
        b = constant(self.graph, m.bindings["b"], absent=True) if "b" in m.bindings else np.zeros(w.shape[:1], w.dtype)
        values = [constant(self.graph, m.bindings[k], absent=True) for k in ("scale", "beta", "mean", "var")]
        if b is None or any(v is None for v in values):
            return None
        absent = next((v for v in (b, *values) if isinstance(v, Absent)), None)
        if absent is not None:  # a weightless model, planned as its finite weights would be
            s, shift = Absent(absent.name, w.shape[:1], np.float64), Absent(absent.name, w.shape[:1], w.dtype)
        else:
            s, shift = _factors(b, values, bn.attrs.get("epsilon", 1e-5), w.dtype)
            if s is None:
                return None
        weight = self.new(f"{m.bindings['w']}/folded_bn", computed(_scaled, w.shape, w.dtype, w, s))
        bias = self.new(f"{m.bindings['w']}/folded_bn_bias", shift)
        self.count += 1
        return [Node("Conv", (m.bindings["x"], weight, bias), bn.outputs[:1], conv.attrs, conv.name, conv.notes)]

    def new(self, name, value):
        self.fresh[name] = Tensor(name, value.shape, value.dtype, "const", value)
        return name


def _factors(b, values, epsilon, dtype):
    """(each output channel's scale, the folded bias) of BatchNormalization's (scale, beta, mean, var) after a
    Conv of bias `b`; (None, None) where a statistic or a result is not finite, which folding would change."""
    with np.errstate(all="ignore"):
        factor = values[0] / np.sqrt(values[3] + values[3].dtype.type(epsilon))  # as the unfolded op has it
        scale, beta, mean, var = (np.asarray(v, np.float64) for v in values)
        s = scale / np.sqrt(var + epsilon)
        shift = ((b - mean) * s + beta).astype(dtype)
    if not all(np.isfinite(v).all() for v in (b, *values, factor, shift)):
        return None, None
    return s, shift


def _scaled(w, s):
    """W with each output channel's filter times s."""
    return w * s.reshape(-1, *[1] * (w.ndim - 1)).astype(w.dtype)


def folded(graph):
    """(graph with each foldable Conv + BatchNormalization one Conv, how many were folded)."""
    folder = _Folder(graph)
    for pattern in _patterns():
        folder.graph = graph
        graph, _ = rewrite(graph, pattern, folder.build, folder.fresh)
    return graph, folder.count


fold_batchnorm = rewrite_pass("fold_batchnorm", folded, "Conv + BatchNormalization that folds")
