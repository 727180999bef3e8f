"""Transient memory against sequence length, with and without the attention fusion pass.

    python benchmarks/attention_memory.py [--models gpt2_small bert_base] [--seqs 128 512 1024 2048 4096]

Plans only (inference, batch 1, bestfit): MiB of the arena less params and pooled workspace, for the
zoo's gpt2_small and bert_base built with enough positions for the longest sequence. The issue's target:
from 128 to 4,096 the fused plan grows at most x40 (linear is x32); the exported form grows with the square.
"""
import argparse

import planner
from frontends import zoo

MiB = 2 ** 20


def transient(plan):
    return plan.arena_bytes - sum(plan.breakdown.get(f, 0) for f in ("params", "workspace"))


def shapes_of(name, seq):
    return {"input_ids": (1, seq), **({"attention_mask": (1, seq)} if name == "bert_base" else {})}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gpt2_small", "bert_base"])
    parser.add_argument("--seqs", nargs="+", type=int, default=[128, 512, 1024, 2048, 4096])
    args = parser.parse_args()
    print(f"{'model':<11} {'seq':>6} {'fused MiB':>10} {'x':>7} {'exported MiB':>13} {'x':>7} {'fused':>6}")
    for name in args.models:
        model = zoo.build(name, max_positions=max(args.seqs))
        first = {}
        for seq in args.seqs:
            plans = {fuse: planner.compile(model, shapes_of(name, seq), fuse_attention=fuse) for fuse in (True, False)}
            row = []
            for fuse, plan in plans.items():
                first.setdefault(fuse, transient(plan))
                row += [transient(plan) / MiB, transient(plan) / first[fuse]]
            print(f"{name:<11} {seq:>6} {row[0]:>10.1f} {row[1]:>7.1f} {row[2]:>13.1f} {row[3]:>7.1f} "
                  f"{plans[True].stats['fused_attention']:>6}")


if __name__ == "__main__":
    main()
