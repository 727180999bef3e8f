"""Optimizer steps as ops (memplan's own, outside ONNX): one node per parameter reads the parameter,
its gradient and its state, and writes the new parameter and state, which the plan places in the
old ones' bytes (Graph.updates). PyTorch's update rules (torch.optim.SGD and Adam), so that a model
trains here as it does there; ONNX's preview-training Adam places epsilon differently."""
from .registry import schema
from .base import FLOATS, Schema, same_as_input
from ..errors import ShapeError


class _Optimizer(Schema):
    """Inputs: the scalar hyperparameter tensors `scalars` name, then X, G and the state; outputs:
    the new X and the new state, in the input order."""

    scalars = ()
    types = (("S", "T"), {"S": FLOATS, "T": FLOATS})

    def infer(self, node, ins):
        for name, info in zip(self.scalars, ins):
            if info.shape != ():
                raise ShapeError(f"{name} must be a scalar, got shape {info.shape}")
        x, *rest = ins[len(self.scalars):]
        for info in rest:
            if info.shape != x.shape or info.dtype != x.dtype:
                raise ShapeError(f"gradient and state must match the parameter's {x.shape} {x.dtype}, "
                                 f"got {info.shape} {info.dtype}")
        return [(x.shape, x.dtype)] * (len(ins) - len(self.scalars) - 1)


@schema("SGD", domain="memplan")
class SGD(_Optimizer):
    """torch.optim.SGD without dampening: g = G + weight_decay X; with momentum V = momentum V + g
    (V starts at zero, so the first V is g) and g = V, or g + momentum V with nesterov; X -= lr g.
    Inputs (lr, X, G) or (lr, X, G, V) with momentum; outputs X or (X, V)."""

    scalars = ("lr",)
    defaults = {"momentum": 0.0, "weight_decay": 0.0, "nesterov": 0}


@schema("Adam", domain="memplan")
class Adam(_Optimizer):
    """torch.optim.Adam (AdamW with `decoupled`): g = G + weight_decay X (or X *= 1 - lr weight_decay
    when decoupled); M = b1 M + (1 - b1) g; V = b2 V + (1 - b2) g^2;
    X -= lr / (1 - b1^t) M / (sqrt(V / (1 - b2^t)) + eps), t the 1-based step count.
    Inputs (lr, t, X, G, M, V); outputs (X, M, V)."""

    scalars = ("lr", "step")
    types = (("S", "S", "T"), {"S": FLOATS, "T": FLOATS})
    defaults = {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "weight_decay": 0.0, "decoupled": 0}


@schema("Assign", domain="memplan")
class Assign(Schema):
    """Y = X, a copy: the new value of a param computed out of place (MEGENGINE_INPLACE_UPDATE=0),
    written over the param at the end of the step."""

    types = (("T",), {"T": FLOATS})
    infer = staticmethod(same_as_input)

