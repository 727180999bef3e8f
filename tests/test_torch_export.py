"""Models written as small PyTorch modules, exported by PyTorch's own (TorchScript) exporter with dynamic axes."""
import io
import warnings

import onnx
import pytest

import planner

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn
pytestmark = pytest.mark.torch


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU6())
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        y = self.features(x)
        return self.head(y.view(y.size(0), -1)).log_softmax(-1)


class Upsampler(nn.Module):
    def forward(self, x):
        up = nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        size = nn.functional.interpolate(x, size=(x.shape[2] * 3, x.shape[3] * 3), mode="bilinear")
        return up.sum(1, keepdim=True), size.flatten(2).transpose(1, 2)


class Encoder(nn.Module):
    """Causal self-attention and a GELU MLP written out (nn.MultiheadAttention's export bakes the sequence length)."""
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 32)
        self.qkv = nn.Linear(32, 96)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.Dropout(0.1))
        self.norm1, self.norm2 = nn.LayerNorm(32), nn.LayerNorm(32)

    def forward(self, ids):
        x = self.embed(ids)
        b, t, c = x.shape
        q, k, v = (h.view(b, t, 4, c // 4).transpose(1, 2) for h in self.qkv(self.norm1(x)).split(c, dim=-1))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        scores = (q @ k.transpose(-1, -2) / (c // 4) ** 0.5).masked_fill(mask, float("-inf"))
        x = x + (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        return x + self.mlp(self.norm2(x))


def export(module, args, names, dynamic, training=False):
    f = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.train(training), args, f, input_names=names, dynamic_axes=dynamic,
                          opset_version=17, dynamo=False, training=mode, do_constant_folding=not training)
    return onnx.load_from_string(f.getvalue())


CASES = {
    "cnn": (SmallCNN, lambda b: (torch.randn(b, 3, 16, 16),), ["x"], {"x": {0: "batch"}}),
    "upsample": (Upsampler, lambda b: (torch.randn(b, 2, 5, 7),), ["x"], {"x": {0: "batch", 2: "h", 3: "w"}}),
    "encoder": (Encoder, lambda b: (torch.randint(0, 50, (b, 2 * b + 3)),), ["ids"], {"ids": {0: "batch", 1: "seq"}}),
}


@pytest.mark.parametrize("name", CASES)
def test_exported_models_get_static_shapes_at_two_batch_sizes(name):
    make, sample, names, dynamic = CASES[name]
    torch.manual_seed(0)
    model = export(make(), sample(2), names, dynamic)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 4):
        feeds = {n: a.numpy() for n, a in zip(names, sample(batch))}
        graph = planner.load(model, {n: a.shape for n, a in feeds.items()})
        assert all(t.is_static for t in graph.tensors.values())
        expected = session.run(None, feeds)
        assert [graph.tensors[o].shape for o in graph.outputs] == [e.shape for e in expected]
        assert [graph.tensors[o].dtype for o in graph.outputs] == [e.dtype for e in expected]
        assert "Shape" not in {n.op for n in graph.nodes}, "shape arithmetic should be folded away"


def test_batchnorm_exported_in_training_mode():
    torch.manual_seed(0)
    model = export(SmallCNN(), (torch.randn(2, 3, 16, 16),), ["x"], {"x": {0: "batch"}}, training=True)
    graph = planner.load(model, {"x": (5, 3, 16, 16)})
    bn = next(n for n in graph.nodes if n.op == "BatchNormalization")
    assert bn.attrs.get("training_mode") == 1
    assert [graph.tensors[o].shape for o in bn.outputs if o] == [(5, 8, 16, 16), (8,), (8,)]
