"""Passes over the graph (one rewrite per file, each a `Pass`), and `pipeline(options)`, the passes
planner.compile runs before planning, each built with its settings: a plain list, applied top to bottom by
`run`. A pass with settings is made by a function of them (`simplify(keep)`, `winograd(config)`); one without
is a value (`prune`)."""
from .. import timing
from ..config import Config
from .base import GRADIENTS, LOSS, PRUNED, TYPED, UPDATES, Context, Pass, Property, Result, run
from .check_names import check_names
from .decompose import decompose
from .fold_batchnorm import fold_batchnorm
from .fuse_activation import fuse_activation
from .fold_transpose import fold_transpose
from .fuse_attention import fuse_attention
from .fold_repeat_kv import fold_repeat_kv
from .kv_cache import kv_cache
from .last_logits import last_logits
from .next_token import next_token
from .transpose_view import transpose_view
from .fuse_conv import fuse_conv
from .fuse_norm import fuse_norm
from .gradients import gradients
from .infer_shapes import infer_shapes
from .loss import loss
from .optimizer import optimizer
from .offload import offload
from .data_parallel import data_parallel
from .tensor_parallel import tensor_parallel
from .sequence_parallel import sequence_parallel
from .pipeline_stage import CUT, pipeline_cut, pipeline_stage
from .precision import precision_pass as precision
from .pretranspose import pretranspose
from .prune import prune
from .recomputation import recomputation
from .simplify import simplify
from .sync_batchnorm import sync_batchnorm
from .training_mode import training_mode
from .winograd import winograd
from .batch_conv import batch_conv
from .inverted_residual import inverted_residual


def loading(fetch=()):
    """The passes making the typed graph of a model as it reads (planner.load's, and compile's first);
    `fetch` names tensors that stay."""
    return [
        infer_shapes,       # concrete shapes and dtypes, constants folded
        decompose,          # composite ops replaced by their parts
        simplify(fetch),    # Identity and Casts to the same dtype dropped
        prune,              # what no output needs dropped
    ]


LOADING = loading()


def pipeline(options):
    """The passes planner.compile runs for `options` (a CompileOptions), in order: loading, the rewrites it
    turns on (of inference plans alone where the rewritten graph cannot train; of plans for no GPU alone
    where the op is the CPU's), and for `training` the step's parts. Each entry below is its condition `and`
    the pass built with its settings; a false one is a pass the options leave out."""
    config = options.config or Config.from_env()
    training, parallel = options.training, options.parallel
    inference, cpu = not training, not training and not options.device.is_gpu
    tp = parallel.tp if parallel else 1
    steps = [
        *loading(options.fetch),
        training and check_names(options.frozen, options.trainable),  # frozen and trainable name params it reads
        options.generation and (options.generation.tokens or 0) > 1 and last_logits,  # a prefill's next token alone
        inference and options.fold_batchnorm and fold_batchnorm,  # BatchNormalization into the Conv before it
        inference and options.fuse_conv and fuse_conv,  # Conv with the residual Add and activation after it, one op
        options.fuse_attention and fuse_attention(training),  # attention as one tiled op, its scores never held
        options.fuse_attention and fold_repeat_kv,  # grouped-query attention reads its kv heads, not G copies
        options.fuse_norm and fuse_norm,  # residual add + (RMS) layer norm as one chunked op
        options.fuse_activation and fuse_activation,  # an activation's pieces and its bias Add as one op
        options.fold_transpose and fold_transpose,  # MatMul of a transposed matrix as a Gemm, no transposed copy
        inference and options.pretranspose and tp == 1 and pretranspose,  # Gemm's constant B stored transposed
        # (not where tensor parallelism splits the weights by the exporters' layout)
        options.precision.low is not None and precision(options.precision),  # 16-bit floats or autocast's policy
        cpu and options.inverted_residual and inverted_residual(config),  # MobileNetV2 blocks as one op each
        cpu and options.winograd and winograd(config),  # 3x3 convolutions by Winograd, in the scratch held
        cpu and options.batch_conv and batch_conv(config),  # convolutions of small images as one GEMM
        transpose_view,  # a Transpose of size-1 axes alone as a Reshape: a view, no copy
        options.generation and options.generation.tokens and kv_cache(options.generation.tokens,
                                                                     options.generation.max_length),  # static cache
        options.generation and options.generation.tokens and next_token,  # the greedy token, read back alone
        prune,  # what no output needs dropped
        tp > 1 and tensor_parallel(tp),  # one rank's piece of the blocks' layers
    ]
    if training:
        steps += [
            training_mode,  # batch statistics, dropout masks
            parallel and parallel.sequence_parallel and sequence_parallel(parallel.tp),  # norms on 1/tp of tokens
            parallel and parallel.sync_batchnorm and sync_batchnorm(parallel.dp),  # statistics of all data ranks
            loss(options.loss or "cross_entropy", options.loss_output, options.class_axis, options.ignore_index),
            gradients(options.frozen, options.trainable, options.precision.scales_loss,
                      parallel.microbatches if parallel else 1),  # the backward pass
            optimizer(options.optimizer or "sgd", options.optimizer_args, options.update, config.inplace_update),
            parallel and (parallel.pp > 1 or parallel.microbatches > 1) and pipeline_cut(parallel),  # where to cut
            parallel and (parallel.pp > 1 or parallel.microbatches > 1) and pipeline_stage(parallel),  # 1F1B
            recomputation(options.remat, options.memory_budget, config, options.device),  # forward values recomputed in backward
            parallel and data_parallel(parallel),  # gradients reduced over the ranks, ZeRO's shards (after
                                                   # recomputation, so that a recomputed op reads ZeRO-3's gather)
            options.offload and offload(options.offload, timing.device_model(
                config.device_model, options.device, config.link_bandwidth)),  # optimizer on the host (ZeRO-Offload)
        ]
    return [step for step in steps if step]


__all__ = ["Pass", "Property", "Result", "Context", "run", "loading", "pipeline", "LOADING", "TYPED", "PRUNED",
           "LOSS", "GRADIENTS", "UPDATES", "CUT", "infer_shapes", "decompose", "simplify", "check_names", "fold_batchnorm",
           "fuse_conv", "fuse_attention", "fold_repeat_kv", "kv_cache", "transpose_view", "last_logits", "next_token", "fuse_activation", "fuse_norm", "fold_transpose", "pretranspose",
           "precision", "inverted_residual", "winograd", "batch_conv", "prune", "training_mode", "loss",
           "gradients", "optimizer", "offload", "data_parallel", "tensor_parallel", "sequence_parallel", "pipeline_cut",
           "pipeline_stage", "recomputation", "sync_batchnorm"]
