"""Executor latency and memory beside the peers, measured side by side in one process.

    python benchmarks/run_latency.py cpu [--batch 8] [--repeat 10]
    python benchmarks/run_latency.py gpu [--batches 1 32] [--repeat 20]

cpu: resnet50 on the NumPy backend against onnxruntime (CPU provider): median latency, and how far a
fresh process's peak RSS rises while it plans (or loads) and runs the model.
gpu: resnet50 and bert_base (sequence 128) on the CuPy backend against PyTorch eager (torchvision's
resnet50, transformers' BertModel with the same sizes): median latency, and device memory: the
arena against torch.cuda.max_memory_allocated().
"""
import argparse
import platform
import time

import numpy as np
import onnx

import planner
from executor import Executor
from frontends import zoo

MiB = 2 ** 20
SEQ = 128


def median_seconds(fn, repeat, sync=lambda: None):
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def cpu(batch, repeat):
    import onnxruntime as ort
    model = zoo.build("resnet50")
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    plan = planner.compile(model, {"input": x.shape})
    ex = Executor(plan, backend="numpy")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = median_seconds(lambda: ex.run({"input": x}), repeat)
    theirs = median_seconds(lambda: session.run(None, {"input": x}), repeat)
    print(f"machine: {platform.machine()}, python {platform.python_version()}")
    print(f"resnet50 batch {batch}: memplan numpy {ours * 1e3:.1f} ms, onnxruntime CPU {theirs * 1e3:.1f} ms, "
          f"ratio {ours / theirs:.2f}x; arena {plan.arena_bytes / MiB:.1f} MiB")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/resnet50.onnx"
        onnx.save(model, path)
        rss = {engine: peak_rss(engine, path, batch) for engine in ("memplan", "onnxruntime")}
    print(f"peak RSS while planning or loading the model, then running it (a fresh process each, above its RSS "
          f"once the model file is read): memplan {rss['memplan'] / MiB:.1f} MiB, onnxruntime "
          f"{rss['onnxruntime'] / MiB:.1f} MiB")


def peak_rss(engine, path, batch, runs=3):
    """Bytes a fresh process's peak RSS rises by, from after it reads the model at `path`, while it plans
    (memplan) or loads (onnxruntime) the model and runs it `runs` times (Linux: VmHWM reset through
    /proc/self/clear_refs)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_run_and_report, args=(engine, path, batch, runs, queue))
    child.start()
    result = queue.get()
    child.join()
    return result


def _run_and_report(engine, path, batch, runs, queue):
    import onnxruntime as ort
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    model = onnx.load(path)
    data = model.SerializeToString() if engine == "onnxruntime" else None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    if engine == "memplan":
        ex = Executor(planner.compile(model, {"input": x.shape}), backend="numpy")
        for _ in range(runs):
            ex.run({"input": x})
    else:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, {"input": x})
    queue.put(_status("VmHWM") - before)


def _status(field):
    """A field of /proc/self/status in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def gpu(batches, repeat):
    import cupy
    import torch
    print(f"{'model':<10} {'batch':>5} {'memplan ms':>11} {'torch ms':>9} {'arena MiB':>10} {'torch peak MiB':>15}")
    for name in ("resnet50", "bert_base"):
        for batch in batches:
            shapes = {"input": (batch, 3, 224, 224)} if name == "resnet50" else \
                {"input_ids": (batch, SEQ), "attention_mask": (batch, SEQ)}
            plan = planner.compile(zoo.build(name), shapes)
            ex = Executor(plan, backend="cupy")
            feeds = {n: cupy.asarray(np.zeros(s, np.int64) if n != "input" else
                                     np.random.default_rng(0).standard_normal(s, dtype=np.float32))
                     for n, s in shapes.items()}
            ours = median_seconds(lambda: ex.run(feeds), repeat, cupy.cuda.Device().synchronize)
            theirs, peak = _torch_eager(torch, name, shapes, repeat)
            print(f"{name:<10} {batch:>5} {ours * 1e3:>11.2f} {theirs * 1e3:>9.2f} {plan.arena_bytes / MiB:>10.1f} "
                  f"{peak / MiB:>15.1f}")


def _torch_eager(torch, name, shapes, repeat):
    """Median latency and peak allocated bytes of the same architecture in PyTorch eager (no grad)."""
    if name == "resnet50":
        import torchvision
        module = torchvision.models.resnet50()
        args = (torch.randn(*shapes["input"]),)
    else:
        from transformers import BertConfig, BertModel
        module = BertModel(BertConfig(), add_pooling_layer=False)
        args = (torch.zeros(*shapes["input_ids"], dtype=torch.long), torch.ones(*shapes["input_ids"], dtype=torch.long))
    module = module.cuda().eval()
    args = tuple(a.cuda() for a in args)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        seconds = median_seconds(lambda: module(*args), repeat, torch.cuda.synchronize)
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.empty_cache()
    return seconds, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("device", choices=["cpu", "gpu"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    cpu(args.batch, args.repeat) if args.device == "cpu" else gpu(args.batches, args.repeat)


if __name__ == "__main__":
    main()
