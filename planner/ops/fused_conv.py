"""com.microsoft FusedConv, as ONNX Runtime's optimizer writes it and as memplan's fuse_conv pass makes it:
Y = activation(Conv(X, W, B) + Z), with Z an optional input of Y's shape (a residual added before the
activation). The kernel applies the bias, Z and the activation to each chunk of the convolution's output
as its GEMM writes it, while it is in cache, instead of a pass over Y each. Inference only: it has no
gradient (the pass does not run in training)."""
from .registry import schema
from .base import elements
from .nn import Conv
from ..errors import ShapeError

ACTIVATIONS = {"Relu": 0, "Sigmoid": 0, "Tanh": 0, "Clip": 2, "HardSigmoid": 2}
"""The activations the kernel applies in place, by name, with how many activation_params they take
(Clip: min, max; HardSigmoid: alpha, beta)."""


def check_activation(activation, params):
    """Raise a ShapeError unless `activation` ("" for none) is one of ACTIVATIONS with its count of `params`."""
    if activation and activation not in ACTIVATIONS:
        raise ShapeError(f"activation {activation!r} is not one memplan applies in place; it takes "
                         f"{', '.join(ACTIVATIONS)}")
    if activation and len(params or ()) != ACTIVATIONS[activation]:
        raise ShapeError(f"{activation} takes {ACTIVATIONS[activation]} activation_params, got {len(params or ())}")


@schema("FusedConv", domain="com.microsoft")
class FusedConv(Conv):
    """Conv's inputs and attributes, and Z (optional, Y's shape); attributes `activation` and
    `activation_params`."""

    torch_node = None  # PyTorch has no fused form of it
    stat = "fused_conv"
    defaults = {**Conv.defaults, "activation": "", "activation_params": None}
    gradient = None  # not Conv's: training a model holding one is refused by name

    def infer(self, node, ins):
        (y_shape, dtype), = super().infer(node, ins[:3])
        z = ins[3] if len(ins) > 3 else None
        if z is not None and (tuple(z.shape) != tuple(y_shape) or z.dtype != dtype):
            raise ShapeError(f"Z {tuple(z.shape)} {z.dtype} must have the output's shape and dtype {y_shape} {dtype}")
        check_activation(self.attr(node, "activation"), self.attr(node, "activation_params"))
        return [(y_shape, dtype)]

    def flops(self, node, ins, outs):
        """Conv's, and one per output element for Z and one for the activation."""
        extra = (len(ins) > 3 and ins[3] is not None) + bool(self.attr(node, "activation"))
        return super().flops(node, ins[:3], outs) + extra * elements(outs)
