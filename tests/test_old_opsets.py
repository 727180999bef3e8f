"""Models of opsets 7 to 10, upgraded by onnx's version converter: stand-ins for the ONNX model zoo's classic
models (resnet50-v1-7, mobilenetv2-7, bertsquad-8, gpt2-10) with their ops at their opsets and IR versions, planned
and run against onnxruntime, which runs them as they are; and the upgrades memplan refuses, in one line."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner.errors import ModelError

IR_VERSION = {7: 3, 8: 3, 9: 4, 10: 5}
"""The IR version of the ONNX release that brought each opset; before IR 4 initializers are graph inputs too."""


class Net:
    """A model written node by node: weights as initializers, values named in order."""

    def __init__(self, seed=0):
        self.nodes, self.weights, self.count = [], [], 0
        self.rng = np.random.default_rng(seed)

    def weight(self, *shape, scale=0.2, value=None):
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32) if value is None else np.asarray(value)
        self.weights.append(numpy_helper.from_array(value, f"w{len(self.weights)}"))
        return self.weights[-1].name

    def __call__(self, op, *inputs, outputs=1, **attrs):
        names = [f"{op.lower()}{self.count}_{i}" for i in range(outputs)]
        self.count += 1
        self.nodes.append(helper.make_node(op, list(inputs), names, name=f"{op}{self.count}", **attrs))
        return names[0] if outputs == 1 else names

    def model(self, opset, inputs, outputs):
        """The model at `opset` with the IR version of its day; `inputs` and `outputs` as (name, elem, shape)."""
        declared = [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs]
        if IR_VERSION[opset] < 4:
            declared += [helper.make_tensor_value_info(w.name, w.data_type, w.dims) for w in self.weights]
        graph = helper.make_graph(self.nodes, "standin", declared,
                                  [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs], self.weights)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION[opset])

    def conv_bn(self, x, cin, cout, k=3, stride=1, group=1, act="Relu"):
        y = self("Conv", x, self.weight(cout, cin // group, k, k), kernel_shape=[k, k], strides=[stride, stride],
                 pads=[k // 2] * 4, group=group)
        stats = [self.weight(cout, value=np.ones(cout, np.float32) + 0.1 * self.rng.random(cout, np.float32)),
                 self.weight(cout), self.weight(cout), self.weight(cout, value=0.5 + self.rng.random(cout, np.float32))]
        y = self("BatchNormalization", y, *stats, epsilon=1e-5, momentum=0.9, spatial=1)
        if act == "Relu":
            return self("Relu", y)
        return self("Clip", y, min=0.0, max=6.0) if act == "Relu6" else y


def resnet_v1_7():
    """resnet50-v1-7's ops at opset 7 (MXNet's export): Conv, BatchNormalization with spatial, Relu, MaxPool, Add,
    GlobalAveragePool, Flatten, Gemm; a Dropout with its ratio (opset 7) and a Softmax over the classes."""
    net = Net(1)
    x = net.conv_bn("data", 3, 8, stride=2)
    x = net("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for cin, cout, stride in ((8, 8, 1), (8, 16, 2)):
        y = net.conv_bn(net.conv_bn(x, cin, cout, stride=stride), cout, cout, act=None)
        short = x if cin == cout else net.conv_bn(x, cin, cout, k=1, stride=stride, act=None)
        x = net("Relu", net("Add", y, short))
    x = net("Flatten", net("GlobalAveragePool", x), axis=1)
    x = net("Dropout", x, ratio=0.5)
    logits = net("Gemm", x, net.weight(10, 16), net.weight(10), alpha=1.0, beta=1.0, transB=1)
    net("Softmax", logits, axis=1)
    return net.model(7, [("data", TensorProto.FLOAT, [2, 3, 32, 32])],
                     [(net.nodes[-1].output[0], TensorProto.FLOAT, [2, 10])]), \
        {"data": np.random.default_rng(0).random((2, 3, 32, 32), np.float32)}


def mobilenet_v2_7():
    """mobilenetv2-7's ops at opset 7: inverted residuals of Conv (depthwise by group), BatchNormalization and
    relu6 as Clip with its bounds as attributes, Add, GlobalAveragePool, Reshape by a shape initializer."""
    net = Net(2)
    x = net.conv_bn("data", 3, 8, stride=2, act="Relu6")
    for cin, cout, stride in ((8, 8, 1), (8, 12, 2)):
        y = net.conv_bn(x, cin, cin * 4, k=1, act="Relu6")
        y = net.conv_bn(y, cin * 4, cin * 4, stride=stride, group=cin * 4, act="Relu6")
        y = net.conv_bn(y, cin * 4, cout, k=1, act=None)
        x = net("Add", x, y) if cin == cout and stride == 1 else y
    x = net("Conv", net("GlobalAveragePool", x), net.weight(10, 12, 1, 1), kernel_shape=[1, 1])
    net("Reshape", x, net.weight(2, value=np.array([0, -1], np.int64)))
    return net.model(7, [("data", TensorProto.FLOAT, [2, 3, 32, 32])],
                     [(net.nodes[-1].output[0], TensorProto.FLOAT, [2, 10])]), \
        {"data": np.random.default_rng(1).random((2, 3, 32, 32), np.float32)}


def _layer_norm(net, x, width):
    mean = net("ReduceMean", x, axes=[-1], keepdims=1)
    centred = net("Sub", x, mean)
    var = net("ReduceMean", net("Mul", centred, centred), axes=[-1], keepdims=1)
    scale = net("Div", net.weight(width, value=np.ones(width, np.float32)),
                net("Sqrt", net("Add", var, net.weight(value=np.float32(1e-6)))))
    return net("Add", net("Mul", centred, scale), net.weight(width))


def _gelu_tanh(net, x):
    cube = net("Pow", x, net.weight(value=np.float32(3.0)))
    inner = net("Mul", net("Add", x, net("Mul", cube, net.weight(value=np.float32(0.044715)))),
                net.weight(value=np.float32(np.sqrt(2 / np.pi))))
    return net("Mul", net("Mul", x, net.weight(value=np.float32(0.5))),
               net("Add", net("Tanh", inner), net.weight(value=np.float32(1.0))))


def _masked(net, scores, causal):
    """GPT-2's causal mask of its day: scores * b - 1e4 * (1 - b)."""
    outside = net("Sub", net.weight(value=np.float32(1.0)), causal)
    return net("Sub", net("Mul", scores, causal), net("Mul", outside, net.weight(value=np.float32(1e4))))


def _attention(net, x, mask, seq, width, heads):
    """Multi-head self-attention as TF's and PyTorch's exports of their day write it: Reshape by shape
    initializers, Transpose, MatMul, a scale, an additive mask, Softmax over the last axis (opset < 13)."""
    split = net.weight(4, value=np.array([0, seq, heads, width // heads], np.int64))

    def project():
        y = net("Add", net("MatMul", x, net.weight(width, width)), net.weight(width))
        return net("Transpose", net("Reshape", y, split), perm=[0, 2, 1, 3])
    q, k, v = project(), project(), project()
    scores = net("Mul", net("MatMul", q, net("Transpose", k, perm=[0, 1, 3, 2])),
                 net.weight(value=np.float32(1 / np.sqrt(width // heads))))
    probs = net("Softmax", net("Add", scores, mask), axis=-1)
    y = net("Reshape", net("Transpose", net("MatMul", probs, v), perm=[0, 2, 1, 3]),
            net.weight(3, value=np.array([0, seq, width], np.int64)))
    return net("Add", net("MatMul", y, net.weight(width, width)), net.weight(width))


def bertsquad_8():
    """bertsquad-8's ops at opset 8 (tf2onnx): Gather embeddings, a Cast and Unsqueezed mask, layer norms of
    ReduceMean/Sub/Mul/Sqrt/Div, attention, a tanh GELU (Pow, Tanh), Slice by attributes (before opset 10),
    Split by its `split` attribute and Squeeze into start and end logits."""
    net, seq, width = Net(3), 6, 16
    x = net("Add", net("Gather", net.weight(30, width), "input_ids"),
            net("Gather", net.weight(2, width), "segment_ids"))
    x = _layer_norm(net, net("Add", x, net("Slice", net.weight(16, width), starts=[0], ends=[seq], axes=[0])), width)
    mask = net("Mul", net("Sub", net.weight(value=np.float32(1.0)),
                          net("Cast", net("Unsqueeze", net("Unsqueeze", "input_mask", axes=[1]), axes=[1]), to=1)),
               net.weight(value=np.float32(-1e4)))
    x = _layer_norm(net, net("Add", x, _attention(net, x, mask, seq, width, 2)), width)
    hidden = _gelu_tanh(net, net("Add", net("MatMul", x, net.weight(width, 32)), net.weight(32)))
    x = _layer_norm(net, net("Add", x, net("Add", net("MatMul", hidden, net.weight(32, width)), net.weight(width))),
                    width)
    logits = net("Add", net("MatMul", x, net.weight(width, 2)), net.weight(2))
    start, end = net("Split", logits, axis=2, split=[1, 1], outputs=2)
    net("Squeeze", start, axes=[2])
    net("Squeeze", end, axes=[2])
    rng = np.random.default_rng(3)
    feeds = {"input_ids": rng.integers(0, 30, (2, seq)), "segment_ids": rng.integers(0, 2, (2, seq)),
             "input_mask": np.array([[1] * seq, [1] * (seq - 2) + [0, 0]], np.int64)}
    return net.model(8, [(k, TensorProto.INT64, [2, seq]) for k in feeds],
                     [(n.output[0], TensorProto.FLOAT, [2, seq]) for n in net.nodes[-2:]]), feeds


def gpt2_10():
    """gpt2-10's ops at opset 10 (PyTorch's export): Gather embeddings, positions sliced by Slice's opset-10
    inputs, a causal mask Sliced from a constant triangle, a fused QKV projection Split three ways, reshapes
    computed from Shape/Gather/Unsqueeze/Concat, layer norms with Pow, a tanh GELU, and tied output weights."""
    net, seq, width = Net(4), 5, 16
    tokens = net.weight(40, width)
    start, end, axis = (net.weight(1, value=np.array([v], np.int64)) for v in (0, seq, 0))
    x = net("Add", net("Gather", tokens, "input_ids"), net("Slice", net.weight(8, width), start, end, axis))
    causal = net("Slice", net.weight(8, 8, value=np.tril(np.ones((8, 8), np.float32))), start, end, axis)
    causal = net("Slice", causal, start, end, net.weight(1, value=np.array([1], np.int64)))
    y = _layer_norm(net, x, width)
    q, k, v = net("Split", net("Add", net("MatMul", y, net.weight(width, 3 * width)), net.weight(3 * width)),
                  axis=2, split=[width] * 3, outputs=3)
    batch = net("Unsqueeze", net("Gather", net("Shape", y), net.weight(value=np.int64(0)), axis=0), axes=[0])
    heads = net("Concat", batch, net.weight(3, value=np.array([seq, 2, width // 2], np.int64)), axis=0)
    q, k, v = (net("Transpose", net("Reshape", t, heads), perm=[0, 2, 1, 3]) for t in (q, k, v))
    scores = net("Div", net("MatMul", q, net("Transpose", k, perm=[0, 1, 3, 2])),
                 net.weight(value=np.float32(np.sqrt(width // 2))))
    scores = _masked(net, scores, causal)
    attn = net("Transpose", net("MatMul", net("Softmax", scores, axis=-1), v), perm=[0, 2, 1, 3])
    attn = net("Reshape", attn, net.weight(3, value=np.array([0, seq, width], np.int64)))
    x = net("Add", x, net("Add", net("MatMul", attn, net.weight(width, width)), net.weight(width)))
    hidden = _gelu_tanh(net, net("Add", net("MatMul", _layer_norm(net, x, width), net.weight(width, 32)),
                                 net.weight(32)))
    x = net("Add", x, net("MatMul", hidden, net.weight(32, width)))
    net("MatMul", _layer_norm(net, x, width), net("Transpose", tokens, perm=[1, 0]))
    feeds = {"input_ids": np.random.default_rng(4).integers(0, 40, (2, seq))}
    return net.model(10, [("input_ids", TensorProto.INT64, [2, seq])],
                     [(net.nodes[-1].output[0], TensorProto.FLOAT, [2, seq, 40])]), feeds


def upsample(op, opset, scales, mode):
    """One Upsample (opsets 7 to 9) or Resize (opset 10) of a 1x2x5x7 input: Resize of opset 11 samples elsewhere
    by default (half_pixel), so memplan says where."""
    net = Net(5)
    if opset < 9:
        net(op, "x", mode=mode, scales=scales)
    else:
        net(op, "x", net.weight(4, value=np.array(scales, np.float32)), mode=mode)
    return net.model(opset, [("x", TensorProto.FLOAT, [1, 2, 5, 7])], [(net.nodes[-1].output[0], TensorProto.FLOAT,
                                                                        None)]), \
        {"x": np.random.default_rng(5).random((1, 2, 5, 7), np.float32)}


def assert_runs_as_onnxruntime(model, feeds, source=None):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    plan = planner.compile(model if source is None else source, {k: v.shape for k, v in feeds.items()})
    got = Executor(plan, backend="numpy", poison=True).run(feeds)
    for out, expected in zip(model.graph.output, want):
        np.testing.assert_allclose(got[out.name], expected, rtol=1e-4, atol=1e-5, err_msg=out.name)


STANDINS = {"resnet50-v1-7": resnet_v1_7, "mobilenetv2-7": mobilenet_v2_7, "bertsquad-8": bertsquad_8,
            "gpt2-10": gpt2_10}


@pytest.mark.parametrize("name", STANDINS)
def test_zoo_standin_runs_as_onnxruntime(name):
    model, feeds = STANDINS[name]()
    onnx.checker.check_model(model, full_check=True)
    before = model.SerializeToString()
    assert_runs_as_onnxruntime(model, feeds)
    assert model.SerializeToString() == before  # the user's model is left as it was


def test_weights_in_external_files_are_read_from_them(tmp_path):
    model, feeds = resnet_v1_7()
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path / "resnet.onnx",
              save_as_external_data=True, location="resnet.data", size_threshold=64)
    assert_runs_as_onnxruntime(model, feeds, source=str(tmp_path / "resnet.onnx"))


@pytest.mark.parametrize("op, opset, scales, mode", [
    ("Upsample", 7, [1.0, 1.0, 2.0, 3.0], "nearest"), ("Upsample", 8, [1.0, 1.0, 2.4, 1.5], "linear"),
    ("Upsample", 9, [1.0, 1.0, 2.4, 1.5], "nearest"), ("Resize", 10, [1.0, 1.0, 0.5, 0.6], "nearest"),
    ("Resize", 10, [1.0, 1.0, 2.0, 0.6], "linear")])
def test_upsampling_keeps_its_coordinates(op, opset, scales, mode):
    assert_runs_as_onnxruntime(*upsample(op, opset, scales, mode))


def test_hints_and_names_survive_the_upgrade():
    model, _ = upsample("Upsample", 9, [1.0, 1.0, 2.0, 2.0], "nearest")
    node = model.graph.node[0]
    node.metadata_props.add(key="memplan.force_mirroring", value="1")
    (read,) = planner.load(model, {"x": (1, 2, 5, 7)}).nodes
    assert (read.op, read.name, read.notes.force_mirroring) == ("Resize", node.name, True)


def _bn_per_activation():
    net = Net(6)
    net("BatchNormalization", "x", *(net.weight(2) for _ in range(4)), spatial=0)
    return net.model(7, [("x", TensorProto.FLOAT, [1, 2, 3, 3])], [(net.nodes[-1].output[0], TensorProto.FLOAT, None)])


def _scan_8():
    body = helper.make_graph([helper.make_node("Add", ["s", "a"], ["s2"]), helper.make_node("Identity", ["s2"], ["o"])],
                             "body", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "sa"],
                             [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s2", "o")])
    net = Net()
    net("Scan", "", "init", "xs", body=body, num_scan_inputs=1, outputs=2)
    return net.model(8, [("init", TensorProto.FLOAT, [1, 2]), ("xs", TensorProto.FLOAT, [1, 3, 2])],
                     [(o, TensorProto.FLOAT, None) for o in net.nodes[0].output])


def _unknown_op():
    net = Net()
    net("Frobnicate", "x")
    return net.model(9, [("x", TensorProto.FLOAT, [2])], [(net.nodes[0].output[0], TensorProto.FLOAT, None)])


def _computed_scales():
    net = Net()
    net("Resize", "x", net("Concat", net.weight(2, value=np.ones(2, np.float32)), "s", axis=0), mode="nearest")
    return net.model(10, [("x", TensorProto.FLOAT, [1, 2, 4, 4]), ("s", TensorProto.FLOAT, [2])],
                     [(net.nodes[-1].output[0], TensorProto.FLOAT, None)])


def _opset(version):
    net = Net()
    net("Relu", "x")
    model = net.model(7, [("x", TensorProto.FLOAT, [2])], [(net.nodes[0].output[0], TensorProto.FLOAT, None)])
    model.opset_import[0].version = version
    return model


READS = r"\(memplan reads opsets 11 to \d+, and 7 to 10 through onnx's version converter\)$"
UPGRADE = r"^opset (\d+) cannot be upgraded to opset 11 by onnx's version converter: "


@pytest.mark.parametrize("build, message", [
    (_bn_per_activation, UPGRADE + r"node 'BatchNormalization1' \(BatchNormalization\): Attribute spatial must have "
                                   r"value 1 "),
    (_scan_8, UPGRADE + r"node 'Scan1' \(Scan\): opset 8's Scan loops over a batch axis that opset 9's lacks"),
    (_unknown_op, UPGRADE + r"node 'Frobnicate1' \(Frobnicate\): not an ONNX op of opset 9 "),
    (lambda: upsample("Resize", 10, [1.0, 1.0, 2.0, 0.6], "nearest")[0],
     UPGRADE + r"node 'Resize1' \(Resize\): nearest sampling rounds down where it upsamples and up where it "
               r"downsamples, and its scales \[1.0, 1.0, 2.0, 0.6\d*\] do both"),
    (_computed_scales, UPGRADE + r"node 'Resize2' \(Resize\): nearest sampling .* its scales are computed"),
    (lambda: upsample("Upsample", 7, [1.0, 1.0, 2.0, 2.0], "cubic")[0],
     UPGRADE + r"node 'Upsample1' \(Upsample\): mode 'cubic' is not nearest or linear"),
    (lambda: _opset(6), r"^opset 6 is not supported "),
    (lambda: _opset(onnx.defs.onnx_opset_version() + 1), r"^opset \d+ is not supported ")])
def test_what_cannot_be_upgraded_is_refused_in_one_line(build, message):
    with pytest.raises(ModelError, match=message + ".*" + READS) as error:
        planner.load(build())
    assert "\n" not in str(error.value)
