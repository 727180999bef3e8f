"""Ops that draw random values: RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike, Bernoulli,
Multinomial.

Each run draws from a fresh `xp.random.default_rng` (NumPy's PCG64 on the CPU, CuPy's XORWOW on the GPU)
straight into the output or the op's workspace. With a `seed` attribute every run of a plan draws the same
values (the seed's, as a fresh ONNX Runtime session's first run); without one each run draws others. The
schemas are `random` and have no `evaluate`: they are never folded into constants, nor recomputed by any
rematerialisation (planner/remat: mirror's need_mirror, recompute's droppable).
"""
import math

import numpy as np

from .registry import schema
from .base import Layout, Schema, elements
from .. import dtypes
from ..errors import ShapeError

DRAWN = (np.dtype(np.float32), np.dtype(np.float64))
"""The dtypes the generators draw in; other float outputs are drawn in float32 and converted."""


def generator(xp, seed):
    """A generator seeded by the float `seed` attribute (by its bits, so that 0.5 and 0.7 differ), or by
    fresh entropy from the OS when there is none."""
    return xp.random.default_rng(None if seed is None else int(np.float64(seed).view(np.uint64)))


def torch_generator(torch, seed, device):
    """PyTorch's generator for a `seed` attribute (None: its global one)."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(np.float64(seed).view(np.uint64)))


def float_dtype(dtype, what):
    """`dtype`, which must be a float one (the distributions draw real numbers)."""
    if not dtypes.is_float(dtype):
        raise ShapeError(f"{what} is {dtype}, but the op draws float16, bfloat16, float or double")
    return np.dtype(dtype)


class Distribution(Schema):
    """A float tensor drawn from a distribution: of the `shape` and `dtype` attributes (float by default),
    or, for the *Like forms, of input 0's shape and the `dtype` attribute or input 0's dtype."""

    random = True
    like = False
    inplace = ((0, 0),)

    def infer(self, node, ins):
        if self.like:
            dtype = ins[0].dtype if self.attr(node, "dtype") is None else dtypes.from_onnx(self.attr(node, "dtype"))
            return [(ins[0].shape, float_dtype(dtype, "the output dtype (dtype, else the input's)"))]
        shape = tuple(self.attr(node, "shape"))
        if min(shape, default=0) < 0:
            raise ShapeError(f"shape {shape} has a negative dimension")
        return [(shape, float_dtype(dtypes.from_onnx(self.attr(node, "dtype")), "dtype"))]

    def workspace(self, node, ins, outs, limit):
        shape, dtype = outs[0]
        return Layout() if dtype in DRAWN else Layout.pack(("draw", shape, np.float32))

    def kernel(self, xp, step, ins, outs, ws):
        y = outs[0]
        drawn = ws.get("draw", y)
        self.draw(xp, generator(xp, step.attrs["seed"]), drawn, step.attrs)
        if drawn is not y:
            xp.copyto(y, drawn, casting="unsafe")
        self.bound(xp, y, step.attrs)

    def draw(self, xp, rng, out, attrs):
        """Fill `out` (float32 or float64) with the distribution's values."""
        raise NotImplementedError

    def bound(self, xp, y, attrs):
        """Keep the values in the distribution's range after rounding to y's dtype."""

    def gradient(self, b, node, dys):
        """None: the values drawn do not depend on the input's (only on its shape)."""
        return [None] * len(node.inputs)

    def torch_draw(self, torch, y, rng, attrs):
        """`y` (a PyTorch tensor of the output's shape, dtype and device) filled with the values."""
        raise NotImplementedError

    def torch(self, torch, x, **attrs):
        dtype = x.dtype if attrs["dtype"] is None else getattr(torch, dtypes.from_onnx(attrs["dtype"]).name)
        rng = torch_generator(torch, attrs["seed"], x.device)
        return self.torch_draw(torch, torch.empty(x.shape, dtype=dtype, device=x.device), rng, attrs)


class Normal(Distribution):
    """Normal values of mean `mean` and standard deviation `scale`."""

    def draw(self, xp, rng, out, attrs):
        rng.standard_normal(size=out.shape, dtype=out.dtype, out=out)
        xp.multiply(out, attrs["scale"], out=out)
        xp.add(out, attrs["mean"], out=out)

    def torch_draw(self, torch, y, rng, attrs):
        return y.normal_(attrs["mean"], attrs["scale"], generator=rng)


class Uniform(Distribution):
    """Uniform values in [low, high)."""

    def infer(self, node, ins):
        low, high = self.attr(node, "low"), self.attr(node, "high")
        if not low <= high:
            raise ShapeError(f"low {low} must not be above high {high}")
        return super().infer(node, ins)

    def draw(self, xp, rng, out, attrs):
        rng.random(size=out.shape, dtype=out.dtype, out=out)
        xp.multiply(out, attrs["high"] - attrs["low"], out=out)
        xp.add(out, attrs["low"], out=out)

    def bound(self, xp, y, attrs):
        """low + (high - low) u rounds up to high for some u < 1: those become the largest value below."""
        high = y.dtype.type(attrs["high"])
        xp.minimum(y, np.nextafter(high, y.dtype.type(attrs["low"])), out=y)

    def torch_draw(self, torch, y, rng, attrs):
        return y.uniform_(attrs["low"], attrs["high"], generator=rng)


@schema("RandomNormal")
class RandomNormal(Normal):
    inplace = ()
    defaults = {"dtype": 1, "mean": 0.0, "scale": 1.0, "seed": None}
    torch = None  # no input tells PyTorch the device


@schema("RandomNormalLike")
class RandomNormalLike(Normal):
    like = True
    ranks = "same"
    defaults = {"dtype": None, "mean": 0.0, "scale": 1.0, "seed": None}


@schema("RandomUniform")
class RandomUniform(Uniform):
    inplace = ()
    defaults = {"dtype": 1, "high": 1.0, "low": 0.0, "seed": None}
    torch = None  # no input tells PyTorch the device


@schema("RandomUniformLike")
class RandomUniformLike(Uniform):
    like = True
    ranks = "same"
    defaults = {"dtype": None, "high": 1.0, "low": 0.0, "seed": None}


@schema("Bernoulli")
class Bernoulli(Schema):
    """Bernoulli: 1 with probability p (input 0, each element its own), else 0, in the `dtype` attribute
    (default: p's), drawn as u < p for u uniform in [0, 1), so that p = 0 and p = 1 are exact."""

    random = True
    ranks = "same"
    defaults = {"dtype": None, "seed": None}
    inplace = ((0, 0),)

    def infer(self, node, ins):
        dtype = ins[0].dtype if self.attr(node, "dtype") is None else dtypes.from_onnx(self.attr(node, "dtype"))
        if not (dtypes.is_float(dtype) or dtype.kind in "biu"):
            raise ShapeError(f"dtype {dtype} is not a number or bool type")
        return [(ins[0].shape, dtype)]

    def workspace(self, node, ins, outs, limit):
        shape, dtype = outs[0]
        return Layout.pack(("draw", shape, np.float64 if ins[0].dtype == np.float64 else np.float32),
                           None if dtype == np.bool_ else ("hit", shape, np.bool_))

    def kernel(self, xp, step, ins, outs, ws):
        y, u = outs[0], ws["draw"]
        generator(xp, step.attrs["seed"]).random(size=u.shape, dtype=u.dtype, out=u)
        hit = ws.get("hit", y)
        xp.less(u, ins[0], out=hit)
        if hit is not y:
            xp.copyto(y, hit)

    def gradient(self, b, node, dys):
        """None: each draw is constant in p almost everywhere (PyTorch's bernoulli gives zeros too)."""
        return [None]

    def torch(self, torch, p, dtype, seed):
        out = p.dtype if dtype is None else getattr(torch, dtypes.from_onnx(dtype).name)
        return torch.bernoulli(p, generator=torch_generator(torch, seed, p.device)).to(out)


def gather(xp, flat, index, out):
    """out = flat[index] for indices known in range: NumPy's take would buffer `out` to check them,
    CuPy's checks none."""
    if xp is np:
        np.take(flat, index, out=out, mode="clip")
    else:
        xp.take(flat, index, out=out)


@schema("Multinomial")
class Multinomial(Schema):
    """Multinomial: for each row of input 0 (batch, classes), unnormalised log-probabilities, `sample_size`
    class indices drawn independently with those probabilities, as int32 (`dtype` 6) or int64 (7).

    Each row's cumulative probabilities are computed in float64 in the workspace, and each draw u (uniform
    up to the row's total) is located among them by a binary search run on all draws at once, log2(classes)
    gathers, so that large vocabularies cost no (batch, samples, classes) comparison."""

    random = True
    defaults = {"dtype": 6, "sample_size": 1, "seed": None}

    def infer(self, node, ins):
        if ins[0].rank != 2 or ins[0].shape[1] < 1:
            raise ShapeError(f"input has shape {ins[0].shape}, Multinomial needs (batch, classes) with classes >= 1")
        dtype, size = dtypes.from_onnx(self.attr(node, "dtype")), self.attr(node, "sample_size")
        if dtype not in (np.int32, np.int64):
            raise ShapeError(f"dtype {dtype} must be int32 or int64")
        if size < 0:
            raise ShapeError(f"sample_size {size} must not be negative")
        return [((ins[0].shape[0], size), dtype)]

    def workspace(self, node, ins, outs, limit):
        batch, classes = ins[0].shape
        draws = outs[0][0]
        return Layout.pack(("cdf", (batch, classes), np.float64), ("top", (batch, 1), np.float64),
                           ("u", draws, np.float64), ("value", draws, np.float64), ("hit", draws, np.bool_),
                           ("pos", draws, np.int64), ("step", draws, np.int64))

    def flops(self, node, ins, outs):
        """Exponentials and their running sums, then a comparison per step of each search."""
        batch, classes = ins[0].shape
        return 4 * batch * classes + 2 * elements(outs) * max(math.ceil(math.log2(classes)), 1)

    def kernel(self, xp, step, ins, outs, ws):
        y, (batch, classes) = outs[0], ins[0].shape
        if not y.size:
            return
        cdf, top, u, value, hit, pos, probe = (ws[k] for k in ("cdf", "top", "u", "value", "hit", "pos", "step"))
        xp.copyto(cdf, ins[0])
        xp.max(cdf, axis=1, keepdims=True, out=top)
        xp.subtract(cdf, top, out=cdf)
        xp.exp(cdf, out=cdf)
        xp.cumsum(cdf, axis=1, out=cdf)
        generator(xp, step.attrs["seed"]).random(size=u.shape, dtype=u.dtype, out=u)
        xp.multiply(u, cdf[:, -1:], out=u)
        for row in range(batch):
            pos[row].fill(row * classes)
        # pos + the class drawn = how many of the row's first classes - 1 cumulative sums are <= u
        flat, n = cdf.reshape(-1), classes - 1
        while n > 1:
            half = n // 2
            xp.add(pos, half, out=probe)
            gather(xp, flat, probe, value)
            xp.less_equal(value, u, out=hit)
            xp.multiply(hit, half, out=probe)
            xp.add(pos, probe, out=pos)
            n -= half
        if n:
            gather(xp, flat, pos, value)
            xp.less_equal(value, u, out=hit)
            xp.add(pos, hit, out=pos)
        xp.remainder(pos, classes, out=pos)
        xp.copyto(y, pos, casting="unsafe")

    def gradient(self, b, node, dys):
        """None: class indices carry no gradient."""
        return [None]

    def torch(self, torch, x, dtype, sample_size, seed):
        probs = torch.softmax(x.double(), 1)
        drawn = torch.multinomial(probs, sample_size, replacement=True,
                                  generator=torch_generator(torch, seed, x.device))
        return drawn.to(getattr(torch, dtypes.from_onnx(dtype).name))
