"""ONNX element types <-> NumPy dtypes."""
import numpy as np
from onnx import TensorProto, helper

from .errors import ModelError


def from_onnx(elem_type):
    """NumPy dtype of an ONNX element type (TensorProto.FLOAT -> float32)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"unsupported tensor element type {TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type}") from None


def to_onnx(dtype):
    """ONNX element type of a NumPy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def is_float(dtype):
    """True for the floating-point dtypes (bfloat16 included), the ones that carry gradients."""
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"
