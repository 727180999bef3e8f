"""Will it fit? The README's table: LLMs planned from their configs (benchmarks/configs/*.json, no weights) at
8,192 tokens, trained on 8 and 64 devices of 80 GiB (`memplan fit`, amp-bf16, AdamW) and run for inference
(`memplan report`, bf16, one sequence's prefill on one device or on tensor-parallel ranks).

    python benchmarks/will_it_fit.py [--models llama-3-8b ...] [--rows train8 train64 infer]

Each row is one memplan command, run alone in a process of its own and timed (wall seconds); the command is
printed beside its answer, so that a row can be run again by hand. The exports are made first where they are
not cached ($MEMPLAN_CACHE/hf), and their time is not counted in the rows'.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"
COMMON = ["--input", "input_ids:1x8192"]
TRAIN = [*COMMON, "--precision", "amp-bf16", "--optimizer", "adamw", "--memory", "80GiB"]
ROWS = {  # model: {row: extra flags}
    "llama-3-8b": {"train8": ["--gpus", "8"], "train64": ["--gpus", "64"], "infer": []},
    "mixtral-8x7b": {"train8": ["--gpus", "8"], "train64": ["--gpus", "64"], "infer": ["--tp", "2"]},
    "qwen2.5-32b": {"train8": ["--gpus", "8"], "train64": ["--gpus", "64"], "infer": []},
    "llama-3-70b": {"train8": ["--gpus", "8"], "train64": ["--gpus", "64"], "infer": ["--tp", "2"]},
}
GiB = 2 ** 30


def command(model, row):
    config = os.path.relpath(CONFIGS / f"{model}.json")
    extra = ROWS[model][row]
    if row == "infer":
        return ["memplan", "report", config, *COMMON, "--precision", "bf16", "--strategy", "bestfit", *extra]
    return ["memplan", "fit", config, *TRAIN, *extra]


def run(argv):
    """(the command's JSON answer, wall seconds)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "planner.cli", *argv[1:], "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{shlex.join(argv)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout), seconds


def answer(row, doc):
    """The row's answer in a few words."""
    if row == "infer":
        arena = next(r["arena_bytes"] for r in doc["rows"] if r["strategy"] == "bestfit")
        tp = doc.get("tensor_parallel")
        where = f"each of {tp['tp']} tensor-parallel ranks" if tp else "one device"
        verdict = "fits" if arena <= 80 * GiB else "does not fit"
        return f"{arena / GiB:,.1f} GiB on {where}: {verdict} 80 GiB"
    fitting = [r for r in doc["rows"] if r["global_batch"]]
    if not fitting:
        planned = sorted((r for r in doc["rows"] if r["arena_bytes"]), key=lambda r: r["arena_bytes"])
        unplanned = [n for n in doc["notes"] if n.startswith("not planned")]
        least = (f"the least at batch 1: {planned[0]['layout']}, {'>= ' if planned[0]['arena_at_least'] else ''}"
                 f"{planned[0]['arena_bytes'] / GiB:,.1f} GiB a rank") if planned else "none planned"
        return f"no layout fits ({len(doc['rows'])} tried); {least}" + (f"; {unplanned[0]}" if unplanned else "")
    best = fitting[0]
    return (f"{len(fitting)} of {len(doc['rows'])} layouts fit; best {best['layout']}: global batch "
            f"{best['global_batch']} ({best['batch_per_rank']} a rank), {best['arena_bytes'] / GiB:,.1f} GiB a rank")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(ROWS), choices=list(ROWS))
    rows = ["train8", "train64", "infer"]
    parser.add_argument("--rows", nargs="+", default=rows, choices=rows)
    args = parser.parse_args()
    from frontends import hf_config
    for model in args.models:
        for training in (True, False):
            hf_config.exported(str(CONFIGS / f"{model}.json"), training)
    for model in args.models:
        for row in args.rows:
            argv = command(model, row)
            print(f"$ {shlex.join(argv)}", flush=True)
            doc, seconds = run(argv)
            print(f"  {answer(row, doc)}  [{seconds:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
