"""Ops that move or reinterpret data without arithmetic: Shape, Reshape, Transpose, Concat, Slice, ..."""
import numpy as np

from . import schema
from .base import Schema
from ..errors import ShapeError


@schema("Shape")
class Shape(Schema):
    defaults = {"start": 0, "end": None}

    def infer(self, node, ins):
        return [((len(self._dims(node, ins[0].shape)),), np.int64)]

    def fold(self, node, ins):
        return [np.array(self._dims(node, ins[0].shape), dtype=np.int64)]

    def _dims(self, node, shape):
        end = self.attr(node, "end")
        return shape[self.attr(node, "start"):len(shape) if end is None else end]


def reshaped(shape, target, allowzero=0):
    """ONNX Reshape's target shape with its 0 (copy) and -1 (infer) entries resolved."""
    target = list(target)
    if not allowzero:
        target = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    size = int(np.prod(shape, dtype=np.int64))
    if target.count(-1) > 1:
        raise ShapeError(f"target shape {tuple(target)} has more than one -1")
    if -1 in target:
        rest = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if rest == 0 or size % rest:
            raise ShapeError(f"cannot reshape {tuple(shape)} to {tuple(target)}")
        target[target.index(-1)] = size // rest
    if int(np.prod(target, dtype=np.int64)) != size:
        raise ShapeError(f"cannot reshape {tuple(shape)} ({size} elements) to {tuple(target)}")
    return tuple(int(d) for d in target)


@schema("Reshape")
class Reshape(Schema):
    attr_inputs = (("shape", 1, 5),)
    defaults = {"allowzero": 0}
    identity = True

    def infer(self, node, ins):
        return [(reshaped(ins[0].shape, self.attr(node, "shape"), self.attr(node, "allowzero")), ins[0].dtype)]

    def evaluate(self, node, x):
        return [x.reshape(reshaped(x.shape, self.attr(node, "shape"), self.attr(node, "allowzero")))]
