"""Every attention layer of 18 transformers architectures, fused or not, and their memory against the sequence.

    python benchmarks/attention_archs.py [--archs bloom falcon ...] [--exporters torchscript dynamo]
                                         [--seqs 128 4096]

Each architecture from a tiny config (random weights, no downloads: 2 layers of width 32 unless said), exported
by torch.onnx at batch 1 with each exporter that exports it (the TorchScript exporter stops at aten::diff in
the mask building of most decoders; Mixtral and Qwen2-MoE export with transformers' batched_mm experts). At the
first sequence: the attention layers fused (plan.stats["fused_attention"]) against the model's, and the largest
difference from onnxruntime. At both: the transient arena (MiB of the arena less params and pooled workspace,
inference, bestfit) and its growth (linear in the sequence is x32 from 128 to 4,096; the (S, S) scores grow
x1024). The vision models (MobileViT, SegFormer) have no sequence to stretch: their growth is left out.
Needs torch, transformers, onnxscript and onnxruntime.
"""
import argparse
import contextlib
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

import planner
from executor import Executor

MiB = 2 ** 20
VOCAB = 64


def _archs():
    """{name: (build(seq) -> (module, inputs), attention layers)}."""
    import torch
    import transformers as T
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)

    class Output(torch.nn.Module):
        def __init__(self, model, names, field, **fixed):
            super().__init__()
            self.model, self.names, self.field, self.fixed = model, names, field, fixed

        def forward(self, *inputs):
            return getattr(self.model(**dict(zip(self.names, inputs)), **self.fixed), self.field)

    def ids(seq):
        return torch.randint(0, VOCAB, (1, seq), generator=torch.Generator().manual_seed(0))

    def lm(cls, config_cls, **config):
        def build(seq):
            cfg = config_cls(vocab_size=VOCAB, use_cache=False, **config, **_positions(config_cls, seq))
            return Output(cls(cfg), ["input_ids"], "logits", use_cache=False), {"input_ids": ids(seq)}
        return build

    def encoder(cls, config_cls, **config):
        def build(seq):
            cfg = config_cls(vocab_size=VOCAB, **config, **_positions(config_cls, seq + 2))
            return Output(cls(cfg), ["input_ids"], "last_hidden_state"), {"input_ids": ids(seq)}
        return build

    def bart(seq):
        cfg = T.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_position_embeddings=max(seq, 64), use_cache=False)
        return (Output(T.BartModel(cfg), ["input_ids", "decoder_input_ids"], "last_hidden_state", use_cache=False),
                {"input_ids": ids(seq), "decoder_input_ids": ids(seq)})

    def vision(cls, config, size=32):
        def build(seq):
            pixels = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
            return Output(cls(config), ["pixel_values"], "last_hidden_state"), {"pixel_values": pixels}
        return build

    moe = dict(experts_implementation="batched_mm", num_experts_per_tok=2)
    return {
        "phi3": (lm(T.Phi3ForCausalLM, T.Phi3Config, **layers, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                    eos_token_id=2), 2),
        "gemma2": (lm(T.Gemma2ForCausalLM, T.Gemma2Config, **layers, num_key_value_heads=2, head_dim=8,
                      sliding_window=64), 2),
        "gpt_neox": (lm(T.GPTNeoXForCausalLM, T.GPTNeoXConfig, **layers), 2),
        "falcon": (lm(T.FalconForCausalLM, T.FalconConfig, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      multi_query=True), 2),
        "opt": (lm(T.OPTForCausalLM, T.OPTConfig, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                   num_attention_heads=4, word_embed_proj_dim=32), 2),
        "bloom": (lm(T.BloomForCausalLM, T.BloomConfig, hidden_size=32, n_layer=2, n_head=4), 2),
        "bart": (bart, 6),
        "distilbert": (encoder(T.DistilBertModel, T.DistilBertConfig, dim=32, hidden_dim=64, n_layers=2, n_heads=4), 2),
        "roberta": (encoder(T.RobertaModel, T.RobertaConfig, **layers), 2),
        "deberta_v2": (encoder(T.DebertaV2Model, T.DebertaV2Config, **layers, relative_attention=True,
                               position_buckets=16, pos_att_type=["p2c", "c2p"]), 2),
        "electra": (encoder(T.ElectraModel, T.ElectraConfig, embedding_size=32, **layers), 2),
        "mobilevit": (vision(T.MobileViTModel, T.MobileViTConfig(image_size=32, patch_size=2, hidden_sizes=[16, 24, 32],
                                                                 neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                                                                 num_attention_heads=2)), 9),
        "segformer": (vision(T.SegformerModel, T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                                 hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                                 patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
                      2),
        "stablelm": (lm(T.StableLmForCausalLM, T.StableLmConfig, **layers, num_key_value_heads=2), 2),
        "olmo": (lm(T.OlmoForCausalLM, T.OlmoConfig, **layers, num_key_value_heads=2, pad_token_id=0), 2),
        "granite": (lm(T.GraniteForCausalLM, T.GraniteConfig, **layers, num_key_value_heads=2), 2),
        "mixtral": (lm(T.MixtralForCausalLM, T.MixtralConfig, **layers, num_key_value_heads=2, num_local_experts=4, **moe),
                    2),
        "qwen2_moe": (lm(T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig, **layers, num_key_value_heads=2, num_experts=4,
                         moe_intermediate_size=32, shared_expert_intermediate_size=32, **moe), 2),
    }


def _positions(config_cls, seq):
    """max_position_embeddings for configs that have it, at least seq."""
    return {"max_position_embeddings": max(seq, 64)} if "max_position_embeddings" in config_cls().to_dict() else {}


@contextlib.contextmanager
def quiet():
    """Standard output and error to /dev/null at the descriptors: the exporters' progress lines and graph dumps
    (TorchScript's comes from C++)."""
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        try:
            for fd in (1, 2):
                os.dup2(null.fileno(), fd)
            yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def export(build, seq, path, dynamo):
    """(inputs, None) of the model exported to `path`, or (None, the exporter's error)."""
    import torch
    torch.manual_seed(0)
    module, inputs = build(seq)
    try:
        with warnings.catch_warnings(), quiet():
            warnings.simplefilter("ignore")
            torch.onnx.export(module.eval(), tuple(inputs.values()), str(path), input_names=list(inputs),
                              output_names=["out"], dynamo=dynamo, **({} if dynamo else {"opset_version": 17}))
    except Exception as e:  # noqa: BLE001  (each exporter fails in its own way; the row says so)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
    return {k: v.numpy() for k, v in inputs.items()}, None


def transient(plan):
    return plan.arena_bytes - sum(plan.breakdown.get(f, 0) for f in ("params", "workspace"))


def measure(name, build, layers, dynamo, seqs, folder):
    """One row: exporter, fused/layers, max |memplan - onnxruntime|, transients and growth (or the failure)."""
    import onnxruntime as ort
    row = {"arch": name, "exporter": "dynamo" if dynamo else "torchscript"}
    short = Path(folder) / f"{name}-{row['exporter']}-short.onnx"
    feeds, failed = export(build, seqs[0], short, dynamo)
    if failed:
        return {**row, "failed": failed}
    plan = planner.compile(str(short), {k: v.shape for k, v in feeds.items()})
    got = Executor(plan, backend="numpy").run(feeds)["out"]
    want = ort.InferenceSession(str(short), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    row.update(fused=plan.stats["fused_attention"], layers=layers, error=float(np.max(np.abs(got - want))),
               transients=[transient(plan)])
    if name in ("mobilevit", "segformer"):
        return row
    for seq in seqs[1:]:
        path = Path(folder) / f"{name}-{row['exporter']}-{seq}.onnx"
        feeds, failed = export(build, seq, path, dynamo)
        if failed:
            return {**row, "failed": f"at {seq}: {failed}"}
        row["transients"].append(transient(planner.compile(str(path), {k: v.shape for k, v in feeds.items()})))
        path.unlink()
        Path(f"{path}.data").unlink(missing_ok=True)
    return row


def main():
    archs = _archs()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=list(archs), choices=list(archs))
    parser.add_argument("--exporters", nargs="+", default=["torchscript", "dynamo"], choices=["torchscript", "dynamo"])
    parser.add_argument("--seqs", nargs="+", type=int, default=[128, 4096])
    args = parser.parse_args()
    print(f"| architecture | exporter | fused / layers | max abs error | transient at {args.seqs[0]} | "
          f"at {args.seqs[-1]} | growth |")
    print("|---|---|---|---|---|---|---|")
    fused = total = 0
    with tempfile.TemporaryDirectory() as folder:
        for name in args.archs:
            build, layers = archs[name]
            for exporter in args.exporters:
                row = measure(name, build, layers, exporter == "dynamo", args.seqs, folder)
                if "failed" in row and "fused" not in row:
                    print(f"| {name} | {row['exporter']} | does not export ({row['failed']}) | | | | |")
                    continue
                fused, total = fused + row["fused"], total + row["layers"]
                sizes = row["transients"]
                long = f"{sizes[-1] / MiB:.2f} MiB" if len(sizes) > 1 else row.get("failed", "—")
                growth = f"x{sizes[-1] / sizes[0]:.1f}" if len(sizes) > 1 else "—"
                print(f"| {name} | {row['exporter']} | {row['fused']} / {row['layers']} | {row['error']:.1e} | "
                      f"{sizes[0] / MiB:.3f} MiB | {long} | {growth} |", flush=True)
    print(f"\n{fused} of {total} attention layers fused.")


if __name__ == "__main__":
    main()
