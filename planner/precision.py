"""The precisions a plan computes in, and PyTorch autocast's policy for the mixed ones.

"fp32" plans the model as it is. "fp16" and "bf16" plan every float tensor and parameter in that type,
with casts at the graph's float inputs and outputs (fed and returned in their own types). "amp-fp16"
and "amp-bf16" follow torch.autocast: the ops autocast lists compute in the low type (their float inputs
cast down once, each cast shared by every reader), those it lists in float32, and every other op in
the widest float type of its inputs; parameters stay float32 (the master weights the optimizer
updates), so their low copies are planned tensors made once per step.

Each op says where autocast computes it (`Schema.autocast`), as autocast's lists say (PyTorch 2.x,
torch/csrc/autograd/autocast_mode.cpp, the CUDA "lower_precision_fp" and "fp32" lists) written in ONNX's
op types: conv*, matmul, mm, bmm, addmm, linear, prelu, scaled_dot_product_attention and the RNN cells
"low"; softmax, log_softmax, layer_norm, group_norm, norm, exp, log, pow, sum, prod, cumsum, cumprod, the
losses and the reciprocal family "float32"; memplan's fused ops as the ops they fuse.

What each precision means (its low type, whether it is mixed, whether it scales the loss) is
planner.options.Precision's.
"""
from . import ops
from .options import Precision

PRECISIONS = tuple(p.value for p in Precision)
WHERE = ("low", "float32", "input")
"""What `Schema.autocast` may say besides None: the low type, float32, or the type of the op's data input
whatever the type of its weights (cuDNN's batch norm takes half inputs with float32 statistics, and autocast
leaves it alone)."""


def computes_in(node, opsets=None):
    """Where autocast computes `node`, as its schema says at the graph's `opsets`: one of WHERE, or None (the
    widest float type of its inputs)."""
    return ops.of(node, opsets).autocast
