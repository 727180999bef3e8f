"""How long `memplan fit` takes to answer, end to end, on the models issue 22 names (the target: under a
minute each on the 2-core box), with the layout it puts first.

    python benchmarks/fit_time.py [--repeat 1] [--workers N]

Each run is the command line a user types, in a fresh process (model loading and worker start-up
included); the table shows the fastest of --repeat runs.
"""
import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "gpt2_small": ["zoo:gpt2_small", "--input", "input_ids:1x1024", "--gpus", "8", "--memory", "80GiB"],
    "resnet50": ["zoo:resnet50", "--batch", "8", "--gpus", "8", "--memory", "16GiB"],
}
TARGET = 60.0
"""Seconds a fit should take at most."""


def timed(args, workers):
    """(seconds, the fit's JSON document) of one `memplan fit` run."""
    command = [sys.executable, "-m", "planner.cli", "fit", *args, "--optimizer", "adam", "--json"]
    command += ["--workers", str(workers)] if workers else []
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return took, json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0, help="fit's --workers (default: one per core)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}; fastest of {args.repeat}")
    print(f"{'model':<12} {'seconds':>8} {'layouts':>8}  first layout (global batch)")
    for name, run in RUNS.items():
        took, doc = min((timed(run, args.workers) for _ in range(args.repeat)), key=lambda r: r[0])
        first = doc["rows"][0]
        print(f"{name:<12} {took:>8.1f} {len(doc['rows']):>8}  {first['layout']} ({first['global_batch']:,})"
              f"{'' if took < TARGET else f'  above the {TARGET:.0f} s target'}", flush=True)


if __name__ == "__main__":
    main()
