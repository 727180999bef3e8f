"""memplan.BiasActivation, Y = act(X + bias), and its gradient memplan.BiasActivationGrad: an activation and
the bias Add before it as one op (planner/passes/fuse_activation.py makes them from the exported pieces),
so that training keeps X alone for backward, where the pieces keep several tensors of X's size.

Both work tile by tile through a small scratch (two slices forward, three backward; about as much as the
one chunk of activation.py's Gelu), in the accumulation dtype (float32 for 16-bit inputs, in tiles of half
as many elements, so that a 16-bit plan's scratch is half a float32 plan's), and may write over X."""
import math

from .registry import schema
from .activation import CHUNK, gelu, normal_cdf, sigmoid
from .base import FLOATS, Layout, Schema, elements
from ..dtypes import is_float
from ..errors import ShapeError

TILE = CHUNK
"""Elements of each scratch slice for float32 inputs, as the activations' chunk: smaller tiles cost more in
NumPy's per-call overhead than in arithmetic (BERT's Gelu at 4,096 elements a tile took twice as long)."""
C, K = math.sqrt(2 / math.pi), 0.044715
"""The tanh Gelu's constants: tanh(C (x + K x^3))."""


def _swish(xp, z, t, u, alpha):
    xp.multiply(z, alpha, out=t)
    sigmoid(xp, t, out=t)
    xp.multiply(z, t, out=z)


def _gelu_slope(xp, z, t, u, approximate):
    """Exact: Phi(z) + z phi(z). Tanh, with t = tanh(C (z + K z^3)): (1 + t + z (1 - t^2) C (1 + 3 K z^2)) / 2
    (the formulas of planner/ops/activation.py's Gelu gradient)."""
    if approximate != "tanh":
        normal_cdf(xp, z, t, u)
        xp.multiply(z, z, out=u)
        xp.multiply(u, -0.5, out=u)
        xp.exp(u, out=u)
        xp.multiply(u, 1 / math.sqrt(2 * math.pi), out=u)
        xp.multiply(u, z, out=u)
        xp.add(t, u, out=z)
        return
    xp.multiply(z, z, out=u)
    xp.multiply(u, K * C, out=t)
    xp.add(t, C, out=t)
    xp.multiply(t, z, out=t)
    xp.tanh(t, out=t)
    xp.multiply(u, 3 * K * C, out=u)
    xp.add(u, C, out=u)
    xp.multiply(u, z, out=u)
    xp.multiply(t, t, out=z)
    xp.subtract(1, z, out=z)
    xp.multiply(z, u, out=z)
    xp.add(z, t, out=z)
    xp.add(z, 1, out=z)
    xp.multiply(z, 0.5, out=z)


def _swish_slope(xp, z, t, u, alpha):
    """s (1 + alpha z (1 - s)) with s = sigmoid(alpha z)."""
    xp.multiply(z, alpha, out=t)
    sigmoid(xp, t, out=t)
    xp.subtract(1, t, out=u)
    xp.multiply(u, z, out=u)
    xp.multiply(u, alpha, out=u)
    xp.add(u, 1, out=u)
    xp.multiply(t, u, out=z)


def _sigmoid_slope(xp, z, t, u):
    sigmoid(xp, z, out=z)
    xp.subtract(1, z, out=t)
    xp.multiply(z, t, out=z)


def _tanh_slope(xp, z, t, u):
    xp.tanh(z, out=z)
    xp.multiply(z, z, out=z)
    xp.subtract(1, z, out=z)


ACTIVATIONS = {  # name: (forward, derivative, flops per element), each computing in place on z with scratch t, u
    "Relu": (lambda xp, z, t, u: xp.maximum(z, 0, out=z), lambda xp, z, t, u: xp.heaviside(z, 0, out=z), 1),
    "Sigmoid": (lambda xp, z, t, u: sigmoid(xp, z, out=z), _sigmoid_slope, 4),
    "Tanh": (lambda xp, z, t, u: xp.tanh(z, out=z), _tanh_slope, 4),
    "Gelu": (lambda xp, z, t, u, approximate: gelu(xp, z, t, z, approximate, u), _gelu_slope, 10),
    "Swish": (_swish, _swish_slope, 6),
}
"""The activations BiasActivation computes, by their ONNX op names: Gelu (`approximate` "none" or "tanh")
and Swish (`alpha`: 1 is SiLU, 1.702 QuickGelu) take attributes, the others none."""
TAKES = {"Gelu": ("approximate",), "Swish": ("alpha",)}


def _check(node, attr, x, bias):
    """ShapeError for an activation memplan does not fuse, a bad attribute, a bias that is not X's trailing
    dims (leading 1s aside) or not of X's dtype, or an X that is not a float."""
    name = attr(node, "activation")
    if name not in ACTIVATIONS:
        raise ShapeError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    if attr(node, "approximate") not in ("none", "tanh"):
        raise ShapeError(f"approximate must be 'none' or 'tanh', got {attr(node, 'approximate')!r}")
    alpha = attr(node, "alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise ShapeError(f"alpha must be a finite float, got {alpha!r}")
    if not is_float(x.dtype):
        raise ShapeError(f"X must be a float tensor, got {x.dtype}")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise ShapeError(f"bias must have X's dtype {x.dtype}, got {bias.dtype}")
        if not fits(x.shape, bias.shape):
            raise ShapeError(f"bias of shape {tuple(bias.shape)} must be X's trailing dims {tuple(x.shape)} "
                             "(leading 1s aside)")


def fits(shape, bias_shape):
    """Whether a bias of `bias_shape` is the trailing dims of `shape`, leading 1s aside."""
    trailing = _trailing(bias_shape)
    return len(bias_shape) <= len(shape) and tuple(shape[len(shape) - len(trailing):]) == trailing


def _trailing(shape):
    """`shape` without its leading 1s."""
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def _grid(shape, bias_shape, tile):
    """(rows, row length, tile rows, tile columns): X as rows of the bias's length (one row without a
    bias), cut into tiles of at most `tile` elements."""
    size = math.prod(shape)
    inner = math.prod(_trailing(bias_shape)) if bias_shape is not None else size
    rows = size // inner if inner else 0
    width = max(1, min(inner, tile))
    return rows, inner, max(1, min(rows, tile // width)), width


def _layout(x, bias, accumulate, names):
    """Scratch slices of one tile, by `names`, in the accumulation dtype: TILE elements of X's width (at most
    X's), of a 16-bit X half that, so that a 16-bit plan's scratch takes half a float32 plan's bytes."""
    tile = max(1, min(math.prod(x.shape), TILE) * x.dtype.itemsize // accumulate.itemsize)
    rows, _, h, w = _grid(x.shape, None if bias is None else bias.shape, tile)
    if not rows:
        return Layout()
    return Layout.pack(*[(name, (h * w,), accumulate) for name in names])


def _tiles(xp, arrays, bias, ws):
    """For each tile: the tile of each X-shaped array (as rows of the bias's length), then the scratch z
    holding X + bias of the tile (arrays[0] is X), then t and u (None where the workspace has no u)."""
    x = arrays[0]
    rows, inner, h, w = _grid(x.shape, None if bias is None else bias.shape, ws["z"].size if ws else 1)
    flat = [a.reshape(rows, inner) for a in arrays]
    b = None if bias is None else bias.reshape(-1)
    for r0 in range(0, rows, h):
        for c0 in range(0, inner, w):
            r1, c1 = min(r0 + h, rows), min(c0 + w, inner)
            n = (r1 - r0) * (c1 - c0)
            z, t, u = (ws[name][:n].reshape(r1 - r0, c1 - c0) if name in ws else None for name in ("z", "t", "u"))
            parts = [a[r0:r1, c0:c1] for a in flat]
            xp.copyto(z, parts[0])
            if b is not None:
                xp.add(z, b if b.size == 1 else b[c0:c1], out=z)
            yield parts, z, t, u


def _options(step, derivative=False):
    """(the activation's function, its attributes)."""
    name = step.attrs["activation"]
    return ACTIVATIONS[name][1 if derivative else 0], {k: step.attrs[k] for k in TAKES.get(name, ())}


DEFAULTS = {"activation": "Gelu", "approximate": "none", "alpha": 1.0}


def _torch(torch, x, bias=None, activation="Gelu", approximate="none", alpha=1.0):
    """The op in PyTorch."""
    z = x if bias is None else x + bias
    f = torch.nn.functional
    return {"Relu": f.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh,
            "Gelu": lambda v: f.gelu(v, approximate=approximate),
            "Swish": lambda v: v * torch.sigmoid(alpha * v)}[activation](z)


@schema("BiasActivation", domain="memplan")
class BiasActivation(Schema):
    """Y = activation(X + bias): inputs X and an optional bias of X's trailing dims; attributes `activation`
    (Relu, Sigmoid, Tanh, Gelu, Swish), `approximate` (Gelu's) and `alpha` (Swish's)."""

    stat = "fused_activation"
    split = "elementwise"
    autocast = "low"  # a Linear's bias added in the low type (addmm), the activation on the low result
    defaults = DEFAULTS
    types = (("T", "T"), {"T": FLOATS})
    inplace = ((0, 0),)

    def infer(self, node, ins):
        x, bias = (list(ins) + [None])[:2]
        _check(node, self.attr, x, bias)
        return [(x.shape, x.dtype)]

    def workspace(self, node, ins, outs, limit):
        """z (X + bias) and t; u too for the exact Gelu (planner.ops.activation.normal_cdf's spare)."""
        exact = self.attr(node, "activation") == "Gelu" and self.attr(node, "approximate") == "none"
        return _layout(ins[0], (list(ins) + [None])[1], self.accumulation(ins[0].dtype), ("z", "t", "u")[:2 + exact])

    def flops(self, node, ins, outs):
        """The activation's operations per element, and one more for the bias."""
        bias = (list(ins) + [None])[1]
        return (ACTIVATIONS[self.attr(node, "activation")][2] + (bias is not None)) * elements(outs)

    def kernel(self, xp, step, ins, outs, ws):
        x, bias = (list(ins) + [None])[:2]
        fn, attrs = _options(step)
        for (_, y), z, t, u in _tiles(xp, [x, outs[0]], bias, ws):
            fn(xp, z, t, u, **attrs)
            xp.copyto(y, z)

    def gradient(self, b, node, dys):
        """dX from memplan.BiasActivationGrad, which recomputes X + bias; the bias's, dX summed down to it."""
        x, bias = (list(node.inputs) + [""])[:2]
        dx = b.op("BiasActivationGrad", dys[0], x, bias, domain="memplan", **self.normalize(node))
        return [dx, b.unbroadcast(dx, b.shape(x), b.shape(bias)) if bias else None][:len(node.inputs)]

    def torch(self, torch, x, bias=None, **attrs):
        return _torch(torch, x, bias, **attrs)


@schema("BiasActivationGrad", domain="memplan")
class BiasActivationGrad(Schema):
    """dX = dY activation'(X + bias): inputs dY, X and the optional bias, attributes as BiasActivation's."""

    defaults = DEFAULTS
    types = (("T", "T", "T"), {"T": FLOATS})
    inplace = ((0, 0), (1, 0))
    mirror = False

    def infer(self, node, ins):
        dy, x, bias = (list(ins) + [None])[:3]
        _check(node, self.attr, x, bias)
        if tuple(dy.shape) != tuple(x.shape) or dy.dtype != x.dtype:
            raise ShapeError(f"dY {tuple(dy.shape)} {dy.dtype} must have X's shape and dtype {tuple(x.shape)} {x.dtype}")
        return [(x.shape, x.dtype)]

    def workspace(self, node, ins, outs, limit):
        return _layout(ins[1], (list(ins) + [None])[2], self.accumulation(ins[1].dtype), ("z", "t", "u"))

    def flops(self, node, ins, outs):
        """The derivative's operations per element (about twice the activation's), the bias and dY's product."""
        bias = (list(ins) + [None])[2]
        return (2 * ACTIVATIONS[self.attr(node, "activation")][2] + 1 + (bias is not None)) * elements(outs)

    def kernel(self, xp, step, ins, outs, ws):
        dy, x, bias = (list(ins) + [None])[:3]
        fn, attrs = _options(step, derivative=True)
        for (_, dyt, dx), z, t, u in _tiles(xp, [x, dy, outs[0]], bias, ws):
            fn(xp, z, t, u, **attrs)
            xp.multiply(z, dyt, out=z)
            xp.copyto(dx, z)

    def torch(self, torch, dy, x, bias=None, **attrs):
        """PyTorch's own gradient of the forward's form."""
        with torch.enable_grad():
            v = x.detach().requires_grad_()
            return torch.autograd.grad(_torch(torch, v, bias, **attrs), v, dy)[0]
