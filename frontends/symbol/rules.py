"""What op() needs to know about an ONNX op: attributes in canonical form, the dtype of an input holding
a static argument, and the dtype and rank of each output, from the op's schema (`result`, `ranks`)
where it says and from the attributes of the ops whose rank they set."""
import numpy as np
import onnx

from planner import dtypes, ops

from ..onnx_frontend import MAX_OPSET

_LATER_OUT = {"TopK": np.int64, "MaxPool": np.int64, "Dropout": np.bool_}
"""Dtype of outputs after the first, where it is not the first output's."""
_STATIC_TYPES = (("tensor(int64)", np.int64), ("tensor(float)", np.float32), ("tensor(bool)", np.bool_))
"""Preferred dtypes of an input holding a static argument, when ONNX allows several."""


def latest_schema(op_type):
    """ONNX's schema of `op_type` at the newest opset, or None for an op ONNX does not define."""
    try:
        return onnx.defs.get_schema(op_type, MAX_OPSET)
    except onnx.defs.SchemaError:
        return None


def static_dtype(op_type, index, like):
    """Dtype of the ONNX input at `index` holding a static argument: the data's, or int64/float32/bool."""
    s = latest_schema(op_type)
    if s is None:
        return like
    formal = s.inputs[min(index, len(s.inputs) - 1)]
    if index and formal.type_str == s.inputs[0].type_str:
        return like
    allowed = next((c.allowed_type_strs for c in s.type_constraints if c.type_param_str == formal.type_str),
                   [formal.type_str])
    return next((np.dtype(d) for t, d in _STATIC_TYPES if t in allowed), like)


def canon(key, value):
    """An attribute as the ONNX frontend reads it back."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return [canon(key, v) for v in value]
    if isinstance(value, (bool, int, np.bool_, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(np.float32(value))
    if isinstance(value, str):
        return value
    raise TypeError(f"attribute {key}: {value!r} is not a number, str, list of them or NumPy array")


def output_dtypes(op_type, ins, attrs, n):
    """The dtypes of the `n` outputs: fixed by the op, by an attribute (to, dtype, value), or the inputs'."""
    like = next((x.dtype for x in ins if x is not None), np.dtype(np.float32))
    if ops.get(op_type).result is not None:
        first = ops.get(op_type).result
    elif op_type == "Cast":
        first = dtypes.from_onnx(attrs["to"])
    elif op_type in ("Where", "CastLike"):
        first = ins[1].dtype
    elif "dtype" in attrs:
        first = dtypes.from_onnx(attrs["dtype"])
    elif op_type == "ConstantOfShape":
        first = attrs.get("value", np.zeros(1, np.float32)).dtype
    else:
        first = like
    return (np.dtype(first),) + (np.dtype(_LATER_OUT.get(op_type, first)),) * (n - 1)


def output_ranks(op_type, ins, attrs, n):
    """Output ranks where one rule tells them (None: unknown); used to pick Gemm in `dense`."""
    r = [None if x is None else x.ndim for x in ins]
    r0 = r[0] if r else None
    axes = len(attrs["axes"]) if isinstance(attrs.get("axes"), list) else None
    rank, rule = None, ops.get(op_type).ranks
    if rule == "broadcast" and None not in r:
        rank = max(r)
    elif op_type in ("Gemm", "Flatten"):
        rank = 2
    elif op_type == "Reshape" and "shape" in attrs:
        rank = len(attrs["shape"])
    elif op_type == "MatMul" and None not in r and min(r) >= 2:
        rank = max(r)
    elif r0 is not None and axes is not None and op_type == "Unsqueeze":
        rank = r0 + axes
    elif r0 is not None and axes is not None and (op_type == "Squeeze" or (
            op_type.startswith("Reduce") and not attrs.get("keepdims", 1))):
        rank = r0 - axes
    elif rule == "same" or (op_type.startswith("Reduce") and attrs.get("keepdims", 1)):
        rank = r0
    return (rank,) * n if op_type in ("Split", "TopK") else (rank,) + (None,) * (n - 1)
