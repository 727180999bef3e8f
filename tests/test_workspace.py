"""Conv / ConvTranspose scratch (im2col columns, chunked to the workspace limit) and its pooling into
MXNet's NUM_TEMP slots by ColorNodeGroup."""
import math
import random
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from planner import ops, workspace
from planner.ir import Node
from planner.ops import Info
from planner.ops.nn import PRODUCTS, Chunks, conv_chunks

MiB = 1 << 20


def requests(graph, limit):
    """{node name: scratch bytes} of a loaded graph's nodes that ask for any, under `limit`."""
    return {name: layout.nbytes for name, layout in workspace.layouts(graph, graph.nodes, limit).items()}


def conv_model(x_shape, w_shape, op="Conv", dtype=np.float32, **attrs):
    """A one-node opset-17 model: y = op(x, w) with zero weights."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = helper.make_tensor_value_info("x", elem, list(x_shape))
    y = helper.make_tensor_value_info("y", elem, None)
    w = numpy_helper.from_array(np.zeros(w_shape, dtype), "w")
    node = helper.make_node(op, ["x", "w"], ["y"], name="conv", **attrs)
    graph = helper.make_graph([node], "conv", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_chunks_of(x_shape, w_shape, limit, op="Conv", dtype=np.float32, **attrs):
    """The loaded conv node's Chunks under `limit`, and its requests as `requests` gives them."""
    g = planner.load(conv_model(x_shape, w_shape, op, dtype, **attrs))
    node = g.nodes[0]
    ins = [Info(g.tensors[n].shape, g.tensors[n].dtype) for n in node.inputs]
    outs = [(g.tensors[n].shape, g.tensors[n].dtype) for n in node.outputs]
    return ops.get(op).chunks(node, ins, outs, limit), requests(g, limit)


def test_resnet50_first_conv_batch32():
    # 3 * 7*7 * 112*112 float32 columns per image; 9 images fit in 64 MiB, 10 do not
    per_image = 3 * 7 * 7 * 112 * 112 * 4
    assert per_image == 7_375_872
    args = ((32, 3, 224, 224), (64, 3, 7, 7))
    attrs = dict(strides=[2, 2], pads=[3, 3, 3, 3])
    chunks, asked = conv_chunks_of(*args, 64 * MiB, **attrs)
    assert chunks == Chunks(9, 112, 66_382_848) and asked == {"conv": 66_382_848}
    assert 9 * per_image <= 64 * MiB < 10 * per_image
    whole, _ = conv_chunks_of(*args, 1 << 40, **attrs)
    assert whole == Chunks(32, 112, 236_027_904) == Chunks(32, 112, 32 * per_image)


def test_rows_when_one_image_exceeds_the_limit():
    # one output row of the first conv: 3 * 7*7 * 112 columns of 4 bytes
    args = ((32, 3, 224, 224), (64, 3, 7, 7))
    attrs = dict(strides=[2, 2], pads=[3, 3, 3, 3])
    row = 3 * 49 * 112 * 4
    chunks, _ = conv_chunks_of(*args, MiB, **attrs)
    assert chunks == Chunks(1, MiB // row, MiB // row * row) == Chunks(1, 15, 987_840)
    # a limit below one row: one row, the one case above the limit
    chunks, _ = conv_chunks_of(*args, 1000, **attrs)
    assert chunks == Chunks(1, 1, row)


CASES = {  # name: (op, x shape, w shape, attrs)
    "plain": ("Conv", (4, 8, 20, 20), (16, 8, 3, 3), {}),
    "grouped": ("Conv", (4, 32, 20, 20), (64, 8, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
    "depthwise": ("Conv", (8, 32, 28, 28), (32, 1, 3, 3), dict(group=32, pads=[1, 1, 1, 1])),
    "dilated": ("Conv", (2, 16, 30, 30), (16, 16, 3, 3), dict(dilations=[2, 2])),
    "strided": ("Conv", (4, 8, 33, 33), (16, 8, 5, 5), dict(strides=[3, 3], pads=[2, 1, 2, 1])),
    "1x1 strided": ("Conv", (4, 64, 28, 28), (128, 64, 1, 1), dict(strides=[2, 2])),
    "same_upper": ("Conv", (3, 5, 17, 13), (6, 5, 4, 2), dict(auto_pad="SAME_UPPER", strides=[2, 1])),
    "1-d": ("Conv", (6, 4, 100), (8, 4, 7), dict(pads=[3, 3])),
    "3-d": ("Conv", (2, 4, 8, 16, 16), (8, 4, 3, 3, 3), dict(pads=[1] * 6)),
    "transpose": ("ConvTranspose", (4, 16, 14, 14), (16, 8, 4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "transpose grouped": ("ConvTranspose", (2, 8, 10, 10), (8, 3, 3, 3), dict(group=2)),
    "transpose 1-d": ("ConvTranspose", (3, 6, 50), (6, 4, 5), dict(strides=[3], output_padding=[1])),
    "transpose 3-d": ("ConvTranspose", (2, 4, 5, 6, 7), (4, 2, 2, 2, 2), dict(strides=[2, 2, 2])),
}
LIMITS = (1, 100, 4096, 50_000, 10**6, 64 * MiB)


def expected_columns(op, x_shape, w_shape, y_shape):
    """One group's columns for one image, in elements, and the grid the rows are taken from."""
    grid = y_shape[2:] if op == "Conv" else x_shape[2:]
    group_channels = w_shape[1]  # C_in/group for Conv, C_out/group for ConvTranspose
    return group_channels * math.prod(w_shape[2:]) * math.prod(grid), grid


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_chunks_fit_the_limit(case, dtype):
    op, x_shape, w_shape, attrs = CASES[case]
    g = planner.load(conv_model(x_shape, w_shape, op, dtype, **attrs))
    node, schema = g.nodes[0], ops.get(op)
    ins = [Info(g.tensors[n].shape, g.tensors[n].dtype) for n in node.inputs]
    outs = [(g.tensors["y"].shape, g.tensors["y"].dtype)]
    columns, grid = expected_columns(op, x_shape, w_shape, outs[0][0])
    per_image = columns * np.dtype(dtype).itemsize
    row = per_image // grid[0]
    batch = x_shape[0]
    depthwise = schema.depthwise(node, ins[1])
    if not depthwise:
        assert schema.workspace(node, ins, outs, 1 << 40).nbytes == batch * per_image
    for asked in LIMITS:
        limit = asked
        if depthwise:  # one tap's products, in no more than the columns' bytes or PRODUCTS (or one row)
            cols = conv_chunks(batch, grid[0], columns * np.dtype(dtype).itemsize // grid[0], asked).nbytes
            limit = min(asked, max(cols, PRODUCTS))
            per_image = w_shape[0] * math.prod(grid) * np.dtype(dtype).itemsize
            row = per_image // grid[0]
        c = schema.chunks(node, ins, outs, asked)
        assert c.nbytes == schema.workspace(node, ins, outs, asked).nbytes
        if per_image <= limit:  # whole images, as many as fit
            assert c.rows == grid[0] and 1 <= c.images <= batch and c.nbytes == c.images * per_image <= limit
            assert c.images == batch or (c.images + 1) * per_image > limit
        else:  # one image, as many rows as fit; one row even when it alone exceeds the limit
            assert c.images == 1 and 1 <= c.rows < grid[0] and c.nbytes == c.rows * row
            assert c.nbytes <= limit or c.rows == 1
            assert c.nbytes > limit or (c.rows + 1) * row > limit
        assert conv_chunks(batch, grid[0], row, c.nbytes) == c  # a buffer of the planned size finds the plan


@pytest.mark.parametrize("op, x_shape, w_shape, attrs, needs", [
    ("Conv", (8, 64, 56, 56), (256, 64, 1, 1), {}, False),
    ("Conv", (8, 64, 56, 56), (256, 64, 1, 1), dict(dilations=[2, 2], auto_pad="SAME_UPPER"), False),
    ("Conv", (8, 64, 56), (256, 64, 1), {}, False),
    ("Conv", (8, 64, 56, 56), (256, 64, 1, 1), dict(strides=[2, 2]), True),
    ("Conv", (8, 64, 56, 56), (256, 64, 1, 1), dict(pads=[1, 1, 1, 1]), True),
    ("ConvTranspose", (8, 64, 14, 14), (64, 32, 1, 1), {}, False),
    ("ConvTranspose", (8, 64, 14, 14), (64, 32, 1, 1), dict(strides=[2, 2]), True),
])
def test_pointwise_conv_needs_no_columns(op, x_shape, w_shape, attrs, needs):
    chunks, asked = conv_chunks_of(x_shape, w_shape, 64 * MiB, op, **attrs)
    assert (chunks.nbytes > 0) == needs and (asked != {}) == needs
    if not needs:
        assert chunks.images == x_shape[0]


def test_conv_chunks_arithmetic():
    assert conv_chunks(32, 10, 100, 4500) == Chunks(4, 10, 4000)
    assert conv_chunks(3, 10, 100, 4500) == Chunks(3, 10, 3000)
    assert conv_chunks(32, 10, 100, 999) == Chunks(1, 9, 900)
    assert conv_chunks(32, 10, 100, 99) == Chunks(1, 1, 100)
    assert conv_chunks(32, 10, 0, 99) == Chunks(32, 10, 0)


def chain(n):
    """n Relu nodes in a row: x -> r0 -> r1 -> ..."""
    names = ["x", *(f"r{i}" for i in range(n))]
    return [Node("Relu", (a,), (b,), name=b) for a, b in zip(names, names[1:])]


def test_chain_takes_one_colour():
    steps = chain(6)
    assert set(workspace.color_nodes(steps, 1, {n.name: 1 for n in steps}).values()) == {0}
    # two colours: the whole chain is the heaviest path; nothing is left for colour 1
    assert set(workspace.color_nodes(steps, 2, {n.name: 1 for n in steps}).values()) == {0}
    # no weight at all: no path is taken, and everything gets the first colour
    assert set(workspace.color_nodes(steps, 3, {}).values()) == {0}


def branches():
    """Two branches from one source, joined by an Add:

        s -> a1 -> a2 -> a3 -> add
         \\-> b1 -----------/
    """
    return [Node("Relu", ("x",), ("s",), name="s"),
            Node("Relu", ("s",), ("a1",), name="a1"), Node("Relu", ("s",), ("b1",), name="b1"),
            Node("Relu", ("a1",), ("a2",), name="a2"), Node("Relu", ("a2",), ("a3",), name="a3"),
            Node("Add", ("a3", "b1"), ("add",), name="add")]


def test_parallel_branches_split_by_the_heaviest_path():
    steps = branches()
    color = workspace.color_nodes(steps, 2, {n.name: 1 for n in steps})
    assert color == {"s": 0, "a1": 0, "a2": 0, "a3": 0, "add": 0, "b1": 1}
    # only b1 and a2 weigh: the heaviest path takes one of them (ties go to the later node, as in NNVM)
    color = workspace.color_nodes(steps, 2, {"a2": 1, "b1": 1})
    assert color["a2"] != color["b1"] and color["a2"] == 0
    # three colours for three branches: the weightless nodes on paths keep the last colour
    steps = [*steps, Node("Relu", ("s",), ("c1",), name="c1"), Node("Relu", ("c1",), ("c2",), name="c2")]
    color = workspace.color_nodes(steps, 3, {n: 1 for n in ("a1", "a2", "a3", "c1", "c2", "b1")})
    assert [color[n] for n in ("a1", "a2", "a3", "c1", "c2", "b1")] == [0, 0, 0, 1, 1, 2]
    assert color["s"] == color["add"] == 2


def test_colouring_is_linear():
    rng = random.Random(0)
    steps = [Node("Relu", ("x",), ("t0",), name="n0")]
    for i in range(1, 50_000):
        reads = tuple({f"t{rng.randrange(max(0, i - 50), i)}" for _ in range(2)})
        steps.append(Node("Add" if len(reads) == 2 else "Relu", reads, (f"t{i}",), name=f"n{i}"))
    start = time.perf_counter()
    color = workspace.color_nodes(steps, 2, {n.name: 1 for n in steps})
    assert time.perf_counter() - start < 5
    assert set(color.values()) == {0, 1}


def two_branch_convs():
    """x -> conv a1 (3x3) -> conv a2 (5x5) -> add <- conv b (3x3, 16 channels) <- x: three requests,
    a1 and a2 on the heaviest path, b beside it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ws = {"wa1": (8, 8, 3, 3), "wa2": (8, 8, 5, 5), "wb": (8, 16, 3, 3)}
    inits = [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in ws.items()]
    nodes = [helper.make_node("Conv", ["x", "wa1"], ["a1"], name="a1", pads=[1] * 4),
             helper.make_node("Conv", ["a1", "wa2"], ["a2"], name="a2", pads=[2] * 4),
             helper.make_node("Concat", ["x", "x"], ["xx"], name="xx", axis=1),
             helper.make_node("Conv", ["xx", "wb"], ["b"], name="b", pads=[1] * 4),
             helper.make_node("Add", ["a2", "b"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "branches", [x], [y], inits)
    return planner.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_pool_slot_is_the_largest_request_of_its_colour():
    g = two_branch_convs()
    asked = requests(g, 64 * MiB)
    cols = {"a1": 8 * 9, "a2": 8 * 25, "b": 16 * 9}  # columns per output pixel
    assert asked == {n: 2 * c * 16 * 16 * 4 for n, c in cols.items()}
    sizes, slot_of = workspace.pool(g.nodes, requests(g, 64 * MiB), 2)
    assert slot_of == {"a1": 0, "a2": 0, "b": 1}
    assert sizes == [max(asked["a1"], asked["a2"]), asked["b"]]
    assert workspace.pool(g.nodes, requests(g, 64 * MiB), 1) == ([max(asked.values())], dict.fromkeys(asked, 0))
    # a limit of one a2 image: each conv takes as many whole images as fit
    sizes, _ = workspace.pool(g.nodes, requests(g, asked["a2"] // 2), 2)
    assert sizes == [asked["a2"] // 2, asked["b"] // 2]


def test_resnet50_batch32_workspace():
    g = planner.load("zoo:resnet50", {"input": (32, 3, 224, 224)})
    asked = requests(g, 64 * MiB)
    assert asked and max(asked.values()) <= 64 * MiB
    assert {n.op for n in g.nodes if n.name in asked} == {"Conv"}
    sizes, slot_of = workspace.pool(g.nodes, requests(g, 64 * MiB), 1)
    assert sizes == [max(asked.values())] and set(slot_of) == set(asked)
    sizes, slot_of = workspace.pool(g.nodes, requests(g, 64 * MiB), 2)
    assert len(sizes) == 2 and max(sizes) == max(asked.values())
    assert all(sizes[slot_of[n]] >= b for n, b in asked.items())
