"""Op schemas, registered by (domain, op type, first version), as ONNX versions its operators.

Adding an op is one entry in the module of its family: a line for the elementwise ones (planner/ops/
math_ops.py), a class with `@schema("OpType")` for the others. A schema for a newer version of an op is
another one registered with `since=` its first opset. Domains: "" (ONNX's default), "memplan"
(memplan's own ops: optimizers, the training-mode Dropout). The registry is planner/ops/registry.py;
this package imports every family, so that importing it registers them all, and hands the registry on.
"""
from .base import Info, Layout, Schema, Slice
from .refused import REASONS
from .registry import SCHEMAS, check_supported, get, known, node_flops, of, register, schema

from . import (  # noqa: F401  (registration, one family per line)
    elementwise,
    arithmetic,
    math_ops,
    activation,
    composite,
    normalization,
    axis_ops,
    indexing,
    nn,
    linalg,
    shape_ops,
    views,
    resize,
    reduce,
    misc,
    optim,
    collectives,
    loss,
    control_flow,
    spatial,
    pooling,
    random,
    quantized,
    quantized_linalg,
    recurrent,
    selection,
    scatter,
    sampling,
    grid_sample,
    signal,
    attention,
    contrib,
    contrib_attention,
    detection,
    linear_attention,
    deform_conv,
    loss_grad,
    fused_attention,
    fused_norm,
    bias_activation,
    fused_conv,
    winograd,
    batched_conv,
    inverted_residual,
)

__all__ = ["SCHEMAS", "REASONS", "register", "schema", "get", "of", "known", "check_supported", "node_flops", "Info", "Layout",
           "Schema", "Slice"]
