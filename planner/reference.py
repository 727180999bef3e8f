"""Values of ops memplan has no schema for, computed by ONNX's reference evaluator when every input is a
constant, so that a model whose mask building folds away (CumSum of a constant, NonZero of a known mask)
is never refused for an op that does not remain in the plan."""
import numpy as np
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator


def evaluate(node, values, opsets):
    """The outputs of `node` (one per output name, None for an omitted one) from the input `values`
    (None for an omitted input), or None where the reference cannot compute the op."""
    names = [f"in{k}" if name else "" for k, name in enumerate(node.inputs)]
    outs = [f"out{k}" if name else "" for k, name in enumerate(node.outputs)]
    try:
        proto = helper.make_node(node.op, names, outs, domain=node.domain, **_attributes(node.attrs))
        graph = helper.make_graph([proto], "fold", [], [helper.make_empty_tensor_value_info(o) for o in outs if o],
                                  [numpy_helper.from_array(np.asarray(v), n) for n, v in zip(names, values) if n])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()
                                                        if d != "memplan"])
        with np.errstate(all="ignore"):
            got = iter(ReferenceEvaluator(model).run(None, {}))
    except Exception:  # noqa: BLE001  (any failure of the reference means: not foldable here)
        return None
    return [next(got) if o else None for o in outs]


def _attributes(attrs):
    """IR attributes as onnx.helper takes them: arrays as TensorProtos; subgraphs are not folded."""
    out = {}
    for name, value in attrs.items():
        if isinstance(value, np.ndarray):
            value = numpy_helper.from_array(value)
        elif not isinstance(value, (int, float, str, bytes, list, tuple)):
            raise TypeError(f"attribute {name!r} ({type(value).__name__}) is not foldable")
        out[name] = value
    return out

