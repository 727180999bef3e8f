"""FLOPs of nodes from their op schemas."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import planner
from planner.ops import node_flops


def one_node(op, x_shape, params, **attrs):
    """A float32 graph of one node reading input x and the given params."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x", *params], ["y"], **attrs)], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    graph = planner.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return node_flops(graph, graph.nodes[0])


def test_matmul_conv_and_views():
    assert one_node("MatMul", [2, 3], {"w": np.ones((3, 4), np.float32)}) == 48
    # 2 images x 8 channels x 5x5 outputs, each 3 channels / 1 group x 3x3 taps, plus the bias
    conv = {"w": np.ones((8, 3, 3, 3), np.float32), "b": np.ones(8, np.float32)}
    assert one_node("Conv", [2, 3, 7, 7], conv) == 2 * (2 * 8 * 25) * 27 + 2 * 8 * 25
    grouped = {"w": np.ones((8, 1, 3, 3), np.float32)}
    assert one_node("Conv", [2, 4, 7, 7], grouped, group=4) == 2 * (2 * 8 * 25) * 9
    assert one_node("Reshape", [2, 3], {"s": np.array([3, 2])}) == 0
    assert one_node("MaxPool", [1, 2, 4, 4], {}, kernel_shape=[2, 2], strides=[2, 2]) == 8 * 4


def test_resnet50():
    graph = planner.load("zoo:resnet50", {"input": (1, 3, 224, 224)})
    total = sum(node_flops(graph, n) for n in graph.nodes)
    assert abs(total - 8.2e9) < 0.1 * 8.2e9, total
