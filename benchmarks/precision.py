"""Arenas by precision: inference plans of the full-size zoo models in fp32, fp16, bf16 and under
autocast, and a training step of resnet50 whose transient memory (the arena less params, optimizer
state and pooled workspace) is compared across precisions.

    python benchmarks/precision.py [--batch 1] [--train-batch 32] [--models resnet50 ...]

Plans only (no run): the arena is what the precision changes. The issue's targets: fp16/bf16 inference
arenas <= 0.55x fp32; amp-bf16 training transient memory <= 0.6x fp32 (resnet50, batch 32).
"""
import argparse

import planner
from frontends import zoo
from planner.precision import PRECISIONS

MiB = 2 ** 20
PERSISTENT = ("params", "optimizer", "workspace")


def shapes_of(name, batch, seq=128):
    if name in ("bert_base", "gpt2_small"):
        return {"input_ids": (batch, seq), **({"attention_mask": (batch, seq)} if name == "bert_base" else {})}
    return {"input": (batch, 3, 256 if name == "unet" else 224, 256 if name == "unet" else 224)}


def transient(plan):
    """The arena less what persists across steps (params, optimizer state, pooled workspace)."""
    return plan.arena_bytes - sum(plan.breakdown.get(f, 0) for f in PERSISTENT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2", "densenet121", "vgg16", "unet",
                                                         "bert_base", "gpt2_small"])
    args = parser.parse_args()
    print(f"inference, batch {args.batch}: bestfit arena (MiB), and x fp32")
    print(f"{'model':<14}" + "".join(f" {p:>18}" for p in PRECISIONS))
    for name in args.models:
        model = zoo.build(name)
        plans = {p: planner.compile(model, shapes_of(name, args.batch), precision=p, inverted_residual=False)
                 for p in PRECISIONS}  # the fusion takes float32 only: off, so that the columns compare
        fp32 = plans["fp32"].arena_bytes
        print(f"{name:<14}" + "".join(f" {plans[p].arena_bytes / MiB:>9.1f} ({plans[p].arena_bytes / fp32:.3f})"
                                      for p in PRECISIONS))
    print(f"\nresnet50 training step (sgd), batch {args.train_batch}: arena and transient memory (MiB), x fp32")
    model = zoo.build("resnet50")
    plans = {p: planner.compile(model, shapes_of("resnet50", args.train_batch), training=True, precision=p)
             for p in PRECISIONS}
    base = transient(plans["fp32"])
    print(f"{'precision':<10} {'arena':>10} {'transient':>10} {'x fp32':>7}")
    for p, plan in plans.items():
        print(f"{p:<10} {plan.arena_bytes / MiB:>10.1f} {transient(plan) / MiB:>10.1f} {transient(plan) / base:>7.3f}")


if __name__ == "__main__":
    main()
