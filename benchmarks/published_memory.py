"""memplan's planned memory against the published counts of LLM training memory (../shared/REFERENCE.md, section 9).

    python benchmarks/published_memory.py [--part activations states estimators] [--configs small gpt-22b ...]

activations: the bytes a transformer layer keeps for its backward pass, against Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", 16-bit, s sequence, b microbatch, h hidden,
a heads, t tensor-parallel ranks): sbh(34 + 5as/h) with no parallelism or recomputation, sbh(10 + 24/t +
5as/(ht)) with tensor parallelism, (sbh/t)(34 + 5as/h) with sequence parallelism too, 34sbh/t with selective
recomputation, 2sbh with full recomputation. memplan's figure: the forward values a rank's plan keeps for
backward (planner.breakdown.peak over "saved"), of GPT-2-style models of 2 layers less those of 1 layer, built
from their configs without weights (frontends/hf_config.py; train mode: dropout after attention, the MLP and in
the probabilities, as Megatron's layer has it), at fp16 (--precision) with the norm and activation fusions on
and attention unfused (the form the formulas count); the fused-attention rows give memplan's default form and say what it keeps
instead of the scores. Their GPT configurations (Table 3): 22B, 175B, 530B and 1T at s = 2048, t = 8.

states: a rank's model states (params, gradients and optimizer state) under amp-bf16 Adam and ZeRO 0-3 over dp
ranks against the ZeRO paper's count (Rajbhandari et al. 2020: 2 + 2 + 12 = 16 bytes a parameter, the 12 divided
by dp at stage 1, the 2 + 12 at stage 2, all 16 at stage 3), and what each side holds that the other does not.

estimators: DeepSpeed's estimate_zero3_model_states_mem_needs and accelerate's estimate-memory, as their code
computes them, beside memplan's whole arena for the same model and layout: what each leaves out.
"""
import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

import planner
from planner.breakdown import peak
from planner.parallel import Whole, model_states

GPT = {  # name: (h, a, s): Korthikanti et al.'s Table 3 at s = 2048, and two small ones measured from outside
    "small-512": (1024, 16, 512),
    "small-1024": (1024, 16, 1024),
    "gpt-22b": (6144, 64, 2048),
    "gpt-175b": (12288, 96, 2048),
    "gpt-530b": (20480, 128, 2048),
    "gpt-1t": (25600, 160, 2048),
}
TP = 8
LAYOUTS = {  # name: (tensor-parallel ranks, sequence parallel, remat, fuse_attention)
    "none": (1, False, None, False),
    "tp": (TP, False, None, False),
    "tp+sp": (TP, True, None, False),
    "selective": (1, False, "selective", False),
    "tp+sp selective": (TP, True, "selective", False),
    "full": (1, False, "full", False),
    "fused attention": (1, False, None, True),
    "tp+sp fused": (TP, True, None, True),
}


def formula(layout, h, a, s, b=1):
    """Korthikanti et al.'s bytes per layer of `layout` (None where the paper gives none)."""
    t = LAYOUTS[layout][0]
    return {"none": s * b * h * (34 + 5 * a * s / h), "tp": s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
            "tp+sp": s * b * h / t * (34 + 5 * a * s / h), "selective": 34 * s * b * h,
            "tp+sp selective": 34 * s * b * h / t,
            "full": 2 * s * b * h}.get(layout)


def config(directory, h, a, s, layers):
    """The path of a GPT-2 config of these sizes (a vocabulary of 128: the layers are what is measured)."""
    path = Path(directory) / f"gpt2-{h}-{a}-{s}-{layers}.json"
    path.write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": h, "n_head": a,
                                "n_layer": layers, "n_positions": s, "vocab_size": 128}))
    return str(path)


def saved(path, s, layout, precision):
    """The bytes the rank's training step keeps for backward at its fullest (batch 1)."""
    tp, sp, remat, fused = LAYOUTS[layout]
    parallel = planner.Parallel(tp=tp, sequence_parallel=True) if sp else planner.Parallel(tp=tp) if tp > 1 else None
    plan = planner.compile(path, {"input_ids": (1, s)}, training=True, precision=precision, strategy="bestfit",
                           schedule="file", fuse_attention=fused, remat=remat, parallel=parallel)
    return peak(plan, ("saved",))[0]


def activations(names, layouts, directory, precision):
    print(f"activation bytes per layer, {precision}, batch 1: memplan (2 layers less 1) against Korthikanti et al. "
          "(16-bit)")
    print(f"{'config':<11} {'h':>6} {'a':>4} {'s':>5} {'layout':<16} {'memplan':>15} {'paper':>15} {'memplan/sbh':>11} "
          f"{'paper/sbh':>9}")
    for name in names:
        h, a, s = GPT[name]
        for layout in layouts:
            try:
                per_layer = saved(config(directory, h, a, s, 2), s, layout, precision) - saved(
                    config(directory, h, a, s, 1), s, layout, precision)
            except planner.MemplanError as e:
                print(f"{name:<11} {h:>6} {a:>4} {s:>5} {layout:<16} {e}")
                continue
            paper = formula(layout, h, a, s)
            sbh = s * h
            print(f"{name:<11} {h:>6} {a:>4} {s:>5} {layout:<16} {per_layer:>15,} "
                  f"{'-' if paper is None else f'{paper:,.0f}':>15} {per_layer / sbh:>11.4f} "
                  f"{'-' if paper is None else f'{paper / sbh:.4f}':>9}", flush=True)


def states(model, seq, dp):
    """memplan's model states of one of `dp` data-parallel ranks at each ZeRO stage against the ZeRO paper's 16 bytes a
    parameter for mixed-precision Adam."""
    print(f"\nmodel states of one of {dp} ranks, amp-bf16 AdamW, batch 1 x {seq} tokens: memplan (persistent params "
          "and optimizer state, gradients at the fullest step) against the ZeRO paper's count (2 + 2 + 12 bytes a "
          "parameter)")
    print(f"{'model':<14} {'ZeRO':>4} {'params':>11} {'optimizer':>11} {'gradients':>11} {'memplan':>11} "
          f"{'paper':>11} {'paper states':<34}")
    for zero in (0, 1, 2, 3):
        plan = _step(model, seq, planner.Parallel(dp=dp, zero=zero))
        values = sum(_whole_size(plan, name) for name in plan.training["params"])
        paper = model_states(values, 2, 12, dp, zero)  # fp16 params and gradients, fp32 master, momentum, variance
        ours = sum(plan.breakdown[k] for k in ("params", "optimizer", "grads"))
        print(f"{Path(model).stem:<14} {zero:>4} {_g(plan.breakdown['params'])} {_g(plan.breakdown['optimizer'])} "
              f"{_g(plan.breakdown['grads'])} {_g(ours)} {_g(sum(paper.values()))} "
              + ", ".join(f"{k} {v / 2**30:.2f}" for k, v in paper.items()), flush=True)


def estimators(model, seq, gpus):
    """DeepSpeed's and accelerate's estimates for the model beside memplan's arena of a rank at ZeRO-2 and ZeRO-3."""
    print(f"\n{Path(model).stem} on {gpus} GPUs, batch 1 x {seq} tokens per rank, amp-bf16 AdamW: the estimators "
          "against memplan's whole arena of a rank")
    for zero in (2, 3):
        plan = _step(model, seq, planner.Parallel(dp=gpus, zero=zero))
        total = sum(_whole_size(plan, name) for name in plan.training["params"])
        largest = max(_whole_size(plan, name) for name in plan.training["params"])
        deepspeed = {2: 4 * total + 16 * total / gpus,  # estimate_zero2_model_states_mem_needs, no offload
                     3: 4 * largest + 18 * total / gpus}[zero]  # estimate_zero3_model_states_mem_needs, no offload
        transient = sum(plan.breakdown[k] for k in ("saved", "activations", "io", "workspace"))
        print(f"ZeRO-{zero}: memplan arena {_g(plan.arena_bytes)} GiB (activations, io and workspace {_g(transient)} "
              f"GiB); DeepSpeed {_g(deepspeed)} GiB (model states only)")
    print(f"accelerate estimate-memory, 'Training using Adam' (one device, no activations): float32 "
          f"{_g(16 * total)} GiB, bfloat16 {_g(8 * total)} GiB (the largest of its parts, not their sum)")


def _step(model, seq, parallel):
    return planner.compile(model, {"input_ids": (1, seq)}, training=True, optimizer="adamw", precision="amp-bf16",
                           strategy="bestfit", schedule="file", parallel=parallel)


def _whole_size(plan, name):
    """The elements of trained param `name` on one device (a ZeRO-3 shard's whole)."""
    value = plan.data[name]
    return math.prod((value.value if isinstance(value, Whole) else value).shape)


def _g(nbytes):
    return f"{nbytes / 2**30:>11.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", nargs="+", default=["activations", "states", "estimators"],
                        choices=["activations", "states", "estimators"])
    parser.add_argument("--configs", nargs="+", default=list(GPT), choices=list(GPT))
    parser.add_argument("--model", default=str(Path(__file__).parent / "configs" / "llama-3-8b.json"))
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--precision", default="fp16", help="the activations part's (the paper's counts are 16-bit)")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = parser.parse_args()
    os.environ.setdefault("MEMPLAN_CACHE", str(Path.home() / ".cache" / "memplan"))
    if "activations" in args.part:
        with tempfile.TemporaryDirectory() as directory:
            activations(args.configs, args.layouts, directory, args.precision)
    if "states" in args.part:
        states(args.model, args.seq, 8)
    if "estimators" in args.part:
        estimators(args.model, args.seq, 8)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
