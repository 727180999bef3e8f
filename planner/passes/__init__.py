"""Passes over the graph (one rewrite per file, each a `Pass`), and the named pipelines planner.compile
runs before planning: plain lists, applied top to bottom by `run`."""
from .base import GRADIENTS, LOSS, PRUNED, TYPED, UPDATES, Context, Pass, Result, run
from .check_names import check_names
from .decompose import decompose
from .fold_batchnorm import fold_batchnorm
from .fuse_activation import fuse_activation
from .fold_transpose import fold_transpose
from .fuse_attention import fuse_attention
from .fuse_conv import fuse_conv
from .fuse_norm import fuse_norm
from .gradients import gradients
from .infer_shapes import infer_shapes
from .loss import loss
from .optimizer import optimizer
from .data_parallel import data_parallel
from .tensor_parallel import tensor_parallel
from .pipeline_stage import pipeline_stage
from .precision import precision_pass as precision
from .pretranspose import pretranspose
from .prune import prune
from .recomputation import recomputation
from .simplify import simplify
from .training_mode import training_mode
from .winograd import winograd
from .batch_conv import batch_conv
from .inverted_residual import inverted_residual

LOADING = [
    infer_shapes,       # concrete shapes and dtypes, constants folded
    decompose,          # composite ops replaced by their parts
    simplify,           # Identity and Casts to the same dtype dropped
    prune,              # what no output needs dropped
]
REWRITES = [
    fold_batchnorm,     # inference BatchNormalization folded into the Conv before it
    fuse_conv,          # inference Conv with the residual Add and activation after it, one pass over Y
    fuse_attention,     # attention as one tiled op, its scores never held
    fuse_norm,          # residual add + (RMS) layer norm as one chunked op, its gradient keeping X alone
    fuse_activation,    # an activation's pieces and its bias Add as one op, backward keeping X alone
    fold_transpose,     # MatMul of a transposed matrix as a Gemm, no transposed copy
    pretranspose,       # inference Gemm's constant B stored transposed, once
    precision,          # 16-bit floats, or autocast's policy, with the casts they need
    inverted_residual,  # inference MobileNetV2 blocks as one op, their widened tensors never in the arena
    winograd,           # inference 3x3 convolutions by Winograd's F(2x2) or F(4x4, 3x3), in the scratch the plan holds
    batch_conv,         # inference convolutions of small images as one GEMM over the batch
    prune,              # what no output needs dropped
]
INFERENCE = [*LOADING, *REWRITES]
TRAINING = [
    *LOADING,
    check_names,        # frozen and trainable name params the model reads
    *REWRITES,
    tensor_parallel,    # one rank's piece of each transformer block's linear layers and heads (Megatron)
    training_mode,      # batch statistics, dropout masks
    loss,               # the scalar "loss", the labels input
    gradients,          # the backward pass
    optimizer,          # the param updates
    pipeline_stage,     # one pipeline stage's nodes, its microbatches in 1F1B order, sends and receives
    recomputation,      # forward values recomputed in backward instead of kept
    data_parallel,      # one rank's step: gradients reduced over the ranks, ZeRO's shards (after recomputation,
                        # so that a recomputed op reads ZeRO-3's backward gather)
]

__all__ = ["Pass", "Result", "Context", "run", "LOADING", "REWRITES", "INFERENCE", "TRAINING", "TYPED", "PRUNED", "LOSS",
           "GRADIENTS", "UPDATES", "infer_shapes", "decompose", "simplify", "check_names", "fold_batchnorm", "fuse_conv", "fuse_attention",
           "fuse_activation", "fuse_norm", "fold_transpose", "pretranspose", "precision", "inverted_residual", "winograd", "batch_conv", "prune", "training_mode", "loss", "gradients",
           "optimizer", "data_parallel", "tensor_parallel", "pipeline_stage",
           "recomputation"]
