"""Executor latency and memory beside the peers, measured side by side in one process.

    python benchmarks/run_latency.py cpu [--batch 8] [--repeat 10] [--models resnet50 mobilenet_v2 bert_base]
                                         [--openblas]
    python benchmarks/run_latency.py gpu [--batches 1 32] [--repeat 20] [--models resnet50 mobilenet_v2 bert_base]

cpu: resnet50, mobilenet_v2 and bert_base (sequence 128) on the NumPy backend against onnxruntime (CPU
provider), with the threads each uses: median latency with numba's compiled kernels (executor/jit, when
numba is installed) and with the NumPy kernels alone (the GEMMs on MKL in both where it is installed,
executor/mkl.py), the three run in turn in each round, and how far a
fresh process's peak RSS rises while it plans (or loads) and runs the model. Run it on a quiet machine: a
ratio taken beside other work is off by up to 1.5x.
gpu: the same models on the CuPy backend, eager and replayed as one CUDA graph, against PyTorch eager and
torch.cuda.graphs (torchvision's models, transformers' BertModel with the same sizes), fp32 with TF32 off:
median latency, and device memory: the arena, cudaMemGetInfo's rise over an Executor, and
torch.cuda.max_memory_allocated().
"""
import argparse
import os
import platform
import time
from functools import partial

import planner  # first: it sets OpenBLAS's thread timeout, which OpenBLAS reads when NumPy loads it
import numpy as np
import onnx

from executor import Executor, mkl
from executor import jit as compiled
from frontends import zoo
from planner.timing import timings

MiB = 2 ** 20
SEQ = 128


def median_seconds(fn, repeat, sync=lambda: None):
    """The median of `repeat` timed calls of fn after a warm-up, begun after a second's pause so that the
    threads of whatever ran before (OpenBLAS's, TBB's, onnxruntime's spin) are asleep."""
    time.sleep(1)
    return float(np.median(timings(fn, repeat, sync)))


def paired_medians(fns, repeat, pause=0.05):
    """The median seconds of each of `fns` over `repeat` rounds that call each once in turn, after a
    warm-up of each: a slow spell of a shared machine falls on all of them alike. Each call begins after
    `pause` seconds, so that the threads of the one before (OpenBLAS's, TBB's, onnxruntime's spin) are
    asleep."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, seconds in zip(fns, times):
            time.sleep(pause)
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
    return [float(np.median(seconds)) for seconds in times]


CPU_MODELS = ("resnet50", "mobilenet_v2", "bert_base")


def cpu_feeds(name, batch):
    """Random feeds of a zoo model at `batch` (bert_base at sequence SEQ, its mask all ones)."""
    if name == "bert_base":
        return {"input_ids": np.random.default_rng(0).integers(0, 30522, (batch, SEQ)),
                "attention_mask": np.ones((batch, SEQ), np.int64)}
    return {"input": np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)}


def cpu(batch, repeat, models, openblas=False):
    """Each model on the NumPy backend and on onnxruntime's CPU provider, one after the other in this
    process, with the threads each uses; then the peak RSS rise of each in a fresh process. `openblas`
    adds memplan's compiled kernels with MKL switched off (NumPy's OpenBLAS, numba's np.dot) to each round."""
    import tempfile

    import onnxruntime as ort
    from threadpoolctl import threadpool_info
    mkl.available()  # loads MKL where it is installed, so that threadpoolctl lists it
    blas = ", ".join(sorted({f"{p['internal_api']} {p['num_threads']} ({_blas_detail(p)})"
                             for p in threadpool_info() if p["user_api"] == "blas"}))
    options = ort.SessionOptions()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"threads: memplan's BLAS {blas or 'none found'}, compiled kernels {_compiled_kernels()} "
          f"(NumPy's ufuncs: 1), onnxruntime intra-op "
          f"{options.intra_op_num_threads or 'default (one per physical core)'}")
    openblas = openblas and mkl.available()
    print(f"{'model':<13} {'batch':>5} {'memplan ms':>11} {'ort ms':>8} {'ratio':>6} {'no-jit ms':>10} {'ratio':>6} "
          + (f"{'openblas ms':>12} {'ratio':>6} " if openblas else "")
          + f"{'arena MiB':>10} {'memplan RSS MiB':>16} {'ort RSS MiB':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            model, feeds = zoo.build(name), cpu_feeds(name, batch)
            plan = planner.compile(model, {n: v.shape for n, v in feeds.items()})
            ex = Executor(plan, backend="numpy", jit=compiled.available() and compiled.wanted())  # compiled first
            plain = Executor(plan, backend="numpy", jit=False)
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            engines = [partial(ex.run, feeds), partial(plain.run, feeds), partial(session.run, None, feeds)]
            ours, numpy_only, theirs, *off = paired_medians(
                engines + [partial(_without_mkl, ex.run, feeds)] * openblas, repeat)
            del ex, plain, session
            path = f"{tmp}/{name}.onnx"
            onnx.save(model, path)
            rss = {engine: peak_rss(engine, path, name, batch) for engine in ("memplan", "onnxruntime")}
            print(f"{name:<13} {batch:>5} {ours * 1e3:>11.1f} {theirs * 1e3:>8.1f} {ours / theirs:>5.2f}x "
                  f"{numpy_only * 1e3:>10.1f} {numpy_only / theirs:>5.2f}x "
                  + "".join(f"{t * 1e3:>12.1f} {t / theirs:>5.2f}x " for t in off) + f"{plan.arena_bytes / MiB:>10.1f} "
                  f"{rss['memplan'] / MiB:>16.1f} {rss['onnxruntime'] / MiB:>12.1f}")
    print(f"medians of {repeat} runs after a warm-up; RSS: how far a fresh process's peak RSS rises, from after "
          f"it reads the model file and imports the engine, while it plans (or loads) the model and runs it 3 times")


def _without_mkl(run, feeds):
    """run(feeds) with MKL switched off: the GEMMs on NumPy's OpenBLAS and numba's np.dot."""
    with mkl.switched_off():
        run(feeds)


def _blas_detail(library):
    """What threadpoolctl says of a BLAS: OpenBLAS's kernels, MKL's threading layer."""
    if library["internal_api"] == "mkl":
        return f"{library.get('threading_layer', '?')} threads"
    return f"{library.get('architecture', '?')} kernels"


def _compiled_kernels():
    """What runs memplan's compiled kernels: numba's version and threads, or why none do."""
    if not compiled.available():
        return "off (numba not installed)"
    if not compiled.wanted():
        return "off (MEMPLAN_JIT)"
    import numba
    return f"numba {numba.__version__} on {numba.get_num_threads()} threads"


def peak_rss(engine, path, name, batch, runs=3):
    """Bytes a fresh process's peak RSS rises by, from after it reads the model at `path` and imports the
    engine's libraries (onnxruntime; memplan's with numba), while it plans (memplan) or loads (onnxruntime)
    the model and runs it `runs` times (Linux: VmHWM reset through /proc/self/clear_refs)."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_run_and_report, args=(engine, path, name, batch, runs, queue))
    child.start()
    result = queue.get()
    child.join()
    return result


def _run_and_report(engine, path, name, batch, runs, queue):
    import onnxruntime as ort
    feeds = cpu_feeds(name, batch)
    model = onnx.load(path)
    if engine == "memplan" and compiled.available() and compiled.wanted():
        compiled.overrides()  # numba and the kernels' modules: the libraries memplan runs on, as onnxruntime's
    if engine == "memplan":
        mkl.available()  # MKL, where it is installed
    data = model.SerializeToString() if engine == "onnxruntime" else None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    if engine == "memplan":
        ex = Executor(planner.compile(model, {n: v.shape for n, v in feeds.items()}), backend="numpy")
        for _ in range(runs):
            ex.run(feeds)
    else:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, feeds)
    queue.put(_status("VmHWM") - before)


def _status(field):
    """A field of /proc/self/status in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def gpu(batches, repeat, models):
    """Each model on the CuPy backend, eager and as one CUDA graph, against PyTorch eager and
    torch.cuda.graphs, fp32 with TF32 off on both sides. Each timed run copies the input in from the device and
    the output out to the host on both sides. Device memory: the arena, what building and running an
    Executor took by cudaMemGetInfo (the arena and the library handles), and PyTorch's peak allocation."""
    import cupy
    import torch
    from executor.backends import cupy_backend
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cupy {cupy.__version__}; fp32, TF32 off")
    cupy_backend.available()
    before = cupy_backend.used_bytes()
    libraries = cupy_backend.runtime().libraries
    print("libraries: " + "; ".join(f"{k}: {v}" for k, v in libraries.items())
          + f"; their handles took {(cupy_backend.used_bytes() - before) / MiB:.1f} MiB of device memory, once")
    print(f"{'model':<13} {'batch':>5} {'eager ms':>9} {'graph ms':>9} {'torch ms':>9} {'torch graph':>12} "
          f"{'graph/torch graph':>18} {'arena MiB':>10} {'device MiB':>11} {'torch peak MiB':>15} {'convs':>8}")
    for name in models:
        for batch in batches:
            shapes = {"input": (batch, 3, 224, 224)} if name != "bert_base" else \
                {"input_ids": (batch, SEQ), "attention_mask": (batch, SEQ)}
            host = {n: np.ones(s, np.int64) if n != "input" else
                    np.random.default_rng(0).standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
            plan = planner.compile(zoo.build(name), shapes, device="cuda")
            feeds = {n: cupy.asarray(v) for n, v in host.items()}
            cupy.get_default_memory_pool().free_all_blocks()
            before = cupy_backend.used_bytes()
            eager = Executor(plan, backend="cupy")
            eager.run(feeds)
            device = cupy_backend.used_bytes() - before
            convs = {step.name for step in plan.steps if step.op in ("Conv", "FusedConv")}
            own = convs & eager.runtime.depthwise_steps
            declined = {k: v for k, v in eager.runtime.convs.declined.items() if k in convs - own} \
                if eager.runtime.convs else dict.fromkeys(convs - own, "no cuDNN")
            on_cudnn = f"{len(convs) - len(declined) - len(own)}+{len(own)}/{len(convs)}"
            ours = median_seconds(lambda: {k: v.get() for k, v in eager.run(feeds).items()}, repeat,
                                  cupy.cuda.Device().synchronize)
            eager = None
            graph = Executor(plan, backend="cupy", cuda_graph=True)
            replayed = median_seconds(lambda: graph.run(feeds), repeat, cupy.cuda.Device().synchronize)
            graph = None
            cupy.get_default_memory_pool().free_all_blocks()
            theirs, captured, peak = _torch_runs(torch, name, host, repeat)
            print(f"{name:<13} {batch:>5} {ours * 1e3:>9.2f} {replayed * 1e3:>9.2f} {theirs * 1e3:>9.2f} "
                  f"{captured * 1e3:>12.2f} {replayed / captured:>17.2f}x {plan.arena_bytes / MiB:>10.1f} "
                  f"{device / MiB:>11.1f} {peak / MiB:>15.1f} {on_cudnn:>8}")
            for why in sorted(set(declined.values()))[:2]:
                print(f"    a conv cuDNN declined: {why[:200]}")
    print(f"medians of {repeat} runs after a warm-up; device MiB: cudaMemGetInfo's rise over building an Executor "
          f"and its first run; convs: cuDNN's + memplan's depthwise kernel's, of all")


def _torch_runs(torch, name, host, repeat):
    """Median seconds of the same architecture in PyTorch eager and replayed as a CUDA graph (no grad), each
    run copying its input in and its output to the host, and the peak bytes allocated in eager."""
    if name == "bert_base":
        from transformers import BertConfig, BertModel
        module = BertModel(BertConfig(), add_pooling_layer=False)
    else:
        import torchvision
        module = getattr(torchvision.models, name)()
    module = module.cuda().eval()
    args = [torch.from_numpy(v).cuda() for v in host.values()]
    static = [a.clone() for a in args]

    def eager():
        return _to_host(module(*[a.clone() for a in args]))

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        seconds = median_seconds(eager, repeat, torch.cuda.synchronize)
        peak = torch.cuda.max_memory_allocated()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                module(*static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = module(*static)

        def replay():
            for s, a in zip(static, args):
                s.copy_(a)
            graph.replay()
            return _to_host(out)

        captured = median_seconds(replay, repeat, torch.cuda.synchronize)
    return seconds, captured, peak


def _to_host(out):
    """The first output of a torchvision or transformers model (a tensor, or a tuple-like of them), on the host."""
    return (out if hasattr(out, "cpu") else out[0]).cpu()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("device", choices=["cpu", "gpu"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--models", nargs="+", choices=CPU_MODELS, default=list(CPU_MODELS))
    parser.add_argument("--openblas", action="store_true", help="cpu: also time memplan with MKL switched off")
    args = parser.parse_args()
    if args.device == "cpu":
        cpu(args.batch, args.repeat, args.models, args.openblas)
    else:
        gpu(args.batches, args.repeat, args.models)


if __name__ == "__main__":
    main()
