"""What the ops' PyTorch forms (`Schema.torch` and `Schema.torch_node`, run by executor.torch_module) share:
torch's dtype of a NumPy dtype, ONNX's pads as F.pad's, and the error for a form of an op that PyTorch cannot
run. `torch` is passed in, as the forms take it: the planner imports no PyTorch."""
import numpy as np

from ..errors import UnsupportedOpError


def torch_dtype(torch, dtype):
    """The torch dtype of a NumPy dtype."""
    return torch.from_numpy(np.empty(0, dtype)).dtype


def unsupported(*op_types):
    """The UnsupportedOpError for op types (or forms of them, "Pad with mode edge") to_torch cannot run."""
    error = UnsupportedOpError(list(op_types))
    error.args = (f"to_torch: {error}",)
    return error


def torch_pads(begin, end):
    """ONNX begin and end pads as F.pad's list (last dim first)."""
    return [p for b, e in zip(reversed(begin), reversed(end)) for p in (b, e)]
