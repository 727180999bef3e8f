"""Serving memory of a GenerationPlan against the export as it is, per family (small transformers configs exported
with a cache, as benchmarks/decode_latency.py makes them).

    python benchmarks/serving_memory.py [--families llama ...] [--batch 4] [--context 1024] [--prompt 512]

For each family: the KV cache's bytes against 2 x layers x kv heads x head size x 4 bytes x batch x context;
the weights; the prefill and decode arenas of one GenerationPlan; the decode step's transient bytes (its most
live bytes at one step, besides weights and cache) against the most that one layer's steps hold at once (a
layer's working set); and the export planned as it is for one token at the context's last position (past of
context - 1 positions in, present out: the cache held twice and copied by Concat).
"""
import argparse
import os
import re
import sys
import tempfile

import planner
from planner.allocators import align
from planner.units import format_bytes

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import generation_exports as exports  # noqa: E402
from decode_latency import bigger  # noqa: E402

LAYER = re.compile(r"(?:layers|\bh)\.(\d+)[./]")
"""A step's layer, from the exporter's node names (/model/layers.3/..., /transformer/h.3/...)."""


def live_by_step(plan):
    """The transient bytes live at each step of `plan` (each buffer once, aligned)."""
    live = [0] * len(plan.steps)
    for root, (first, last) in plan.buffer_spans().items():
        for k in range(first, min(last, len(live) - 1) + 1):
            live[k] += align(plan.tensors[root].nbytes)
    return live


def largest_layer(plan, live):
    """(the most transient bytes live at one step of one layer, that layer)."""
    best = (0, None)
    for k, step in enumerate(plan.steps):
        found = LAYER.search(step.name)
        if found and live[k] > best[0]:
            best = (live[k], int(found.group(1)))
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(exports.FAMILIES))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=512)
    args = parser.parse_args()
    g = planner.Generation(args.batch, args.context, args.prompt)
    print(f"serving {g.batch} sequences of {g.max_length} positions (prompts of {g.prompt}), fp32")
    print(f"{'family':<8} {'KV cache':>11} {'formula':>8} {'weights':>11} {'prefill':>11} {'decode':>11} "
          f"{'transient':>10} {'layer':>10} {'ratio':>6} {'export, 1 token':>16}")
    for family in args.families:
        config = bigger(family)
        lm = exports.build(config)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            pasts = exports.export(lm, config, path)
            plan = planner.compile(path, generation=g)
            heads, size = exports.cache_dims(config)
            formula = 2 * config.num_hidden_layers * heads * size * 4 * g.batch * g.max_length
            live = live_by_step(plan.decode)
            layer, _ = largest_layer(plan.decode, live)
            shapes = {"input_ids": (g.batch, 1), "position_ids": (g.batch, 1),
                      "attention_mask": (g.batch, g.max_length),
                      **{p: (g.batch, heads, g.max_length - 1, size) for p in pasts}}
            plain = planner.compile(path, shapes)
            print(f"{family:<8} {format_bytes(plan.cache_bytes):>11} {'exact' if plan.cache_bytes == formula else 'DIFFERS':>8} "
                  f"{format_bytes(plan.weights_bytes):>11} {format_bytes(plan.prefill.arena_bytes):>11} "
                  f"{format_bytes(plan.decode.arena_bytes):>11} {format_bytes(max(live)):>10} {format_bytes(layer):>10} "
                  f"{max(live) / layer:>6.2f} {format_bytes(plain.arena_bytes):>16}")


if __name__ == "__main__":
    main()
