"""Every attention layer of transformers' architectures whose forms the attention fusion once missed, exported
from tiny configs (no downloads) by each exporter that exports them: BLOOM (ALiBi; 3-D batched scores reshaped
to 4-D around the mask), Falcon (one K/V head for all query heads), Gemma 2 (soft-capped scores, a sliding
window), DeBERTa-v2 (relative-position terms added to the scores), and GPT-2 exported in training mode with
dropout on the attention probabilities. Each: every layer fused, outputs equal to onnxruntime's, memplan's
training equal to PyTorch's (the dropout: to memplan's unfused step, which draws the same masks), and the
transient memory growing with the sequence, not with its square."""
import warnings

import numpy as np
import onnx
import pytest

import planner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
from exports import Output, folded_buffers, runs_like_onnxruntime, stored_params, trains_like_pytorch  # noqa: E402
from executor import Executor  # noqa: E402

pytestmark = pytest.mark.torch
VOCAB, T = 64, transformers


def bloom(seq):
    return T.BloomForCausalLM(T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4,
                                            initializer_range=0.2, use_cache=False, tie_word_embeddings=False))


def falcon(seq):
    return T.FalconForCausalLM(T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              multi_query=True, initializer_range=0.2, use_cache=False, tie_word_embeddings=False,
                                              max_position_embeddings=max(seq, 64)))


def gemma2(seq):
    """Soft-capped scores; layer 0 sees a sliding window of 4 keys, layer 1 all of them."""
    return T.Gemma2ForCausalLM(T.Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
                                              max_position_embeddings=max(seq, 64), initializer_range=0.2,
                                              use_cache=False, tie_word_embeddings=False))


def deberta(seq):
    return T.DebertaV2ForMaskedLM(T.DebertaV2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                    num_hidden_layers=2, num_attention_heads=4, relative_attention=True,
                                                    position_buckets=16, pos_att_type=["p2c", "c2p"],
                                                    max_position_embeddings=max(seq, 64), hidden_dropout_prob=0.0,
                                                    attention_probs_dropout_prob=0.0, initializer_range=0.2,
                                                    tie_word_embeddings=False))


EXPORTERS = [(bloom, False), (bloom, True), (falcon, True), (gemma2, True), (deberta, False), (deberta, True)]
"""(architecture, dynamo): the TorchScript exporter stops at aten::diff in Falcon's and Gemma 2's mask building."""


def model(build, seq):
    """The LM's logits as the one output, its parameters nudged apart (the dynamo exporter merges equal ones)."""
    torch.manual_seed(0)
    module = Output(build(seq), ["input_ids"], "logits", **({} if build is deberta else {"use_cache": False})).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return module


def ids(batch, seq, seed=0):
    """Token ids, none the padding token 0 (whose embedding PyTorch does not train, as the export cannot say)."""
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def fused_everywhere(plan, layers=2):
    assert plan.stats["fused_attention"] == layers
    assert not any(s.op == "Softmax" for s in plan.steps)


@pytest.mark.parametrize("build, dynamo", EXPORTERS, ids=[f"{b.__name__}-{'dynamo' if d else 'torchscript'}"
                                                          for b, d in EXPORTERS])
def test_every_layer_fuses_and_runs_like_onnxruntime(build, dynamo, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
    plan = runs_like_onnxruntime(model(build, 8), tmp_path / "model.onnx", dynamo, input_ids=ids(2, 8))
    fused_everywhere(plan)
    forms = [s.attrs for s in plan.steps if s.op == "ScaledDotProductAttention"]
    if build is gemma2:
        assert [f["window"] for f in forms] == [4, 0] and all(f["softcap"] == 50.0 for f in forms)
    if build is falcon:
        assert all(plan.tensors[s.inputs[1]].shape[1] == 1 for s in plan.steps if s.op == "ScaledDotProductAttention")


def export(module, seq, path, dynamo=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids(2, seq),), str(path), input_names=["input_ids"], output_names=["logits"],
                          dynamo=dynamo, **({} if dynamo else {"opset_version": 17}))
    return path


@pytest.mark.parametrize("build", [bloom, falcon, gemma2, deberta])
def test_training_matches_pytorch(build, tmp_path):
    pytest.importorskip("onnxscript")
    module = model(build, 8)
    plan = trains_like_pytorch(module, export(module, 8, tmp_path / "model.onnx"), ids(2, 8, 1).numpy(), VOCAB)
    fused_everywhere(plan)
    assert sum(s.op == "ScaledDotProductAttentionGrad" for s in plan.steps) == 2


def transient(plan):
    return plan.arena_bytes - sum(plan.breakdown.get(f, 0) for f in ("params", "workspace"))


@pytest.mark.parametrize("build, dynamo", EXPORTERS, ids=[f"{b.__name__}-{'dynamo' if d else 'torchscript'}"
                                                          for b, d in EXPORTERS])
def test_memory_grows_with_the_sequence_not_its_square(build, dynamo, tmp_path):
    """Sequence 32 to 256 (x8): the transient arena at most x10, where the (B, H, S, S) scores would make it x64."""
    if dynamo:
        pytest.importorskip("onnxscript")
    plans = []
    for seq in (32, 256):
        path = export(model(build, seq), seq, tmp_path / f"model{seq}.onnx", dynamo)
        plans.append(planner.compile(str(path), {"input_ids": (2, seq)}))
        fused_everywhere(plans[-1])
    assert transient(plans[1]) <= 10 * transient(plans[0]), [transient(p) for p in plans]


def test_gpt2_exported_in_training_mode_fuses_its_attention_dropout(tmp_path):
    """GPT-2's eager attention in training mode: Dropout between Softmax and the product with V. The fused step
    draws memplan.Dropout's masks (the same seeds given to both), so that three SGD steps give the unfused
    step's losses."""
    pytest.importorskip("onnxscript")
    config = T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, attn_pdrop=0.25,
                          resid_pdrop=0.0, embd_pdrop=0.0, use_cache=False, attn_implementation="eager",
                          tie_word_embeddings=False)
    torch.manual_seed(0)
    module = Output(T.GPT2LMHeadModel(config), ["input_ids"], "logits", use_cache=False).train()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.02 * torch.randn_like(p))
    path = export(module, 8, tmp_path / "gpt2.onnx")
    exported = onnx.load(str(path))
    for k, node in enumerate(n for n in exported.graph.node if n.op_type == "Dropout"):
        node.attribute.append(onnx.helper.make_attribute("seed", k))  # the same masks, fused or not
    onnx.save(exported, str(path))
    frozen = folded_buffers(path, stored_params(module, exported))
    feeds = ids(2, 8, 1).numpy()
    labels = np.concatenate([feeds[:, 1:], np.full((2, 1), -100)], axis=1)
    losses = []
    for fuse in (True, False):
        plan = planner.compile(str(path), {"input_ids": (2, 8)}, training=True, loss="cross_entropy", optimizer="sgd",
                               frozen=frozen, fuse_attention=fuse)
        assert plan.stats["fused_attention"] == (2 if fuse else 0)
        ex = Executor(plan, backend="numpy", poison=True)
        losses.append([ex.train_step({"input_ids": feeds, "labels": labels}) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
