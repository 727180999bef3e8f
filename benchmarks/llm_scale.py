"""Planning full-size LLMs from their configs: the export's time, and each training layout's planning time and peak
RSS, from 1B to 70B parameters (benchmarks/configs/*.json, as the Hub's config.json files hold them).

    python benchmarks/llm_scale.py [--models llama-3.2-1b ... llama-3-70b] [--seq 8192] [--layouts ...] [--workers N]

Each model is exported once (frontends/hf_config.py; a cached export is reported as such), then each layout is
planned in a fresh process of its own, so that its peak RSS (the child's VmHWM; Linux's ru_maxrss would keep the
parent's across exec) is the planning's alone; a pipeline's stages are planned in --workers forked processes at once
(default: the cores), whose largest peak RSS is shown beside it (it counts the pages a worker shares with its
parent, so the workers add less than that many times it):
--precision (amp-bf16), AdamW, batch 1 (a pipeline's microbatch) at --seq tokens, bestfit. A layout names
`tp`, `pp` (with 2 pp microbatches, 1F1B), `dp` and `zero` over --gpus devices, and `remat`; a pipeline is every
stage planned (planner.compile_stages), its fullest stage's arena shown. Progress goes to stderr.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"
MODELS = ["llama-3.2-1b", "llama-3.2-3b", "llama-3-8b", "llama-2-13b", "qwen2.5-32b", "mixtral-8x7b", "llama-3-70b"]
LAYOUTS = {  # name: (tp, pp, zero, remat) over --gpus devices
    "tp8 pp4 zero1": (8, 4, 1, None),
    "tp8 pp8 zero1": (8, 8, 1, None),
    "tp8 zero3": (8, 1, 3, None),
    "tp8 pp4 zero1 selective": (8, 4, 1, "selective"),
    "tp8 pp4 zero1 full": (8, 4, 1, "full"),
    "tp8 pp8 zero1 full": (8, 8, 1, "full"),
}
CHILD = """
import json, sys, time
import planner
import resource
model, seq, gpus, precision, workers, tp, pp, zero, remat = json.loads(sys.argv[1])
start = time.perf_counter()
dp = gpus // tp // pp
parallel = planner.Parallel(dp=dp, tp=tp, pp=pp, zero=zero if dp > 1 else 0, microbatches=2 * pp if pp > 1 else 1)
plans = list(planner.compile_stages(model, {"input_ids": (1, seq)}, training=True, optimizer="adamw",
                                    precision=precision, strategy="bestfit", parallel=parallel, remat=remat,
                                    workers=workers))
fullest = max(plans, key=lambda p: p.arena_bytes)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))  # kB, since this exec
print(json.dumps({"seconds": time.perf_counter() - start, "stages": len(plans), "steps": len(fullest.steps),
                  "arena": fullest.arena_bytes, "rss": int(peak.split()[1]) * 1024,
                  "worker_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def export(name):
    """(the export's path, seconds it took, or None where it was cached)."""
    from frontends import hf_config
    config = str(CONFIGS / f"{name}.json")
    cached = hf_config.cache_path(hf_config.config_of(config), training=True).is_file()
    start = time.perf_counter()
    path = hf_config.exported(config, training=True)
    return path, None if cached else time.perf_counter() - start


def plan(path, seq, gpus, precision, workers, layout):
    """The layout's planning in a child process of its own: {"seconds", "stages", "steps", "arena", "rss",
    "worker_rss"}."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([path, seq, gpus, precision, workers, *layout])],
                          capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--precision", default="amp-bf16")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("MEMPLAN_CACHE", str(Path.home() / ".cache" / "memplan"))
    print(f"{args.gpus} GPUs, sequence {args.seq}, batch 1, {args.precision}, AdamW, bestfit; each layout planned in a "
          f"process of its own, a pipeline's stages in {args.workers} worker(s)")
    print(f"{'model':<14} {'export s':>9} {'layout':<26} {'stages':>6} {'steps':>6} {'plan s':>7} {'peak RSS':>9} "
          f"{'workers RSS':>11} {'arena (fullest rank)':>20}")
    for name in args.models:
        path, took = export(name)
        for label in args.layouts:
            print(f"{name}: {label}...", file=sys.stderr, flush=True)
            result = plan(path, args.seq, args.gpus, args.precision, args.workers, LAYOUTS[label])
            exported = "cached" if took is None else f"{took:.0f}"
            if "error" in result:
                print(f"{name:<14} {exported:>9} {label:<26} {result['error']}")
                continue
            print(f"{name:<14} {exported:>9} {label:<26} {result['stages']:>6} {result['steps']:>6} "
                  f"{result['seconds']:>7.1f} {result['rss'] / 2**30:>7.2f} G {result['worker_rss'] / 2**30:>9.2f} G "
                  f"{result['arena'] / 2**30:>18.2f} G", flush=True)


if __name__ == "__main__":
    main()
