"""Tiny transformers models built from configs (no downloads), exported by torch.onnx, planned and run
with poison on against onnxruntime: what a user's first export meets."""
import warnings

import numpy as np
import pytest

import planner
from executor import Executor

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.torch
BATCH, SEQ, VOCAB = 2, 8, 64


class Output(torch.nn.Module):
    """One output (`field`) of a transformers model called with its inputs by name (and `fixed` keywords),
    so that the export takes plain tensors."""

    def __init__(self, model, names, field, **fixed):
        super().__init__()
        self.model, self.names, self.field, self.fixed = model, names, field, fixed

    def forward(self, *inputs):
        return getattr(self.model(**dict(zip(self.names, inputs)), **self.fixed), self.field)


def _ids():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def _runs_like_onnxruntime(module, path, dynamo, **inputs):
    """Export `module` on `inputs` (default: token ids), plan the file and run it with poison on."""
    inputs = inputs or {"input_ids": _ids()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), tuple(inputs.values()), str(path), input_names=list(inputs),
                          output_names=["out"], dynamo=dynamo, **({} if dynamo else {"opset_version": 17}))
    feeds = {name: value.numpy() for name, value in inputs.items()}
    plan = planner.compile(str(path), {name: value.shape for name, value in feeds.items()})
    got = Executor(plan, backend="numpy", poison=True).run(feeds)["out"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, session.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_t5_encoder_by_the_torchscript_exporter(tmp_path):
    """T5's relative position buckets export GreaterOrEqual, Min, Log and Abs over shapes and constants."""
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    torch.manual_seed(0)
    encoder = Output(transformers.T5EncoderModel(config), ["input_ids"], "last_hidden_state")
    _runs_like_onnxruntime(encoder, tmp_path / "t5.onnx", dynamo=False)


def test_qwen2_with_sdpa_attention_by_the_dynamo_exporter(tmp_path):
    """transformers' default attention (sdpa), whose mask the dynamo export builds with IsNaN and Where."""
    pytest.importorskip("onnxscript")
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                                      use_cache=False)
    torch.manual_seed(0)
    language_model = Output(transformers.Qwen2ForCausalLM(config), ["input_ids"], "logits", use_cache=False)
    _runs_like_onnxruntime(language_model, tmp_path / "qwen2.onnx", dynamo=True)


def test_whisper_by_the_dynamo_exporter(tmp_path):
    """Whisper's convolutional front end, encoder and decoder with sdpa attention."""
    pytest.importorskip("onnxscript")
    config = transformers.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                        max_target_positions=16, decoder_start_token_id=0, pad_token_id=0,
                                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(0))
    whisper = Output(transformers.WhisperForConditionalGeneration(config), ["input_features", "decoder_input_ids"],
                     "logits", use_cache=False)
    _runs_like_onnxruntime(whisper, tmp_path / "whisper.onnx",
                           dynamo=True, input_features=features, decoder_input_ids=_ids()[:1, :4])
