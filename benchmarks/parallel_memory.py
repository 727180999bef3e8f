"""One rank's training memory under each way of spreading a step (planner.parallel): data parallelism at
ZeRO 0 to 3, Megatron's tensor parallelism, 1F1B pipelines, and their mixes, against the same batch on one
device. Each row is one rank's plan (a pipeline's fullest stage, with every stage's arena beside it).

    python benchmarks/parallel_memory.py [--model gpt2_small] [--seq 512] [--batch 8] [--optimizer adam]

--batch is what each data rank trains on a step (a pipeline runs it as microbatches of --batch / M)."""
import argparse
import time

import planner
from frontends import read
from planner.units import format_bytes

LAYOUTS = [  # label, Parallel keywords
    ("dp 8, ZeRO-0", dict(dp=8)),
    ("dp 8, ZeRO-1", dict(dp=8, zero=1)),
    ("dp 8, ZeRO-3", dict(dp=8, zero=3)),
    ("tp 2", dict(tp=2)),
    ("tp 4", dict(tp=4)),
    ("dp 2 x tp 4, ZeRO-1", dict(dp=2, tp=4, zero=1)),
    ("8 microbatches on one device (accumulation)", dict(microbatches=8)),
    ("pp 4, 8 microbatches", dict(pp=4, microbatches=8)),
    ("dp 2 x tp 2 x pp 2, ZeRO-1, 4 microbatches", dict(dp=2, tp=2, pp=2, microbatches=4, zero=1)),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2_small")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--optimizer", default="adam")
    args = p.parse_args()
    graph = read(f"zoo:{args.model}")

    def plans(batch, parallel=None):
        return list(planner.compile_stages(graph, {"input_ids": (batch, args.seq)}, training=True,
                                           optimizer=args.optimizer, parallel=parallel))

    (whole,) = plans(args.batch)
    print(f"{args.model}, sequence {args.seq}, {args.batch} sequences a data rank, {args.optimizer}: "
          f"one device {format_bytes(whole.arena_bytes)}")
    print(f"{'layout':<44} {'arena per rank':>15} {'x one device':>12} {'params':>11} {'optimizer':>11} "
          f"{'saved':>11} {'sends a step':>13} {'plan s':>7}  stages")
    for label, keywords in LAYOUTS:
        start = time.perf_counter()
        parallel = planner.Parallel(**keywords)
        stages = plans(args.batch // parallel.microbatches, parallel)
        fullest = max(stages, key=lambda s: s.arena_bytes)
        sent = (fullest.training["parallel"]["collective_bytes"]
                + (fullest.training.get("pipeline") or {}).get("sent_bytes", 0))
        b = fullest.breakdown
        others = ", ".join(format_bytes(s.arena_bytes) for s in stages) if len(stages) > 1 else ""
        print(f"{label:<44} {format_bytes(fullest.arena_bytes):>15} {fullest.arena_bytes / whole.arena_bytes:>12.2f} "
              f"{format_bytes(b['params']):>11} {format_bytes(b['optimizer']):>11} {format_bytes(b['saved']):>11} "
              f"{format_bytes(sent):>13} {time.perf_counter() - start:>7.1f}  {others}")


if __name__ == "__main__":
    main()
