"""Views: ops whose output is input 0's bytes under another shape (Reshape, Flatten, Squeeze, Unsqueeze,
Identity); the planner gives the output no bytes of its own."""
import math

from .registry import schema
from .base import Schema, axis
from ..errors import ShapeError


def reshaped(shape, target, allowzero=0):
    """ONNX Reshape's target shape with its 0 (copy) and -1 (infer) entries resolved."""
    target = list(target)
    if not allowzero:
        target = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    size = math.prod(shape)
    if target.count(-1) > 1:
        raise ShapeError(f"target shape {tuple(target)} has more than one -1")
    if -1 in target:
        rest = math.prod(d for d in target if d != -1)
        if rest == 0 or size % rest:
            raise ShapeError(f"cannot reshape {tuple(shape)} to {tuple(target)}")
        target[target.index(-1)] = size // rest
    if math.prod(target) != size:
        raise ShapeError(f"cannot reshape {tuple(shape)} ({size} elements) to {tuple(target)}")
    return tuple(int(d) for d in target)


class View(Schema):
    """Ops whose output is input 0's bytes under another shape: Reshape, Flatten, Squeeze, Unsqueeze, Identity."""

    split = "view"
    identity = True

    def view_shape(self, node, shape):
        raise NotImplementedError

    def infer(self, node, ins):
        return [(self.view_shape(node, ins[0].shape), ins[0].dtype)]

    def evaluate(self, node, x):
        return [x.reshape(self.view_shape(node, x.shape))]

    def gradient(self, b, node, dys):
        return [b.op("Reshape", dys[0], shape=list(b.shape(node.inputs[0])))]

    def torch_node(self, torch, run, node, ins):
        return ins[0].reshape(run.shape(node.outputs[0]))


@schema("Reshape")
class Reshape(View):
    attr_inputs = (("shape", 1, 5),)
    defaults = {"allowzero": 0}

    def view_shape(self, node, shape):
        return reshaped(shape, self.attr(node, "shape"), self.attr(node, "allowzero"))


@schema("Flatten")
class Flatten(View):
    """Flatten: a 2-D view, the dims before `axis` in rows and the rest in columns."""

    defaults = {"axis": 1}
    def view_shape(self, node, shape):
        a = self.attr(node, "axis")
        if not -len(shape) <= a <= len(shape):
            raise ShapeError(f"axis {a} is out of range for rank {len(shape)}")
        a += len(shape) if a < 0 else 0
        return math.prod(shape[:a]), math.prod(shape[a:])


@schema("Squeeze")
class Squeeze(View):
    attr_inputs = (("axes", 1, 13),)
    defaults = {"axes": None}
    def view_shape(self, node, shape):
        axes = self.attr(node, "axes")
        if axes is None:
            return tuple(d for d in shape if d != 1)
        axes = {axis(a, len(shape)) for a in axes}
        if any(shape[a] != 1 for a in axes):
            raise ShapeError(f"cannot squeeze axes {sorted(axes)} of shape {shape}: not all have size 1")
        return tuple(d for k, d in enumerate(shape) if k not in axes)


@schema("Unsqueeze")
class Unsqueeze(View):
    attr_inputs = (("axes", 1, 13),)
    def view_shape(self, node, shape):
        given = self.attr(node, "axes")
        rank = len(shape) + len(given)
        axes = {axis(a, rank) for a in given}
        if len(axes) < len(given):
            raise ShapeError(f"axes {tuple(given)} repeat an axis")
        rest = iter(shape)
        return tuple(1 if k in axes else next(rest) for k in range(rank))


@schema("Identity")
class Identity(View):
    ranks = "same"
    def view_shape(self, node, shape):
        return shape
