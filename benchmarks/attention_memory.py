"""Transient memory against sequence length, with and without the attention fusion pass.

    python benchmarks/attention_memory.py [--models gpt2_small bert_base llama] [--seqs 128 512 1024 2048 4096]
                                          [--plot docs/attention_memory.png]

Plans only (inference, batch 1, bestfit): MiB of the arena less params and pooled workspace, for the
zoo's gpt2_small and bert_base built with enough positions for the longest sequence, and `llama`: a LLaMA
(transformers' LlamaForCausalLM from a config: hidden 512, 4 layers, 8 heads over 2 kv heads, vocabulary
32000, default sdpa attention, random weights) exported once by torch.onnx's dynamo exporter with a dynamic
sequence, its causal mask built from position comparisons when running; that row needs torch, transformers
and onnxscript, and is left out with a note without them. The issue's target:
from 128 to 4,096 the fused plan grows at most x40 (linear is x32); the exported form grows with the square.
--plot draws the same figures on log-log axes (it needs matplotlib: `pip install matplotlib`).
"""
import argparse
import tempfile
import warnings

import planner
from frontends import zoo

MiB = 2 ** 20


def transient(plan):
    return plan.arena_bytes - sum(plan.breakdown.get(f, 0) for f in ("params", "workspace"))


def llama_export(path, max_seq):
    """Export the LLaMA of the docstring to `path` with a dynamic sequence; False (and a note) without torch,
    transformers or onnxscript."""
    try:
        import onnxscript  # noqa: F401  (the dynamo exporter needs it)
        import torch
        import transformers
    except ImportError as e:
        print(f"llama: left out ({e.name} is not installed)")
        return False
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                                      num_key_value_heads=2, intermediate_size=1376, max_position_embeddings=max_seq,
                                      use_cache=False)
    torch.manual_seed(0)
    lm = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros((1, 128), dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(lm, (ids,), path, input_names=["input_ids"], output_names=["logits"], dynamo=True,
                          dynamic_shapes={"input_ids": {1: torch.export.Dim("seq", min=2, max=max_seq)}})
    return True


def shapes_of(name, seq):
    return {"input_ids": (1, seq), **({"attention_mask": (1, seq)} if name == "bert_base" else {})}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2_small", "bert_base", "llama"],
                        choices=["gpt2_small", "bert_base", "llama"])
    parser.add_argument("--seqs", nargs="+", type=int, default=[128, 512, 1024, 2048, 4096])
    parser.add_argument("--plot", metavar="PNG", help="also draw the figures into this picture")
    args = parser.parse_args()
    figures = {}
    print(f"{'model':<11} {'seq':>6} {'fused MiB':>10} {'x':>7} {'exported MiB':>13} {'x':>7} {'fused':>6}")
    tmp = tempfile.TemporaryDirectory()
    for name in args.models:
        if name == "llama":
            model = f"{tmp.name}/llama.onnx"
            if not llama_export(model, max(args.seqs)):
                continue
        else:
            model = zoo.build(name, max_positions=max(args.seqs))
        first = {}
        for seq in args.seqs:
            plans = {fuse: planner.compile(model, shapes_of(name, seq), fuse_attention=fuse) for fuse in (True, False)}
            row = []
            for fuse, plan in plans.items():
                first.setdefault(fuse, transient(plan))
                row += [transient(plan) / MiB, transient(plan) / first[fuse]]
                figures.setdefault((name, fuse), []).append(transient(plan) / MiB)
            print(f"{name:<11} {seq:>6} {row[0]:>10.1f} {row[1]:>7.1f} {row[2]:>13.1f} {row[3]:>7.1f} "
                  f"{plans[True].stats['fused_attention']:>6}")

    if args.plot:
        plot(figures, args.seqs, args.plot)


def plot(figures, seqs, path):
    """MiB against sequence length, one line per model and form, on log-log axes where linear growth is a
    slope of 1 and quadratic a slope of 2."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.4, 4.2))
    colours = {}
    for (name, fuse), mib in figures.items():
        colours.setdefault(name, f"C{len(colours)}")
        axes.plot(seqs, mib, marker="o", linestyle="-" if fuse else "--", color=colours[name],
                  label=f"{name}, {'fused attention' if fuse else 'as exported'}")
    axes.set(xscale="log", yscale="log", xlabel="sequence length (batch 1)", ylabel="transient memory (MiB)",
             title="Inference plans: activations and scratch, without params")
    axes.set_xticks(seqs, [str(s) for s in seqs], minor=False)
    axes.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
