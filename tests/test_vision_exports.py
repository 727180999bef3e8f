"""torchvision and timm models built without weights (no downloads), exported by both torch.onnx exporters,
planned and run with poison on against onnxruntime."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
from exports import runs_like_onnxruntime  # noqa: E402  (needs torch)

pytestmark = pytest.mark.torch


def torchvision(name):
    return lambda: getattr(pytest.importorskip("torchvision").models, name)(weights=None)


def timm(name, **kwargs):
    return lambda: pytest.importorskip("timm").create_model(name, pretrained=False, **kwargs)


MODELS = {"resnet18": torchvision("resnet18"), "mobilenet_v3_small": torchvision("mobilenet_v3_small"),
          "shufflenet_v2": torchvision("shufflenet_v2_x0_5"), "timm_convnext_atto": timm("convnext_atto"),
          "timm_vit_tiny": timm("vit_tiny_patch16_224", img_size=64), "timm_mobilevit_xxs": timm("mobilevit_xxs")}


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(MODELS))
def test_export_runs_like_onnxruntime(name, dynamo, backend, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = MODELS[name]()
    image = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    runs_like_onnxruntime(model, tmp_path / "model.onnx", dynamo, backend, image=image)
