"""Small ONNX graphs built by hand for planner tests: rows of float32 vectors, so that a tensor of
width w holds 4*w bytes per row."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, params=()):
    """An opset-17 model; `inputs`/`outputs` map names to widths, `params` names to arrays."""
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, w]) for n, w in inputs.items()]
    vo = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    inits = [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in dict(params).items()]
    graph = helper.make_graph(nodes, "test", vi, vo, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def node(op, inputs, outputs, **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=outputs[0], **attrs)


def random_dag(draw_int, n_nodes):
    """A random DAG of Relu, Add, Concat and MatMul nodes over rows of varying width.

    `draw_int(lo, hi)` supplies the randomness (hypothesis' `st.integers` via `data.draw`, or a
    NumPy Generator); every tensor nothing reads becomes a graph output.
    """
    widths = {"x": 64 * draw_int(1, 8)}
    nodes, params, read = [], {}, set()
    for k in range(n_nodes):
        names = list(widths)
        a = names[draw_int(0, len(names) - 1)]
        out = f"t{k}"
        kind = draw_int(0, 3)
        same = [n for n in names if widths[n] == widths[a]]
        if kind == 1 and len(same) > 1:
            b = same[draw_int(0, len(same) - 1)]
            nodes.append(node("Add", [a, b], [out]))
            widths[out] = widths[a]
            read.update((a, b))
        elif kind == 2:
            b = names[draw_int(0, len(names) - 1)]
            nodes.append(node("Concat", [a, b], [out], axis=1))
            widths[out] = widths[a] + widths[b]
            read.update((a, b))
        elif kind == 3:
            w = f"w{k}"
            params[w] = np.zeros((widths[a], 64 * draw_int(1, 8)), np.float32)
            nodes.append(node("MatMul", [a, w], [out]))
            widths[out] = params[w].shape[1]
            read.add(a)
        else:
            nodes.append(node("Relu", [a], [out]))
            widths[out] = widths[a]
            read.add(a)
    outputs = [n for n in widths if n not in read and n != "x"] or [f"t{n_nodes - 1}"]
    return model(nodes, {"x": widths["x"]}, outputs, params)
