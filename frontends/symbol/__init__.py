"""Native symbolic API in the spirit of MXNet Symbol: write a model in Python, then plan it
(`planner.load(symbol, shapes)`) or export it (`symbol.to_onnx()`).

    x = var("data", ("batch", 3, 32, 32))
    w = param("conv0_weight", np.random.randn(8, 3, 3, 3).astype(np.float32))
    y = softmax(flatten(relu(conv2d(x, w, pad=1))))
    graph, model = y.to_graph(), y.to_onnx()

Each op function builds ONNX nodes in canonical form, as planner.shapes leaves them whatever
the opset: static arguments (Reshape's shape, Slice's starts, Clip's min, ...) are plain-Python
attributes, sequences are lists, bools are ints and floats are rounded to float32, as ONNX
stores them. Every op function also takes `name=` (default: op type and a counter, given when
a graph is built) and `meta=`. Symbols know their dtype (and rank where it is cheap), so
Python scalars promote to constants of the other operand's dtype.

Annotations (`meta={...}` or `with annotate(...)`, keys planner.ir.HINTS) become strings (True ->
"1", False -> "0", anything else str(value)) and then Node.notes; ONNX keeps them as node
metadata_props "memplan.KEY", so they read back unchanged.
"""
from . import layers
from .graph import IR_VERSION, MIN_EXPORT_OPSET, Symbol, annotate, const, group, op, param, var
from .layers import *  # noqa: F403 (the op functions, as layers.__all__ lists them)

__all__ = ["Symbol", "var", "param", "const", "group", "annotate", "op", "MIN_EXPORT_OPSET", "IR_VERSION",
           *layers.__all__]
