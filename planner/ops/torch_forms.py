"""What the op entries' PyTorch forms (`Schema.torch`, run by executor.torch_ops) share: torch's dtype of
a NumPy dtype, and the error for a form of an op that PyTorch cannot run. `torch` is passed in, as the
forms take it: the planner imports no PyTorch."""
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
