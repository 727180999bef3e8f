"""Standard architectures built in code as ONNX models (opset 17, default domain), written
the way PyTorch's TorchScript exporter writes them in eval mode with a dynamic batch, and
filled with seeded random weights that keep activations O(1) through the whole depth.

`build(name, **options)` makes one; every model also takes `seed` (default 0).

- mlp           Gemm + Relu classifier: in_features, hidden, classes
- lenet         LeNet-5: resolution, channels, classes
- resnet18      torchvision ResNet-18 (basic blocks): resolution, classes, width
- resnet50      torchvision ResNet-50 (bottlenecks): resolution, classes, width
- mobilenet_v2  torchvision MobileNetV2, ReLU6 as Clip(0, 6): resolution, classes, width_mult
- vgg16         VGG-16 (no BN), first FC sized from the resolution: resolution, classes
- densenet121   torchvision DenseNet, every layer concatenating all earlier features:
                growth, blocks, init_features, bn_size, resolution, classes
- unet          U-Net with Concat skips: depth, channels, in_channels, classes, resolution,
                upsample ("transpose": ConvTranspose 2x2, or "resize": bilinear Resize)
- bert_base     BERT encoder: layers, hidden, heads, intermediate, vocab, max_positions, pooler
- gpt2_small    GPT-2 decoder with a causal mask and an LM head: layers, hidden, heads, vocab,
                max_positions
- resnet_deep   a stem, `depth` constant-width residual blocks and a classifier (for
                recomputation): depth, channels, resolution, classes

Image models read "input" ("batch", C, R, R) and write "output" (classifier logits, or the
segmentation map for unet). bert_base reads input_ids and attention_mask (int64,
("batch", "seq")) and writes last_hidden_state (and pooler_output when pooler=True);
gpt2_small reads input_ids and writes logits.
"""
import inspect
from contextlib import contextmanager

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from planner.errors import ModelError

OPSET = 17
IR_VERSION = 8
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
NEG = float(np.finfo(np.float32).min)
"""What masked attention scores become (as transformers' finfo(dtype).min)."""


class _Builder:
    """Collects inputs, nodes, params (initializers) and outputs under exporter-style names:
    nodes "/scope/parts/Op", their outputs "/scope/parts/Op_output_0", params "scope.parts.name"."""

    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.Generator(np.random.SFC64(seed))
        self.inputs, self.nodes, self.params, self.outputs = [], [], [], []
        self.scopes, self.used = [], set()

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

    def fresh(self, base):
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

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


def _require(condition, message):
    if not condition:
        raise ModelError(message)


def _classify(b, x, channels, classes):
    """GlobalAveragePool -> Flatten -> fc (Gemm), written as the graph output "output"."""
    x = b.op("Flatten", b.op("GlobalAveragePool", x), axis=1)
    with b.scope("fc"):
        x = b.gemm(x, channels, classes, gain=1.0)
    b.output(x, "output", FLOAT, ["batch", classes])


def _dense_head(b, x, sizes, classes, scope):
    """Gemm + Relu through `sizes`, then a Gemm to the logits, written as "output"."""
    for i, (fin, fout) in enumerate(zip(sizes, sizes[1:])):
        with b.scope(scope, i):
            x = b.op("Relu", b.gemm(x, fin, fout))
    with b.scope(scope, len(sizes) - 1):
        x = b.gemm(x, sizes[-1], classes, gain=1.0)
    b.output(x, "output", FLOAT, ["batch", classes])


def _mlp(b, in_features=784, hidden=(512, 256), classes=10):
    x = b.input("input", FLOAT, ["batch", in_features])
    _dense_head(b, x, [in_features, *hidden], classes, "layers")


def _lenet(b, resolution=28, channels=1, classes=10):
    side = (resolution // 2 - 4) // 2
    _require(side >= 1, f"lenet needs resolution >= 12, got {resolution}")
    x = b.image_input(channels, resolution)
    with b.scope("conv1"):
        x = b.max_pool(b.op("Relu", b.conv(x, channels, 6, 5, pad=2, bias=True)), 2, 2)
    with b.scope("conv2"):
        x = b.max_pool(b.op("Relu", b.conv(x, 6, 16, 5, pad=0, bias=True)), 2, 2)
    _dense_head(b, b.op("Flatten", x, axis=1), [16 * side * side, 120, 84], classes, "fc")


def _shortcut(b, x, cin, cout, stride):
    if stride == 1 and cin == cout:
        return x
    with b.scope("downsample"):
        return b.conv_bn(x, cin, cout, 1, stride, act=None)


def _basic_block(b, x, cin, c, stride, gamma):
    y = b.conv_bn(x, cin, c, 3, stride, name="1")
    y = b.conv_bn(y, c, c, 3, act=None, gamma=gamma, name="2")
    return b.op("Relu", b.op("Add", y, _shortcut(b, x, cin, c, stride))), c


def _bottleneck(b, x, cin, c, stride, gamma):
    y = b.conv_bn(x, cin, c, 1, name="1")
    y = b.conv_bn(y, c, c, 3, stride, name="2")
    y = b.conv_bn(y, c, 4 * c, 1, act=None, gamma=gamma, name="3")
    return b.op("Relu", b.op("Add", y, _shortcut(b, x, cin, 4 * c, stride))), 4 * c


def _resnet(b, block, counts, resolution, classes, width):
    x = b.image_input(3, resolution)
    x = b.max_pool(b.conv_bn(x, 3, width, 7, 2, name="1"), 3, 2, 1)
    cin, gamma = width, sum(counts) ** -0.5
    for stage, n in enumerate(counts):
        for i in range(n):
            with b.scope(f"layer{stage + 1}", i):
                x, cin = block(b, x, cin, width << stage, 2 if stage and not i else 1, gamma)
    _classify(b, x, cin, classes)


def _resnet18(b, resolution=224, classes=1000, width=64):
    _resnet(b, _basic_block, (2, 2, 2, 2), resolution, classes, width)


def _resnet50(b, resolution=224, classes=1000, width=64):
    _resnet(b, _bottleneck, (3, 4, 6, 3), resolution, classes, width)


def _resnet_deep(b, depth=200, channels=64, resolution=32, classes=10):
    x = b.image_input(3, resolution)
    x = b.conv_bn(x, 3, channels, 3, name="1")
    for i in range(depth):
        with b.scope("blocks", i):
            x, _ = _basic_block(b, x, channels, channels, 1, gamma=depth ** -0.5)
    _classify(b, x, channels, classes)


_MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                 (6, 320, 1, 1))
"""(expansion t, channels c, repeats n, first stride s) of each stage."""


def _divisible(v, divisor=8):
    """torchvision's _make_divisible: round to a multiple of 8, never down by more than 10%."""
    rounded = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def _inverted_residual(b, x, cin, cout, stride, expand):
    hidden = round(cin * expand)
    y = x if expand == 1 else b.conv_bn(x, cin, hidden, 1, act="relu6", name="0")
    y = b.conv_bn(y, hidden, hidden, 3, stride, groups=hidden, act="relu6", name="1")
    y = b.conv_bn(y, hidden, cout, 1, act=None, gamma=0.5, name="2")
    return b.op("Add", x, y) if stride == 1 and cin == cout else y


def _mobilenet_v2(b, resolution=224, classes=1000, width_mult=1.0):
    x = b.image_input(3, resolution)
    cin = _divisible(32 * width_mult)
    with b.scope("features", 0):
        x = b.conv_bn(x, 3, cin, 3, 2, act="relu6")
    index = 1
    for t, c, n, s in _MOBILENET_V2:
        cout = _divisible(c * width_mult)
        for i in range(n):
            with b.scope("features", index):
                x = _inverted_residual(b, x, cin, cout, s if i == 0 else 1, t)
            cin, index = cout, index + 1
    last = _divisible(1280 * max(1.0, width_mult))
    with b.scope("features", index):
        x = b.conv_bn(x, cin, last, 1, act="relu6")
    with b.scope("classifier"):
        _classify(b, x, last, classes)


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _vgg16(b, resolution=224, classes=1000):
    side = resolution // 32
    _require(side >= 1, f"vgg16 needs resolution >= 32, got {resolution}")
    x, cin = b.image_input(3, resolution), 3
    for i, v in enumerate(_VGG16):
        with b.scope("features", i):
            if v == "M":
                x = b.max_pool(x, 2, 2)
            else:
                x, cin = b.op("Relu", b.conv(x, cin, v, 3, bias=True)), v
    _dense_head(b, b.op("Flatten", x, axis=1), [512 * side * side, 4096, 4096], classes, "classifier")


def _bn_relu_conv(b, x, cin, cout, k, name=""):
    """DenseNet's pre-activation unit: BatchNormalization -> Relu -> Conv (no bias)."""
    with b.scope(f"norm{name}"):
        x = b.op("Relu", b.batch_norm(x, cin))
    with b.scope(f"conv{name}"):
        return b.conv(x, cin, cout, k)


def _densenet121(b, growth=32, blocks=(6, 12, 24, 16), init_features=64, bn_size=4, resolution=224, classes=1000):
    x = b.image_input(3, resolution)
    c = init_features
    with b.scope("features"):
        x = b.max_pool(b.conv_bn(x, 3, c, 7, 2, name="0"), 3, 2, 1)
        for i, n in enumerate(blocks):
            features = [x]
            for j in range(n):
                with b.scope(f"denseblock{i + 1}", f"denselayer{j + 1}"):
                    y = b.op("Concat", *features, axis=1) if j else x
                    y = _bn_relu_conv(b, y, c + j * growth, bn_size * growth, 1, name="1")
                    features.append(_bn_relu_conv(b, y, bn_size * growth, growth, 3, name="2"))
            x, c = b.op("Concat", *features, axis=1), c + n * growth
            if i < len(blocks) - 1:
                with b.scope(f"transition{i + 1}"):
                    x = _bn_relu_conv(b, x, c, c // 2, 1)
                    x = b.op("AveragePool", x, ceil_mode=0, kernel_shape=[2, 2], pads=[0] * 4, strides=[2, 2])
                c //= 2
        with b.scope("norm5"):
            x = b.op("Relu", b.batch_norm(x, c))
    with b.scope("classifier"):
        _classify(b, x, c, classes)


def _double_conv(b, x, cin, cout):
    return b.conv_bn(b.conv_bn(x, cin, cout, 3, name="1"), cout, cout, 3, name="2")


def _resize_like(b, x, like):
    """F.interpolate(x, size=like.shape[2:], mode="bilinear", align_corners=True): sizes from Shapes."""
    sizes = b.op("Concat", b.op("Slice", b.op("Shape", x), b.const([0]), b.const([2]), b.const([0])),
                 b.op("Slice", b.op("Shape", like), b.const([2]), b.const([4]), b.const([0])), axis=0)
    return b.op("Resize", x, "", "", sizes, mode="linear", coordinate_transformation_mode="align_corners")


def _unet(b, depth=4, channels=64, in_channels=3, classes=2, resolution=256, upsample="transpose"):
    _require(upsample in ("transpose", "resize"), f"unet upsample must be 'transpose' or 'resize', got {upsample!r}")
    _require(depth >= 1 and resolution % (1 << depth) == 0,
             f"unet needs a resolution divisible by 2**depth = {1 << depth}, got {resolution}")
    x = b.image_input(in_channels, resolution)
    with b.scope("inc"):
        x = _double_conv(b, x, in_channels, channels)
    skips, c = [], channels
    for i in range(depth):
        skips.append(x)
        with b.scope(f"down{i + 1}"):
            x, c = _double_conv(b, b.max_pool(x, 2, 2), c, 2 * c), 2 * c
    for i in range(depth):
        skip = skips.pop()
        with b.scope(f"up{i + 1}"):
            if upsample == "transpose":
                x, joined = b.conv_transpose(x, c, c // 2), c
            else:
                x, joined = _resize_like(b, x, skip), c + c // 2
            x, c = _double_conv(b, b.op("Concat", skip, x, axis=1), joined, c // 2), c // 2
    with b.scope("outc"):
        x = b.conv(x, c, classes, 1, bias=True)
    b.output(x, "output", FLOAT, ["batch", classes, resolution, resolution])


def _bert_base(b, layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, max_positions=512, pooler=False):
    _require(hidden % heads == 0, f"bert_base: hidden {hidden} is not a multiple of heads {heads}")
    ids = b.input("input_ids", INT64, ["batch", "seq"])
    mask = b.input("attention_mask", INT64, ["batch", "seq"])
    with b.scope("embeddings"):
        words = b.scoped("word_embeddings", b.embedding, b.weights((vocab, hidden), 0.02), ids)
        types = b.scoped("token_type_embeddings", b.embedding, b.weights((2, hidden), 0.02),
                         b.fill(b.op("Shape", ids), np.int64(0)))
        places = b.scoped("position_embeddings", b.embedding, b.weights((max_positions, hidden), 0.02),
                          b.positions(ids))
        x = b.scoped("LayerNorm", b.layer_norm, b.op("Add", b.op("Add", words, types), places), hidden, 1e-12)
    extended = b.op("Cast", b.unsqueeze(b.unsqueeze(mask, 1), 2), to=FLOAT)
    extended = b.op("Mul", b.op("Sub", b.const(1.0, np.float32), extended), b.const(NEG, np.float32))
    for i in range(layers):
        with b.scope("encoder", "layer", i):
            with b.scope("attention"):
                q, k, v = (b.scoped(name, b.linear, x, hidden, hidden) for name in ("query", "key", "value"))
                context = b.attention(q, k, v, heads, hidden // heads, mask=extended)
                with b.scope("output"):
                    y = b.op("Add", b.linear(context, hidden, hidden), x)
                    x = b.scoped("LayerNorm", b.layer_norm, y, hidden, 1e-12)
            with b.scope("intermediate"):
                y = b.gelu_erf(b.linear(x, hidden, intermediate))
            with b.scope("output"):
                y = b.op("Add", b.linear(y, intermediate, hidden), x)
                x = b.scoped("LayerNorm", b.layer_norm, y, hidden, 1e-12)
    x = b.output(x, "last_hidden_state", FLOAT, ["batch", "seq", hidden])
    if pooler:
        with b.scope("pooler"):
            pooled = b.op("Tanh", b.gemm(b.op("Gather", x, b.const(0), axis=1), hidden, hidden, gain=1.0))
        b.output(pooled, "pooler_output", FLOAT, ["batch", hidden])


def _gpt2_small(b, layers=12, hidden=768, heads=12, vocab=50257, max_positions=1024):
    _require(hidden % heads == 0, f"gpt2_small: hidden {hidden} is not a multiple of heads {heads}")
    ids = b.input("input_ids", INT64, ["batch", "seq"])
    residual_gain = 1 / (2 * layers)
    wte = b.weights((vocab, hidden), 0.02)
    with b.scope("transformer"):
        tokens = b.scoped("wte", b.embedding, wte, ids)
        places = b.scoped("wpe", b.embedding, b.weights((max_positions, hidden), 0.01), b.positions(ids))
        x = b.op("Add", tokens, places)
        seq = b.unsqueeze(b.dim(ids, 1), 0)
        keep = b.op("Trilu", b.fill(b.op("Concat", seq, seq, axis=0), np.bool_(True)), upper=0)
        for i in range(layers):
            with b.scope("h", i):
                y = b.scoped("ln_1", b.layer_norm, x, hidden, 1e-5)
                with b.scope("attn"):
                    qkv = b.scoped("c_attn", b.linear, y, hidden, 3 * hidden)
                    q, k, v = b.op("Split", qkv, b.const([hidden] * 3), axis=2, outputs=3)
                    context = b.attention(q, k, v, heads, hidden // heads, keep=keep)
                    x = b.op("Add", x, b.scoped("c_proj", b.linear, context, hidden, hidden, residual_gain))
                y = b.scoped("ln_2", b.layer_norm, x, hidden, 1e-5)
                with b.scope("mlp"):
                    y = b.gelu_tanh(b.scoped("c_fc", b.linear, y, hidden, 4 * hidden))
                    x = b.op("Add", x, b.scoped("c_proj", b.linear, y, 4 * hidden, hidden, residual_gain))
        x = b.scoped("ln_f", b.layer_norm, x, hidden, 1e-5)
    logits = b.op("MatMul", x, b.param("lm_head.weight", np.ascontiguousarray(wte.T)))  # the tied weight, transposed
    b.output(logits, "logits", FLOAT, ["batch", "seq", vocab])


_MODELS = {
    "mlp": _mlp,
    "lenet": _lenet,
    "resnet18": _resnet18,
    "resnet50": _resnet50,
    "mobilenet_v2": _mobilenet_v2,
    "vgg16": _vgg16,
    "densenet121": _densenet121,
    "unet": _unet,
    "bert_base": _bert_base,
    "gpt2_small": _gpt2_small,
    "resnet_deep": _resnet_deep,
}
NAMES = tuple(_MODELS)


def build(name, **options):
    """The zoo model `name` as an onnx.ModelProto; `options` override its sizes (see the module doc)."""
    if name not in _MODELS:
        raise ModelError(f"unknown zoo model {name!r}; the zoo has: {', '.join(NAMES)}")
    make = _MODELS[name]
    allowed = [*list(inspect.signature(make).parameters)[1:], "seed"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ModelError(f"zoo model {name!r} has no option {', '.join(map(repr, unknown))}; "
                         f"its options are: {', '.join(allowed)}")
    builder = _Builder(name, options.pop("seed", 0))
    make(builder, **options)
    return builder.model()
