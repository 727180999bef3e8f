"""The precisions a plan computes in, and PyTorch autocast's policy for the mixed ones.

"fp32" plans the model as it is. "fp16" and "bf16" plan every float tensor and parameter in that type,
with casts at the graph's float inputs and outputs (fed and returned in their own types). "amp-fp16"
and "amp-bf16" follow torch.autocast: the ops of LOWER compute in the low type (their float inputs
cast down once, each cast shared by every reader), the ops of FP32 in float32, and every other op in
the widest float type of its inputs; parameters stay float32 (the master weights the optimizer
updates), so their low copies are planned tensors made once per step.

The lists are autocast's (PyTorch 2.x, torch/csrc/autograd/autocast_mode.cpp, the CUDA "lower_precision_fp"
and "fp32" lists) written in ONNX's op types: conv*, matmul, mm, bmm, addmm, linear, prelu,
scaled_dot_product_attention and the RNN cells below; softmax, log_softmax, layer_norm, group_norm,
norm, exp, log, pow, sum, prod, cumsum, cumprod, the losses and the reciprocal family in float32.
memplan.BiasActivation (an activation and the bias Add before it) is in LOWER: autocast adds a Linear's
bias in the low type (addmm) and runs Gelu, SiLU, ReLU on the low result as they come, so that the
op's X and Y stay 16-bit (within the op, tiles compute in float32).

What each precision means (its low type, whether it is mixed, whether it scales the loss) is
planner.options.Precision's.
"""
from .options import Precision

PRECISIONS = tuple(p.value for p in Precision)

LOWER = frozenset({
    "Conv", "ConvTranspose", "ConvInteger", "DeformConv", "MatMul", "Gemm", "Einsum", "PRelu",
    "Attention", "LSTM", "GRU", "RNN", "ScaledDotProductAttention", "BiasActivation", "FusedConv",
})
"""Op types autocast runs in the low type (ScaledDotProductAttention and BiasActivation: memplan's fused
attention and activation; FusedConv: a Conv with the Add and activation after it, as autocast runs them)."""

FP32 = frozenset({
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization",
    "RMSNormalization", "LpNormalization", "MeanVarianceNormalization", "ReduceL1", "ReduceL2", "ReduceSum",
    "ReduceSumSquare", "ReduceProd", "ReduceLogSum", "ReduceLogSumExp", "Exp", "Log", "Pow", "Reciprocal",
    "Sqrt", "Acos", "Asin", "Cosh", "Sinh", "Tan", "Softplus", "CumSum", "CumProd",
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss",
    "AddLayerNormalization",  # memplan's residual add + layer norm, in float32 as layer_norm
})
"""Op types autocast runs in float32."""

KEEPS_INPUT = frozenset({"BatchNormalization"})
"""Op types that compute in their data input's type whatever the type of their weights (cuDNN's batch
norm takes half inputs with float32 statistics, and autocast leaves it alone)."""

