"""The op functions (conv2d, dense, batch_norm, pooling, reshape, ...): each builds its ONNX nodes
through op(), with PyTorch-like arguments turned into ONNX attributes."""
import keyword
import math
import re

import numpy as np

from planner import dtypes, ops

from .graph import check, const, op, promote

__all__ = ["conv2d", "conv2d_transpose", "dense", "batch_norm", "layer_norm", "identity", "leaky_relu",
           "gelu", "clip", "softmax", "log_softmax", "pooling", "concat", "split", "reshape", "flatten",
           "transpose", "slice", "squeeze", "unsqueeze", "expand", "pad", "resize", "gather", "where", "cast",
           "matmul", "reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "dropout"]


def _pair(v):
    return [int(v)] * 2 if isinstance(v, (int, np.integer)) else list(v)


def _pads(pad):
    """ONNX pads (begins then ends) from an int, (ph, pw) or (top, left, bottom, right)."""
    pad = _pair(pad)
    return pad * 2 if len(pad) == 2 else pad


def _parts(name, meta):
    """Keywords for the inner nodes of a composite op: named NAME/PART when the op is named."""
    return lambda part: {"name": name and f"{name}/{part}", "meta": meta}


def conv2d(x, weight, bias=None, stride=1, pad=0, dilation=1, groups=1, **kw):
    """2-D convolution (Conv); weight (out, in/groups, kh, kw); pad an int, (ph, pw) or 4 values."""
    return op("Conv", x, weight, bias, strides=_pair(stride), pads=_pads(pad), dilations=_pair(dilation),
              group=groups, **kw)


def conv2d_transpose(x, weight, bias=None, stride=1, pad=0, output_padding=0, dilation=1, groups=1, **kw):
    """2-D transposed convolution (ConvTranspose); weight (in, out/groups, kh, kw)."""
    return op("ConvTranspose", x, weight, bias, strides=_pair(stride), pads=_pads(pad),
              output_padding=_pair(output_padding), dilations=_pair(dilation), group=groups, **kw)


def dense(x, weight, bias=None, name=None, meta=None):
    """Fully connected with weight (out, in): Gemm(transB=1) for 2-D x, else MatMul(x, weight^T) (+ bias)."""
    if check(x, "dense").ndim == 2:
        return op("Gemm", x, weight, bias, transB=1, name=name, meta=meta)
    part = _parts(name, meta)
    y = op("MatMul", x, transpose(weight, (1, 0), **part("weight_t")),
           **(part("matmul") if bias is not None else {"name": name, "meta": meta}))
    return y if bias is None else op("Add", y, bias, name=name, meta=meta)


def batch_norm(x, gamma, beta, mean, var, eps=1e-5, momentum=0.9, training=False, **kw):
    """BatchNormalization; training=True returns (y, running_mean, running_var)."""
    return op("BatchNormalization", x, gamma, beta, mean, var, epsilon=eps, momentum=momentum,
              training_mode=1 if training else None, num_outputs=3 if training else 1, **kw)


def layer_norm(x, gamma, beta=None, axis=-1, eps=1e-5, **kw):
    """LayerNormalization over the dims from `axis` on."""
    return op("LayerNormalization", x, gamma, beta, axis=axis, epsilon=eps, **kw)


def _unary(op_type):
    def f(x, **kw):
        return op(op_type, x, **kw)
    f.__name__ = f.__qualname__ = _snake(op_type)
    f.__doc__ = f"Elementwise {op_type}; keywords are its ONNX attributes, name= and meta=."
    return f


def _snake(op_type):
    """The Python name of an op type: "HardSwish" -> "hard_swish", "IsNaN" -> "is_nan", "Not" ->
    "logical_not" (a keyword of Python's)."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op_type.replace("NaN", "Nan")).lower()
    return f"logical_{name}" if keyword.iskeyword(name) else name


UNARY = {_snake(s.op): _unary(s.op) for (domain, _), versions in ops.SCHEMAS.items() for _, s in versions[-1:]
         if not domain and s.arity == 1}
"""A one-argument function per unary elementwise op of the default domain (relu, sin, is_nan, softsign, ...)."""
globals().update(UNARY)
__all__ += sorted(set(UNARY) - set(__all__))
identity = _unary("Identity")


def leaky_relu(x, alpha=0.01, **kw):
    return op("LeakyRelu", x, alpha=alpha, **kw)


def gelu(x, name=None, meta=None):
    """Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), from Mul, Erf and Add (ONNX has Gelu from opset 20)."""
    part = _parts(name, meta)
    x = check(x, "gelu")
    scaled = op("Mul", x, promote(math.sqrt(0.5), x), **part("scale"))
    cdf = op("Add", op("Erf", scaled, **part("erf")), promote(1, x), **part("add"))
    return op("Mul", op("Mul", x, cdf, **part("mul")), promote(0.5, x), name=name, meta=meta)


def clip(x, min=None, max=None, **kw):
    """Clip to [min, max]; either bound may be left out."""
    return op("Clip", x, min=min, max=max, **kw)


def softmax(x, axis=-1, **kw):
    return op("Softmax", x, axis=axis, **kw)


def log_softmax(x, axis=-1, **kw):
    return op("LogSoftmax", x, axis=axis, **kw)


def pooling(x, kind="max", kernel=None, stride=1, pad=0, **kw):
    """Pooling: kind "max" or "avg" with `kernel` (int or pair), or "global_avg"/"global_max"."""
    if kind in ("global_avg", "global_max"):
        return op("GlobalAveragePool" if kind == "global_avg" else "GlobalMaxPool", x, **kw)
    if kind not in ("max", "avg"):
        raise ValueError(f"pooling: kind must be 'max', 'avg', 'global_avg' or 'global_max', not {kind!r}")
    if kernel is None:
        raise TypeError(f"pooling: kind {kind!r} needs a kernel")
    return op("MaxPool" if kind == "max" else "AveragePool", x, kernel_shape=_pair(kernel),
              strides=_pair(stride), pads=_pads(pad), **kw)


def concat(*xs, axis=1, **kw):
    return op("Concat", *xs, axis=axis, **kw)


def split(x, sections, axis=0, **kw):
    """Split into `sections` equal parts (an int) or parts of the given sizes (a list); a tuple of Symbols."""
    sizes = None if isinstance(sections, (int, np.integer)) else list(sections)
    outs = op("Split", x, axis=axis, split=sizes, num_outputs=int(sections) if sizes is None else len(sizes),
              **kw)
    return outs if isinstance(outs, tuple) else (outs,)


def reshape(x, shape, **kw):
    """Reshape to `shape` (0 copies the input's dim, -1 is inferred)."""
    return op("Reshape", x, shape=list(shape), **kw)


def flatten(x, axis=1, **kw):
    return op("Flatten", x, axis=axis, **kw)


def transpose(x, perm=None, **kw):
    return op("Transpose", x, perm=perm, **kw)


def slice(x, starts, ends, axes=None, steps=None, **kw):
    return op("Slice", x, starts=list(starts), ends=list(ends), axes=axes and list(axes),
              steps=steps and list(steps), **kw)


def squeeze(x, axes=None, **kw):
    return op("Squeeze", x, axes=axes and list(axes), **kw)


def unsqueeze(x, axes, **kw):
    return op("Unsqueeze", x, axes=list(axes), **kw)


def expand(x, shape, **kw):
    """Broadcast to `shape` (a static shape)."""
    return op("Expand", x, const(np.array(shape, np.int64)), **kw)


def pad(x, pads, mode="constant", value=0.0, **kw):
    """Pad with ONNX `pads` (all begins, then all ends); `value` fills in "constant" mode."""
    return op("Pad", x, pads=list(pads), mode=mode, constant_value=value if mode == "constant" else None, **kw)


def resize(x, scales=None, sizes=None, mode="nearest", **kw):
    """Resize by per-dim `scales` or to `sizes`."""
    return op("Resize", x, scales=scales and list(scales), sizes=sizes and list(sizes), mode=mode, **kw)


def gather(x, indices, axis=0, **kw):
    return op("Gather", x, indices, axis=axis, **kw)


def where(cond, x, y, **kw):
    """x where cond, else y; a scalar x or y becomes a constant of the other's dtype."""
    return op("Where", cond, promote(x, y), promote(y, x), **kw)


def cast(x, dtype, **kw):
    return op("Cast", x, to=dtypes.to_onnx(dtype), **kw)


def matmul(a, b, **kw):
    return op("MatMul", a, b, **kw)


def _reduce(op_type):
    def f(x, axes=None, keepdims=True, **kw):
        return op(op_type, x, axes=axes and list(axes), keepdims=keepdims, **kw)
    f.__name__ = f.__qualname__ = "reduce_" + op_type[len("Reduce"):].lower()
    f.__doc__ = f"{op_type} over `axes` (all when None)."
    return f


reduce_mean, reduce_sum, reduce_max, reduce_min = map(_reduce, ("ReduceMean", "ReduceSum", "ReduceMax",
                                                                  "ReduceMin"))


def dropout(x, ratio=0.5, training=False, mask=False, **kw):
    """Dropout; mask=True returns (y, mask)."""
    return op("Dropout", x, ratio=ratio, training_mode=True if training else None,
              num_outputs=2 if mask else 1, **kw)
