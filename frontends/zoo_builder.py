"""The zoo's graph builder: ONNX nodes, inputs, outputs and seeded random params under the names
PyTorch's exporter gives them, and the CNN and transformer layers the zoo models are made of."""
from contextlib import contextmanager

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from planner.builder import FreshNames
from planner.errors import ModelError

OPSET = 17
IR_VERSION = 8
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
NEG = float(np.finfo(np.float32).min)
"""What masked attention scores become (as transformers' finfo(dtype).min)."""


class Builder:
    """Collects inputs, nodes, params (initializers) and outputs under exporter-style names:
    nodes "/scope/parts/Op", their outputs "/scope/parts/Op_output_0", params "scope.parts.name"."""

    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.Generator(np.random.SFC64(seed))
        self.inputs, self.nodes, self.params, self.outputs = [], [], [], []
        self.scopes, self.fresh = [], FreshNames(sep="_")

    @contextmanager
    def scope(self, *parts):
        self.scopes.extend(str(p) for p in parts)
        try:
            yield
        finally:
            del self.scopes[-len(parts):]

    def scoped(self, scope, layer, *args):
        """layer(*args) with its params and nodes under `scope`."""
        with self.scope(scope):
            return layer(*args)

    # --- graph pieces ---

    def input(self, name, elem_type, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, value, name, elem_type, shape):
        """Rename `value` to the graph output `name` wherever it is written or read; return `name`."""
        for node in self.nodes:
            for names in (node.input, node.output):
                for i, x in enumerate(names):
                    if x == value:
                        names[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def op(self, op_type, *inputs, outputs=1, **attrs):
        """Append one node; return its output name, or a list of them when outputs > 1."""
        node = self.fresh("/".join(["", *self.scopes, op_type]))
        outs = [f"{node}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node, **attrs))
        return outs if outputs > 1 else outs[0]

    def param(self, name, array):
        full = self.fresh(".".join([*self.scopes, name]))
        self.params.append((full, np.asarray(array, np.float32)))
        return full

    def uniform(self, shape, low, high):
        w = self.rng.random(shape, dtype=np.float32)
        w *= high - low
        w += low
        return w

    def weights(self, shape, std):
        """Zero-mean uniform weights of standard deviation `std` (PyTorch's kaiming_uniform_ kind)."""
        bound = 3 ** 0.5 * std
        return self.uniform(shape, -bound, bound)

    def const(self, value, dtype=np.int64):
        """A Constant node, as the exporter emits for axes, shapes and scalars."""
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype)))

    def model(self):
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  ir_version=IR_VERSION, producer_name="memplan.zoo")
        for name, array in self.params:  # filled in place: 3x faster than from_array + append (a copy)
            init = model.graph.initializer.add(name=name, data_type=FLOAT, dims=array.shape)
            init.raw_data = array.astype("<f4", copy=False).tobytes()
        return model

    # --- CNN layers ---

    def image_input(self, channels, resolution):
        return self.input("input", FLOAT, ["batch", channels, resolution, resolution])

    def conv(self, x, cin, cout, k, stride=1, pad=None, groups=1, bias=False):
        """Conv with He (fan-in, ReLU gain) weights; `pad` defaults to k // 2."""
        pad = k // 2 if pad is None else pad
        std = (2 * groups / (cin * k * k)) ** 0.5
        inputs = [x, self.param("weight", self.weights((cout, cin // groups, k, k), std))]
        if bias:
            inputs.append(self.param("bias", self.weights(cout, 0.02)))
        return self.op("Conv", *inputs, dilations=[1, 1], group=groups, kernel_shape=[k, k],
                       pads=[pad] * 4, strides=[stride] * 2)

    def conv_transpose(self, x, cin, cout):
        """ConvTranspose 2x2 stride 2 with bias: doubles the resolution."""
        w = self.param("weight", self.weights((cin, cout, 2, 2), (2 / cin) ** 0.5))
        return self.op("ConvTranspose", x, w, self.param("bias", self.weights(cout, 0.02)),
                       dilations=[1, 1], group=1, kernel_shape=[2, 2], pads=[0] * 4, strides=[2, 2])

    def batch_norm(self, x, c, gamma=1.0):
        """Inference-form BatchNormalization; `gamma` scales the learned scale (down, for residual branches)."""
        scale = self.param("weight", gamma * self.uniform(c, 0.8, 1.2))
        shift = self.param("bias", self.weights(c, 0.05))
        mean = self.param("running_mean", self.weights(c, 0.1))
        var = self.param("running_var", self.uniform(c, 0.75, 1.5))
        return self.op("BatchNormalization", x, scale, shift, mean, var, epsilon=1e-5, momentum=0.9)

    def activation(self, x, act):
        if act == "relu":
            return self.op("Relu", x)
        if act == "relu6":
            return self.op("Clip", x, self.const(0.0, np.float32), self.const(6.0, np.float32))
        return x

    def conv_bn(self, x, cin, cout, k, stride=1, groups=1, act="relu", gamma=1.0, name=""):
        """Conv (no bias) -> BatchNormalization -> act, params under conv{name} and bn{name}."""
        with self.scope(f"conv{name}"):
            x = self.conv(x, cin, cout, k, stride, groups=groups)
        with self.scope(f"bn{name}"):
            x = self.batch_norm(x, cout, gamma)
        return self.activation(x, act)

    def max_pool(self, x, k, stride, pad=0):
        return self.op("MaxPool", x, ceil_mode=0, kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2)

    def gemm(self, x, fin, fout, gain=2.0):
        """torch.nn.Linear on a 2-D input: Gemm(transB=1); gain 2 before a ReLU, 1 for logits."""
        w = self.param("weight", self.weights((fout, fin), (gain / fin) ** 0.5))
        return self.op("Gemm", x, w, self.param("bias", self.weights(fout, 0.02)), alpha=1.0, beta=1.0, transB=1)

    # --- transformer layers ---

    def linear(self, x, fin, fout, gain=1.0):
        """torch.nn.Linear on a 3-D input: MatMul by the transposed weight, then Add the bias."""
        w = self.param("weight", self.weights((fin, fout), (gain / fin) ** 0.5))
        return self.op("Add", self.param("bias", self.weights(fout, 0.02)), self.op("MatMul", x, w))

    def embedding(self, table, ids):
        """Gather rows of `table` (rows, dim) at `ids`."""
        return self.op("Gather", self.param("weight", table), ids, axis=0)

    def layer_norm(self, x, dim, eps):
        gamma = self.param("weight", 1 + self.weights(dim, 0.1))
        beta = self.param("bias", self.weights(dim, 0.02))
        return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)

    def gelu_erf(self, x):
        """x * 0.5 * (1 + erf(x / sqrt(2)))."""
        erf = self.op("Erf", self.op("Div", x, self.const(2 ** 0.5, np.float32)))
        return self.op("Mul", self.op("Mul", x, self.op("Add", erf, self.const(1.0, np.float32))),
                       self.const(0.5, np.float32))

    def gelu_tanh(self, x):
        """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))), GPT-2's gelu_new."""
        half = self.op("Mul", x, self.const(0.5, np.float32))
        cube = self.op("Mul", self.op("Pow", x, self.const(3.0, np.float32)), self.const(0.044715, np.float32))
        inner = self.op("Mul", self.op("Add", x, cube), self.const((2 / np.pi) ** 0.5, np.float32))
        return self.op("Mul", half, self.op("Add", self.op("Tanh", inner), self.const(1.0, np.float32)))

    def fill(self, shape, value):
        """ConstantOfShape: a tensor of `shape` (an int64 tensor) filled with the NumPy scalar `value`."""
        return self.op("ConstantOfShape", shape, value=numpy_helper.from_array(np.array([value])))

    def dim(self, x, axis):
        """x.size(axis): a scalar int64 from Shape -> Gather."""
        return self.op("Gather", self.op("Shape", x), self.const(axis), axis=0)

    def unsqueeze(self, x, *axes):
        return self.op("Unsqueeze", x, self.const(list(axes)))

    def positions(self, ids):
        """torch.arange(ids.size(1)).unsqueeze(0): Range over a Shape-derived length."""
        return self.unsqueeze(self.op("Range", self.const(0), self.dim(ids, 1), self.const(1)), 0)

    def split_heads(self, x, heads, head_dim, perm):
        """x.view(b, s, heads, head_dim).permute(perm), the target shape computed from x's Shape."""
        shape = self.op("Concat", self.unsqueeze(self.dim(x, 0), 0), self.unsqueeze(self.dim(x, 1), 0),
                        self.const([heads]), self.const([head_dim]), axis=0)
        return self.op("Transpose", self.op("Reshape", x, shape), perm=perm)

    def merge_heads(self, x, hidden):
        """x.permute(0, 2, 1, 3) then view(size()[:-2] + (hidden,)): Shape -> Slice -> Concat -> Reshape."""
        x = self.op("Transpose", x, perm=[0, 2, 1, 3])
        lead = self.op("Slice", self.op("Shape", x), self.const([0]), self.const([-2]), self.const([0]))
        return self.op("Reshape", x, self.op("Concat", lead, self.const([hidden]), axis=0))

    def attention(self, q, k, v, heads, head_dim, mask=None, keep=None):
        """Scaled dot-product attention over (b, s, heads * head_dim) projections.

        `mask` is added to the scores (bert's extended mask); where the bool `keep` is false
        the scores become NEG (gpt2's causal mask).
        """
        q = self.split_heads(q, heads, head_dim, [0, 2, 1, 3])
        k = self.split_heads(k, heads, head_dim, [0, 2, 3, 1])
        v = self.split_heads(v, heads, head_dim, [0, 2, 1, 3])
        scores = self.op("Div", self.op("MatMul", q, k), self.const(head_dim ** 0.5, np.float32))
        if mask is not None:
            scores = self.op("Add", scores, mask)
        if keep is not None:
            scores = self.op("Where", keep, scores, self.const(NEG, np.float32))
        probs = self.op("Softmax", scores, axis=-1)
        return self.merge_heads(self.op("MatMul", probs, v), heads * head_dim)


def require(condition, message):
    """A ModelError with `message` unless `condition` holds: a model's options out of range."""
    if not condition:
        raise ModelError(message)
