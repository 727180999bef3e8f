"""Standard architectures built in code as ONNX models (opset 17, default domain), written
the way PyTorch's TorchScript exporter writes them in eval mode with a dynamic batch, and
filled with seeded random weights that keep activations O(1) through the whole depth.

`build(name, **options)` makes one; every model also takes `seed` (default 0). The CNNs are
here, bert_base and gpt2_small in zoo_transformers, the layers both use in zoo_builder.Builder.

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

from planner.errors import ModelError

from .zoo_builder import FLOAT, Builder, require
from .zoo_transformers import bert_base, gpt2_small


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
    require(side >= 1, f"lenet needs resolution >= 12, got {resolution}")
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
    require(side >= 1, f"vgg16 needs resolution >= 32, got {resolution}")
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
    require(upsample in ("transpose", "resize"), f"unet upsample must be 'transpose' or 'resize', got {upsample!r}")
    require(depth >= 1 and resolution % (1 << depth) == 0,
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


_MODELS = {
    "mlp": _mlp,
    "lenet": _lenet,
    "resnet18": _resnet18,
    "resnet50": _resnet50,
    "mobilenet_v2": _mobilenet_v2,
    "vgg16": _vgg16,
    "densenet121": _densenet121,
    "unet": _unet,
    "bert_base": bert_base,
    "gpt2_small": gpt2_small,
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
    builder = Builder(name, options.pop("seed", 0))
    make(builder, **options)
    return builder.model()
