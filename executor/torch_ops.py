"""PyTorch forms of memplan's ops for executor.torch_module: `OPS[op_type](module, node, ins)` returns the
node's output tensor, or a list of them, computed with torch and torch.nn.functional from its input
tensors (None for an omitted one), its attributes (with the schema's ONNX defaults) and, through the
module, the planned output shapes and whether it runs in training mode."""
import math

import numpy as np
import torch
from torch.nn import functional as F

from planner import ops
from planner.ops.nn import window
from planner.ops.torch_forms import torch_dtype, unsupported

OPS = {}


def op(*op_types):
    """Register fn(module, node, ins) for each op type."""
    def register(fn):
        for op_type in op_types:
            OPS[op_type] = fn
        return fn
    return register


def attr(node, name):
    """An attribute of the node, or its ONNX default from the op's schema."""
    return ops.of(node).attr(node, name)


# --- elementwise: their PyTorch forms are in their op entries (planner/ops/elementwise.py) ---

def form(op_type, domain="", version=None):
    """fn(module, node, ins) computing an op in PyTorch: registered here, or the `torch` form of its op
    entry at `version` (None: the newest); None when memplan has neither."""
    if not domain and op_type in OPS:
        return OPS[op_type]
    schema = ops.get(op_type, domain, version) if ops.known(op_type, domain) else None
    if schema is None or schema.torch is None:
        return None
    return lambda m, node, ins: schema.torch(torch, *ins, **schema.arguments(node))


@op("Identity")
def identity(m, node, ins):
    return ins[0]


@op("Softmax", "LogSoftmax")
def softmax(m, node, ins):
    return (F.softmax if node.op == "Softmax" else F.log_softmax)(ins[0], attr(node, "axis"))


@op("Cast")
def cast(m, node, ins):
    return ins[0].to(torch_dtype(torch, m.graph.tensors[node.outputs[0]].dtype))


@op("Dropout")
def dropout(m, node, ins):
    """Y and the mask of kept values: at random in training, all kept in inference."""
    x, ratio = ins[0], attr(node, "ratio")
    if not m.training_mode(node) or ratio == 0:
        return [x, torch.ones_like(x, dtype=torch.bool)]
    keep = torch.rand_like(x) >= ratio
    return [x * keep / (1 - ratio), keep]


@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(m, node, ins):
    """The loss, then the log-probabilities."""
    scores, labels, weights = [*ins, None][:3]
    ignore, log_prob = attr(node, "ignore_index"), F.log_softmax(scores, 1)
    return [F.nll_loss(log_prob, labels.long(), weights, ignore_index=-100 if ignore is None else ignore,
                       reduction=attr(node, "reduction")), log_prob]


# --- matrix products and reductions ---

@op("Gemm")
def gemm(m, node, ins):
    """alpha A' B' + beta C."""
    a, b, c = [*ins, None][:3]
    a, b = a.T if attr(node, "transA") else a, b.T if attr(node, "transB") else b
    if c is None:
        return attr(node, "alpha") * (a @ b)
    return torch.addmm(c, a, b, beta=attr(node, "beta"), alpha=attr(node, "alpha"))


@op("MatMul")
def matmul(m, node, ins):
    return torch.matmul(*ins)


@op("Einsum")
def einsum(m, node, ins):
    return torch.einsum(attr(node, "equation"), *ins)


def _prod(x, dim, keepdim):
    """torch.prod over several dims, one at a time from the last."""
    for d in sorted(dim, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


REDUCERS = {"ReduceSum": torch.sum, "ReduceMean": torch.mean, "ReduceMax": torch.amax, "ReduceMin": torch.amin,
            "ReduceProd": _prod}


@op(*REDUCERS)
def reduce(m, node, ins):
    axes = ops.of(node).reduced_axes(node, ins[0].ndim)
    if axes is None:
        return ins[0]
    if node.op in ("ReduceMax", "ReduceMin") and not ins[0].numel():
        raise unsupported(f"{node.op} with an empty input")
    return REDUCERS[node.op](ins[0], dim=axes, keepdim=bool(attr(node, "keepdims")))


# --- convolutions, pooling, normalisation ---

CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _torch_pads(begin, end):
    """ONNX begin and end pads as F.pad's list (last dim first)."""
    return [p for b, e in zip(reversed(begin), reversed(end)) for p in (b, e)]


@op("Conv")
def conv(m, node, ins):
    """F.conv*d, asymmetric padding applied beforehand."""
    x, w, b = [*ins, None][:3]
    win = window(ops.of(node), node, x.shape[2:], w.shape[2:], m.shape(node.outputs[0])[2:])
    padding = win.begin
    if win.begin != win.end:
        x, padding = F.pad(x, _torch_pads(win.begin, win.end)), 0
    return CONV[x.ndim - 2](x, w, b, win.strides, padding, win.dilations, attr(node, "group"))


@op("ConvTranspose")
def conv_transpose(m, node, ins):
    """F.conv_transpose*d unpadded, then cut (or zero-extended, for output_padding) to the planned output."""
    x, w, b = [*ins, None][:3]
    out = m.shape(node.outputs[0])[2:]
    win = window(ops.of(node), node, x.shape[2:], w.shape[2:], out, transposed=True)
    y = CONV_TRANSPOSE[x.ndim - 2](x, w, None, win.strides, 0, 0, attr(node, "group"), win.dilations)
    extra = [max(0, bg + o - n) for bg, o, n in zip(win.begin, out, y.shape[2:])]
    y = F.pad(y, _torch_pads([0] * len(out), extra))
    y = y[(slice(None), slice(None), *(slice(bg, bg + o) for bg, o in zip(win.begin, out)))]
    return y if b is None else y + b.reshape(-1, *[1] * len(out))


@op("MaxPool", "AveragePool")
def pool(m, node, ins):
    """F.max_pool*d / F.avg_pool*d; asymmetric or wide padding of a max pool applied beforehand as -inf."""
    x, y = ins[0], m.shape(node.outputs[0])
    kernel = attr(node, "kernel_shape")
    win = window(ops.of(node), node, x.shape[2:], kernel, y[2:])
    padding = win.begin
    native = win.begin == win.end and all(2 * p <= k for p, k in zip(win.begin, kernel))
    if node.op == "AveragePool":
        return _average_pool(node, x, y, kernel, win, native)
    if len(node.outputs) > 1 and node.outputs[1]:
        raise unsupported(f"{node.op} with Indices")
    if not native:
        x, padding = F.pad(x, _torch_pads(win.begin, win.end), value=-math.inf), 0
    out = getattr(F, f"max_pool{x.ndim - 2}d")(x, kernel, win.strides, padding, win.dilations,
                                                bool(attr(node, "ceil_mode")))
    return out[(slice(None), slice(None), *(slice(0, n) for n in y[2:]))]


def _average_pool(node, x, y, kernel, win, native):
    """F.avg_pool*d; with padding it cannot take, the padded input's window means over those of a mask of
    the values the count includes (the divisors cancel), cut to the planned output."""
    if set(win.dilations) != {1}:
        raise unsupported(f"{node.op} with dilations")
    fn = getattr(F, f"avg_pool{x.ndim - 2}d")
    ceil, include = bool(attr(node, "ceil_mode")), bool(attr(node, "count_include_pad"))
    if native:
        return fn(x, kernel, win.strides, win.begin, ceil, include)
    pads = _torch_pads(win.begin, win.end)
    mask = F.pad(torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device), pads, value=float(include))
    out = fn(F.pad(x, pads), kernel, win.strides, 0, ceil) / fn(mask, kernel, win.strides, 0, ceil)
    return out[(slice(None), slice(None), *(slice(0, n) for n in y[2:]))]


@op("GlobalAveragePool", "GlobalMaxPool")
def global_pool(m, node, ins):
    dims = tuple(range(2, ins[0].ndim))
    return ins[0].mean(dims, keepdim=True) if node.op == "GlobalAveragePool" else ins[0].amax(dims, keepdim=True)


@op("BatchNormalization")
def batch_norm(m, node, ins):
    """Y, and in training the updated running mean and variance (written back into the module's buffers
    when they are ones) and the batch's mean and variance."""
    x, scale, bias, mean, var = ins
    eps = attr(node, "epsilon")
    if not m.training_mode(node):
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, eps)
    dims = [0, *range(2, x.ndim)]
    with torch.no_grad():
        batch_mean, batch_var = x.mean(dims), x.var(dims, unbiased=False)
        momentum = attr(node, "momentum")
        new_mean, new_var = mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)
        buffers = m.graph_buffers()
        for name, new in zip(node.inputs[3:5], (new_mean, new_var)):
            if name in buffers:
                buffers[name].copy_(new)
    return [F.batch_norm(x, None, None, scale, bias, True, 0.0, eps), new_mean, new_var, batch_mean, batch_var]


@op("LayerNormalization")
def layer_norm(m, node, ins):
    """Y over the dims from `axis` on, and the Mean and InvStdDev outputs."""
    x, scale, bias = [*ins, None][:3]
    a = attr(node, "axis") % x.ndim
    normalised = x.shape[a:]
    bias = None if bias is None else bias.expand(normalised)
    y = F.layer_norm(x, normalised, scale.expand(normalised), bias, attr(node, "epsilon"))
    if len(node.outputs) == 1:
        return y
    dims = tuple(range(a, x.ndim))
    return [y, x.mean(dims, keepdim=True), torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + attr(node, "epsilon"))]


# --- data movement ---

@op("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def view(m, node, ins):
    return ins[0].reshape(m.shape(node.outputs[0]))


@op("Expand")
def expand(m, node, ins):
    return ins[0].expand(m.shape(node.outputs[0]))


@op("Transpose")
def transpose(m, node, ins):
    return ins[0].permute(ops.get("Transpose").permutation(node, ins[0].ndim))


@op("Concat")
def concat(m, node, ins):
    return torch.cat(ins, attr(node, "axis"))


@op("Split")
def split(m, node, ins):
    a = attr(node, "axis") % ins[0].ndim
    return torch.split(ins[0], ops.get("Split").split_sizes(node, ins[0].shape[a]), a)


@op("Slice")
def slice_(m, node, ins):
    """Positive steps as a Python index; negative ones (which torch refuses) by index_select."""
    x, index = ins[0], ops.get("Slice").slices(node, ins[0].shape)
    x = x[tuple(s if (s.step or 1) > 0 else slice(None) for s in index)]
    for a, s in enumerate(index):
        if (s.step or 1) < 0:
            x = x.index_select(a, torch.arange(*s.indices(x.shape[a]), device=x.device))
    return x


def _wrapped(idx, dim):
    """Indices in [0, dim) from ONNX's [-dim, dim)."""
    return torch.where(idx < 0, idx + dim, idx)


@op("Gather")
def gather(m, node, ins):
    data, idx = ins
    a = attr(node, "axis") % data.ndim
    picked = data.index_select(a, _wrapped(idx, data.shape[a]).reshape(-1))
    return picked.reshape(data.shape[:a] + idx.shape + data.shape[a + 1:])


@op("GatherElements")
def gather_elements(m, node, ins):
    data, idx = ins
    a = attr(node, "axis") % data.ndim
    return torch.gather(data, a, _wrapped(idx, data.shape[a]))


@op("Tile")
def tile(m, node, ins):
    return ins[0].repeat(attr(node, "repeats"))


@op("Trilu")
def trilu(m, node, ins):
    return (torch.triu if attr(node, "upper") else torch.tril)(ins[0], attr(node, "k"))


@op("Pad")
def pad(m, node, ins):
    if attr(node, "mode") != "constant":
        raise unsupported(f"{node.op} with mode {attr(node, 'mode')}")
    pads = ops.get("Pad").pad_widths(node, ins[0].ndim)
    return F.pad(ins[0], _torch_pads(*zip(*pads)), value=float(np.asarray(attr(node, "constant_value")).reshape(-1)[0]))


COORDINATES = {"half_pixel": False, "pytorch_half_pixel": False, "align_corners": True}
RESIZE = {("nearest", "asymmetric", "floor"): "nearest", ("nearest", "half_pixel", "round_prefer_ceil"): "nearest-exact",
          **{(mode, c, None): mode for mode in ("linear", "cubic") for c in COORDINATES}}
INTERPOLATE = {("linear", 3): "linear", ("linear", 4): "bilinear", ("linear", 5): "trilinear", ("cubic", 4): "bicubic"}


@op("Resize")
def resize(m, node, ins):
    """F.interpolate over the spatial dims, in the modes and coordinate mappings it shares with ONNX: by the
    given scales (which set the mapping even where the output size rounds), else to the output size."""
    x, out = ins[0], m.shape(node.outputs[0])
    mode, name = attr(node, "mode"), _interpolation(node, x.shape, out)
    options = {} if mode == "nearest" else {"align_corners": COORDINATES[attr(node, "coordinate_transformation_mode")]}
    if attr(node, "scales"):
        scales = ops.get("Resize").scales(node, x.shape)[2:]
        return F.interpolate(x, scale_factor=scales, mode=name, recompute_scale_factor=False, **options)
    return F.interpolate(x, out[2:], mode=name, **options)


def _interpolation(node, shape, out):
    """F.interpolate's mode for the Resize node, or UnsupportedOpError naming the form it has none for."""
    mode, coordinates = attr(node, "mode"), attr(node, "coordinate_transformation_mode")
    key = (mode, coordinates, attr(node, "nearest_mode") if mode == "nearest" else None)
    name = RESIZE.get(key) if mode == "nearest" else INTERPOLATE.get((RESIZE.get(key), len(shape)))
    if name is None or out[:2] != shape[:2] or attr(node, "keep_aspect_ratio_policy") != "stretch" \
            or attr(node, "antialias") or coordinates == "align_corners" and attr(node, "scales") \
            or mode == "cubic" and (attr(node, "cubic_coeff_a") != -0.75 or attr(node, "exclude_outside")) \
            or coordinates == "pytorch_half_pixel" and min(out[2:]) == 1:
        raise unsupported(f"{node.op} with mode {mode}, {coordinates} coordinates on {tuple(shape)} -> {tuple(out)}")
    return name
