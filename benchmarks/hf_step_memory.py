"""A training step of small transformers models: memplan's planned arena against PyTorch's measured live tensors
on this CPU, at the same precision (issue 46).

    python benchmarks/hf_step_memory.py [--models gpt2 gpt2-medium llama-270m bert-base] [--seq 512] [--batch 1]
                                        [--precision fp32|amp-bf16] [--update eager|after_backward]

Each model is built from a config written here, as the Hub's config.json has it (no download), in train mode
with the config's dropout: one training step of --batch x --seq token ids, cross-entropy of the (batch, seq,
vocab) logits against labels of the same positions (no shift), AdamW.

memplan: the config exported without weights (frontends/hf_config.py, cached under $MEMPLAN_CACHE, by default
/tmp/exp/hfstep) and planned with bestfit; its arena, and the breakdown at its fullest step (planner/breakdown.py).
By default each param is updated as soon as its gradient is complete (update="eager"); after_backward updates
them after the backward pass, as PyTorch does.

PyTorch: the same transformers class from the same config, with weights, under torch.autocast("cpu",
bfloat16) for amp-bf16; `loss.backward(); opt.step()` with torch.optim.AdamW, after one warm-up step (the
optimizer state exists). Its peak: the tensors alive before the step (params, buffers, optimizer state, ids,
labels) plus the highest running sum of the allocations and frees the profiler records during it
(profile_memory; PyTorch has no CPU allocator statistics).

The columns (MiB): "memplan act" is the arena less params, grads and optimizer state as the breakdown names
them; "memplan transient" the arena less params and optimizer state alone, so that it holds the gradients alive
at the fullest step as "torch act" (the peak less the bytes alive before the step) holds those alive at
PyTorch's peak: none at the start of backward, all of them in opt.step().

Why the two differ:
- gradients: PyTorch holds every gradient until opt.step(), and AdamW's update of a param makes two temporaries
  of its size (sqrt, division); memplan's eager update frees each gradient once applied.
- attention: PyTorch has no fused CPU attention kernel with dropout, so with the config's attention dropout
  (GPT-2, BERT) SDPA takes its math path and keeps three float32 (heads, seq, seq) tensors a layer
  (probabilities, dropout noise, dropped probabilities), in float32 under autocast too; memplan's fused op keeps
  q, k, v, its output and the row statistics, and redraws its dropout mask. Without dropout (LLaMA) PyTorch's
  flash kernel keeps what memplan keeps.
- elementwise chains: GPT-2's gelu_new is a chain of PyTorch ops, each keeping its input; memplan fuses it.
- the loss: log_softmax and nll_loss hold the log-probabilities and two (seq, vocab) gradients at once;
  memplan's fused SoftmaxCrossEntropyLoss holds two (seq, vocab) tensors.
- an arena also holds its placement's free bytes; a running sum has none.
Progress goes to stderr.
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from train_memory import profiled_peak

MiB = 2 ** 20
CONFIGS = {  # name: config.json keys as the Hub writes them; GPT-2 and BERT at their published sizes
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 12, "n_embd": 768, "n_head": 12,
             "vocab_size": 50257, "n_positions": 1024},
    "gpt2-medium": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 24, "n_embd": 1024,
                    "n_head": 16, "vocab_size": 50257, "n_positions": 1024},
    "llama-270m": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
                   "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 2048,
                   "tie_word_embeddings": False},
    "bert-base": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768,
                  "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
                  "max_position_embeddings": 512, "type_vocab_size": 2},
}
STATES = ("params", "optimizer")
"""The breakdown fields that persist across steps: memplan's "transient" leaves them out, its "act" the grads too."""
START = time.perf_counter()


def log(message):
    print(f"[{time.perf_counter() - START:7.1f}s] {message}", file=sys.stderr, flush=True)


def memplan_step(path, batch, seq, precision, update):
    """memplan's plan of one training step of the config at `path`."""
    import planner
    from frontends import hf_config
    hf_config.exported(path, training=True)  # the export alone first, so that the planning's time is its own
    start = time.perf_counter()
    plan = planner.compile(path, {"input_ids": (batch, seq)}, training=True, optimizer="adamw",
                           precision=precision, strategy="bestfit", update=update)
    log(f"planned in {time.perf_counter() - start:.1f} s: arena {plan.arena_bytes / MiB:,.1f} MiB, "
        f"{plan.stats.get('fused_attention', 0)} attentions fused")
    return plan


def torch_step(path, batch, seq, precision):
    """One training step of the transformers model the config at `path` names, as a function; a function giving
    the bytes alive between steps (the gradients freed first: the profiler records no free of a block allocated
    before it started); and the model's parameter count."""
    import torch
    import transformers
    from frontends import hf_config
    config = hf_config.config_of(path)  # as the export reads it (use_cache off)
    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])._from_config(config, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters())
    ids, labels = (torch.randint(0, config.vocab_size, (batch, seq)) for _ in range(2))
    low = precision == "amp-bf16"

    def loss():
        """The loss alone: the logits are freed once it is computed (memplan's step returns the loss alone)."""
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
            logits = model(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    def resident():
        opt.zero_grad(set_to_none=True)
        tensors = [*model.parameters(), *model.buffers(), ids, labels,
                   *(v for state in opt.state.values() for v in state.values() if torch.is_tensor(v))]
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())
    return step, resident, sum(p.numel() for p in model.parameters())


def measure(name, path, args):
    """{"plan", "params", "peak", "before"} of one model: memplan's plan, and PyTorch's count and bytes."""
    log(f"{name}: memplan, one training step at {args.batch} x {args.seq}, {args.precision}, update={args.update}")
    plan = memplan_step(path, args.batch, args.seq, args.precision, args.update)
    log(f"{name}: PyTorch, a warm-up step and one profiled step")
    step, resident, params = torch_step(path, args.batch, args.seq, args.precision)
    start = time.perf_counter()
    peak, before = profiled_peak(step, resident)
    log(f"{name}: PyTorch peak {peak / MiB:,.1f} MiB ({time.perf_counter() - start:.1f} s for both steps)")
    return {"plan": plan, "params": params, "peak": peak, "before": before}


def table(results, args):
    print(f"one training step, batch {args.batch} x seq {args.seq}, AdamW, cross-entropy on the logits, "
          f"{args.precision}; memplan bestfit update={args.update}; PyTorch eager on the CPU (MiB)")
    print(f"{'model':<12} {'params':>7} {'precision':<9} {'memplan arena':>13} {'memplan act':>11} "
          f"{'memplan transient':>17} {'torch peak':>10} {'torch act':>9} {'arena/peak':>10} {'transient/act':>13}")
    for name, r in results.items():
        plan = r["plan"]
        transient = plan.arena_bytes - sum(plan.breakdown.get(k, 0) for k in STATES)
        theirs = r["peak"] - r["before"]
        print(f"{name:<12} {r['params'] / 1e6:>6.0f}M {args.precision:<9} {plan.arena_bytes / MiB:>13,.1f} "
              f"{(transient - plan.breakdown.get('grads', 0)) / MiB:>11,.1f} {transient / MiB:>17,.1f} "
              f"{r['peak'] / MiB:>10,.1f} {theirs / MiB:>9,.1f} {plan.arena_bytes / r['peak']:>10.2f} "
              f"{transient / theirs:>13.2f}")
    keys = list(dict.fromkeys(k for r in results.values() for k in r["plan"].breakdown))
    print(f"\nmemplan arena by purpose at its fullest step (MiB)\n{'':<12}" + "".join(f"{n:>13}" for n in results))
    for key in keys:
        print(f"{key:<12}" + "".join(f"{r['plan'].breakdown.get(key, 0) / MiB:>13,.1f}" for r in results.values()))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp-bf16"])
    parser.add_argument("--update", default="eager", choices=["eager", "after_backward"],
                        help="when memplan's plan updates a param: as soon as its gradient is complete, or after "
                             "the backward pass as PyTorch's loss.backward(); opt.step() does")
    args = parser.parse_args()
    os.environ.setdefault("MEMPLAN_CACHE", "/tmp/exp/hfstep")
    with tempfile.TemporaryDirectory() as directory:
        paths = {name: Path(directory) / f"{name}.json" for name in args.models}
        for name, path in paths.items():
            path.write_text(json.dumps(CONFIGS[name]))
        results = {name: measure(name, str(path), args) for name, path in paths.items()}
    table(results, args)


if __name__ == "__main__":
    main()
