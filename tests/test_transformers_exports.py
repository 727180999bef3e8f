"""Tiny transformers models built from configs (no downloads), exported by torch.onnx with each exporter
that exports them, planned and run with poison on against onnxruntime: what a user's first export meets.
(The TorchScript exporter stops at aten::diff in LLaMA, Mistral and GPT-2's mask building; the dynamo
one cannot decompose T5's relative position buckets: those pairs are left out, as torch.onnx fails.)"""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
from exports import Output, runs_like_onnxruntime  # noqa: E402  (needs torch)

pytestmark = pytest.mark.torch
BATCH, SEQ, VOCAB = 2, 8, 64
LAYERS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def _ids(batch=BATCH, seq=SEQ):
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def _pixels(size=32):
    return torch.randn(BATCH, 3, size, size, generator=torch.Generator().manual_seed(1))


def t5():
    """T5's relative position buckets export GreaterOrEqual, Min, Log and Abs over shapes and constants."""
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    return Output(transformers.T5EncoderModel(config), ["input_ids"], "last_hidden_state"), dict(input_ids=_ids())


def qwen2():
    """transformers' default attention (sdpa), whose mask the dynamo export builds with IsNaN and Where."""
    config = transformers.Qwen2Config(vocab_size=VOCAB, **LAYERS, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    return Output(transformers.Qwen2ForCausalLM(config), ["input_ids"], "logits", use_cache=False), dict(input_ids=_ids())


def mistral():
    config = transformers.MistralConfig(vocab_size=VOCAB, **LAYERS, num_key_value_heads=2, max_position_embeddings=64,
                                        use_cache=False)
    return Output(transformers.MistralForCausalLM(config), ["input_ids"], "logits", use_cache=False), dict(input_ids=_ids())


def gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, use_cache=False)
    return Output(transformers.GPT2LMHeadModel(config), ["input_ids"], "logits", use_cache=False), dict(input_ids=_ids())


def bert():
    config = transformers.BertConfig(vocab_size=VOCAB, **LAYERS, max_position_embeddings=32)
    return Output(transformers.BertModel(config), ["input_ids"], "last_hidden_state"), dict(input_ids=_ids())


def whisper():
    """Whisper's convolutional front end, encoder and decoder with sdpa attention."""
    config = transformers.WhisperConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                        decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16,
                                        max_target_positions=16, decoder_start_token_id=0, pad_token_id=0,
                                        bos_token_id=0, eos_token_id=0)
    model = Output(transformers.WhisperForConditionalGeneration(config), ["input_features", "decoder_input_ids"],
                   "logits", use_cache=False)
    features = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(0))
    return model, dict(input_features=features, decoder_input_ids=_ids()[:1, :4])


def vit():
    config = transformers.ViTConfig(**LAYERS, image_size=32, patch_size=8)
    return Output(transformers.ViTModel(config), ["pixel_values"], "last_hidden_state"), dict(pixel_values=_pixels())


def clip():
    """CLIP's text and vision towers and their similarity logits."""
    config = transformers.CLIPConfig(text_config=dict(vocab_size=VOCAB, **LAYERS, max_position_embeddings=16),
                                     vision_config=dict(**LAYERS, image_size=32, patch_size=8))
    return (Output(transformers.CLIPModel(config), ["input_ids", "pixel_values"], "logits_per_image"),
            dict(input_ids=_ids(), pixel_values=_pixels()))


CASES = [(t5, False), (qwen2, True), (mistral, True), (gpt2, True), (bert, False), (bert, True), (whisper, True),
         (vit, False), (vit, True), (clip, False), (clip, True)]


@pytest.mark.parametrize("build, dynamo", CASES, ids=[f"{b.__name__}-{'dynamo' if d else 'torchscript'}" for b, d in CASES])
def test_export_runs_like_onnxruntime(build, dynamo, backend, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model, inputs = build()
    plan = runs_like_onnxruntime(model, tmp_path / "model.onnx", dynamo, backend, **inputs)
    assert plan.stats["fused_attention"] > 0, "the attention fusion pass found no attention"
