"""The `memplan` command line. Every user mistake ends in one line on stderr and exit status 2."""
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

from . import cli_serving, cli_swap
from .cli_inputs import bind_batch, check_free_batch, input_shapes
from .cli_parser import DEFAULT_MODEL, build_parser as _parser
from .errors import SURFACE, MemplanError
from .interrupt import interruptible
from .outputs import as_csv, check_output, emit, written
from .progress import Progress
from .units import format_bytes, parse_bytes

PARALLEL_ARGS = ("dp", "zero", "tp", "pp", "microbatches", "stage")
"""The options that lay out a parallel training step's ranks (`fit` chooses them itself)."""


def load_graph(args):
    """The typed graph of args.model with the shapes from --input and --batch."""
    from frontends import read
    from .shapes import infer
    raw = read(args.model, not args.no_weights, args.training)
    return infer(raw, input_shapes(raw, args.input, args.batch))


def config_of(args):
    """The Config from the environment, with --workspace-mode, --device-model and --link when given."""
    from .config import Config
    given = {"workspace_mode": args.workspace_mode, "device_model": getattr(args, "device_model", None),
             "link_bandwidth": getattr(args, "link", None) and float(parse_bytes(args.link, "--link"))}
    return Config.from_env(**{k: v for k, v in given.items() if v})


def compile_args(args, graph, device="any"):
    """planner.compile on the graph with the command's strategy, schedule, precision, training options and Config,
    for `device`."""
    from .compiler import compile
    return compile(graph, strategy=args.strategy, schedule=args.schedule, config=config_of(args), device=device,
                   **training_options(args), **precision_option(args))


def precision_option(args):
    """compile()'s precision keyword from --precision ("all" is report's alone)."""
    if args.precision == "all":
        raise MemplanError("--precision all applies to report, which puts the precisions side by side")
    return {} if args.precision == "fp32" else {"precision": args.precision}


def inspect(args):
    """Print the typed graph: inputs, outputs, op counts, parameter and activation bytes."""
    graph = load_graph(args)
    kinds = {}
    for t in graph.tensors.values():
        kinds.setdefault(t.kind, []).append(t)
    print(graph.summary())
    for name in graph.inputs + graph.outputs:
        t = graph.tensors[name]
        print(f"  {t.kind:<6} {name}: {t.shape} {t.dtype} {format_bytes(t.nbytes)}")
    for kind in ("param", "const", "activation", "output"):
        ts = kinds.get(kind, [])
        print(f"  {kind + 's':<12} {len(ts):>6} tensors {format_bytes(sum(t.nbytes for t in ts)):>14}")
    largest = sorted(kinds.get("activation", []), key=lambda t: -t.nbytes)[:args.top]
    if largest:
        print("  largest activations:")
        for t in largest:
            print(f"    {t.name}: {t.shape} {t.dtype} {format_bytes(t.nbytes)}")
    return 0


def training_options(args):
    """compile()'s training keywords from --training and the options that go with it."""
    from .options import IGNORE_INDEX
    if args.sequence_parallel and args.tp is None:
        raise MemplanError("--sequence-parallel shards the sequence among the ranks of --tp N: give that too")
    if not args.training:
        if args.loss or args.optimizer or args.lr is not None or args.remat or args.budget or args.trainable \
                or args.offload or args.frozen or args.class_axis is not None or args.ignore_index != IGNORE_INDEX \
                or args.shard != "flat" or args.prefetch or args.bucket or args.sync_batchnorm \
                or args.sequence_parallel or any(getattr(args, name) is not None for name in PARALLEL_ARGS
                                                 if name != "tp"):
            raise MemplanError("--loss, --optimizer, --lr, --remat, --offload, --budget, --trainable, --frozen, "
                               "--class-axis, --ignore-index, --dp, --zero, --pp, --microbatches, --stage, "
                               "--shard, --prefetch, --bucket, --sync-batchnorm and --sequence-parallel apply with "
                               "--training (--tp alone plans one tensor-parallel rank's inference)")
        if args.tp is not None:
            from .parallel import Parallel
            return {"parallel": Parallel(tp=args.tp)}
        return {}
    parallel = None
    if args.dp is None and args.zero is None and (args.shard != "flat" or args.prefetch or args.bucket
                                                  or args.sync_batchnorm):
        raise MemplanError("--shard, --prefetch, --bucket and --sync-batchnorm say how the ranks of --dp N --zero Z "
                           "shard, reduce and normalise: give those too")
    if any(getattr(args, name) is not None for name in PARALLEL_ARGS):
        from .parallel import Parallel
        parallel = Parallel(dp=args.dp or 1, zero=args.zero or 0, tp=args.tp or 1, pp=args.pp or 1,
                            microbatches=args.microbatches or 1, stage=args.stage or 0, shard=args.shard,
                            prefetch=args.prefetch, sync_batchnorm=args.sync_batchnorm,
                            sequence_parallel=args.sequence_parallel,
                            bucket_bytes=parse_bytes(args.bucket, "--bucket") if args.bucket else 0)
    return {"training": True, "loss": args.loss or "cross_entropy", "optimizer": args.optimizer or "sgd",
            "optimizer_args": {} if args.lr is None else {"lr": args.lr}, "remat": args.remat,
            "memory_budget": None if args.budget is None else parse_bytes(args.budget),
            "trainable": tuple(args.trainable), "frozen": tuple(args.frozen), "class_axis": args.class_axis,
            "ignore_index": args.ignore_index, "parallel": parallel, "offload": args.offload}


def report(args):
    """Print one row per strategy: arena, x LOAD, saving vs naive, plan time (and the breakdown when training); with
    --serve, one row per precision of serving (planner.serving)."""
    from .report import report as build
    check_output(args.output)
    if args.serve:
        training_options(args)  # the training flags without --training are refused as everywhere
        return cli_serving.report(args, config_of(args))
    if args.context or args.prompt or args.lengths:
        raise MemplanError("--context, --prompt and --lengths describe what --serve serves: give --serve too")
    if args.swap:
        return cli_swap.report(args, load_graph, config_of(args), training_options(args))
    from .precision import PRECISIONS
    training = training_options(args)
    budget = training.pop("memory_budget", None)
    training.pop("remat", None)
    every = args.precision == "all"
    result = build(load_graph(args), config=config_of(args), time_limit=args.time_limit, schedule=args.schedule,
                   strategies=args.strategy, memory_budget=budget, precisions=PRECISIONS if every else None,
                   **training, **({} if every else precision_option(args)))
    emit(args, json.dumps(result.as_dict(), indent=1) if args.json else as_csv(result.csv_rows()) if args.csv
         else result.table())
    return 0


def plan(args):
    """Compile one plan, verify it and write it as JSON (params and consts beside it, .npz)."""
    from .plan import values_path
    check_output(args.output)
    result = compile_args(args, load_graph(args))
    try:
        with written(args.output) as path:
            result.to_json(path)
            values = values_path(path).stat().st_size if values_path(path).exists() else None
    except OSError as e:
        raise MemplanError(f"-o {args.output}: cannot write the plan ({e.strerror})") from None
    print(f"{Path(args.output)}: {result.strategy}, {result.schedule} schedule, "
          f"arena {format_bytes(result.arena_bytes)} "
          f"(LOAD {format_bytes(result.lower_bound_bytes)}), {len(result.steps)} steps, {len(result.tensors)} tensors")
    if values is not None:
        print(f"{values_path(Path(args.output))}: the params' and consts' values, {format_bytes(values)}, which "
              "Plan.from_json reads beside the plan: keep the two together")
    return 0


def run(args):
    """Plan, then run on random feeds: the model and shapes, each training step's loss, the median time,
    the arena and the memory the run grew by."""
    import resource

    from executor import Executor, backends, check_memory, random_feeds
    graph = load_graph(args)
    backend = backends.get(args.backend)
    # a GPU plan leaves out the rewrites for the CPU's kernels (inverted_residual, winograd, batch_conv)
    plan = compile_args(args, graph, device="cuda" if backend.NAME == "cupy" else "any")
    check_memory(plan, backend, config_of(args), feeds=True, cuda_graph=args.cuda_graph)
    feeds = random_feeds(plan, seed=0)
    shapes = ", ".join(f"{n} {value.shape} {value.dtype}" for n, value in feeds.items())
    what = f"training step with {plan.training['optimizer']}" if plan.trains else "inference"
    host = f" and host arena {format_bytes(plan.host_arena_bytes)}" if plan.host_arena_bytes else ""
    print(f"{args.model}: {shapes}; {what}, {plan.strategy} plan, arena {format_bytes(plan.arena_bytes)}{host}")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    device_before = backend.used_bytes()
    ex = Executor(plan, backend=args.backend, config=config_of(args), profile=args.profile,
                  threads=args.threads, jit=False if args.no_jit else None, cuda_graph=args.cuda_graph, tf32=args.tf32)
    times = []
    with Progress("memplan run", total=args.repeat + 1) as bar:
        for k in range(args.repeat + 1):
            start = time.perf_counter()
            loss = ex.train_step(feeds) if plan.trains else ex.run(feeds)
            times.append(time.perf_counter() - start)
            if k == 0 and ex.profile:
                ex.profile.clear()
            if plan.trains:
                bar.update(k + 1, f"loss {loss:.4f}")
                print(f"step {k + 1}{' (warm-up)' if k == 0 else ''}: loss {loss:.6g} ({1e3 * times[-1]:.1f} ms)")
                if not math.isfinite(loss):
                    print("memplan: warning: the loss is not finite", file=sys.stderr)
            else:
                bar.update(k + 1)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    device = ex.backend.used_bytes()
    peak = f"device bytes in use {format_bytes(device)}" if device is not None else \
        f"RSS grew {format_bytes(max(grown, 0))}"
    timed = sorted(times[1:])
    parts = [part for part, used in (("compiled kernels", ex.jit), ("MKL's GEMMs", _host_mkl(ex)),
                                     ("cuBLAS", ex.libraries.get("cublas") == "in use"),
                                     ("cuDNN", ex.libraries.get("cudnn") == "in use"),
                                     ("CUDA-graph replay", ex.replay)) if used]
    engine = ex.backend.NAME + (f" with {' and '.join(parts)}" if parts else "")
    print(f"{plan.strategy} on {engine}: median {1e3 * timed[len(timed) // 2]:.2f} ms over "
          f"{args.repeat} run{'s' if args.repeat > 1 else ''} after a warm-up; arena {format_bytes(plan.arena_bytes)}; "
          f"{peak}" + (f" ({format_bytes(device_before)} before the executor)" if device is not None else "")
          + _still_compiling(ex))
    if ex.profile:
        print(ex.profile.table(args.top))
    return 0


def _still_compiling(ex):
    """'; N steps on ...' where steps of `ex` ran their NumPy kernels while their compiled ones compiled."""
    if not ex.jit:
        return ""
    from executor.jit import compiling
    waited = compiling.deferred()
    return f"; {waited} step{'s' * (waited > 1)} on the NumPy kernels while theirs compiled" if waited else ""


def _host_mkl(ex):
    """Whether the host GEMMs of `ex` run on MKL (executor/mkl.py)."""
    from executor import mkl
    return ex.backend.NAME == "numpy" and mkl.available()


def viz(args):
    """Draw the plan's memory timeline (and with --graph its computation graph) through graphviz."""
    from . import viz as pictures
    pictures.require_graphviz()
    for path in filter(None, (args.output, args.graph)):
        check_output(path)
    result = compile_args(args, load_graph(args))
    try:
        with written(args.output) as path:
            pictures.timeline(result, path)
        if args.graph:
            with written(args.graph) as path:
                pictures.graph_view(result, path, max_nodes=args.max_nodes)
    except OSError as e:
        raise MemplanError(f"cannot write the picture ({e.strerror}: {e.filename})") from None
    pictures_written = ", ".join(filter(None, (args.output, args.graph)))
    print(f"{pictures_written}: {result.strategy}, {result.schedule} schedule, arena "
          f"{format_bytes(result.arena_bytes)} (LOAD {format_bytes(result.lower_bound_bytes)}), {len(result.steps)} steps")
    return 0


def batch_planner(args, training):
    """compile_at(batch, **options): the command's model planned at another batch (the first dim of its
    inputs), with the command's options and `training` ones under `options`; compile_at.stages(batch, order,
    **options) yields the plans of the pipeline stages `order` lists (planner.compile_stages), and
    compile_at.splits(batch, **options) raises what compile_at would where the model does not split so
    (planner.compiler.split)."""
    from frontends import read
    from .compiler import compile, compile_stages, split
    from .shapes import infer
    config = config_of(args)
    raw = read(args.model, not args.no_weights, args.training)
    given = input_shapes(raw, args.input, None)
    check_free_batch(raw, given)

    def typed(batch):
        shapes = {n: (batch, *s[1:]) for n, s in given.items()}
        bind_batch(raw, shapes, batch)
        return infer(raw, shapes)

    def planned(batch, options, how):
        return how(typed(batch), schedule=args.schedule, config=config,
                   **{**training, **precision_option(args), **options})

    def compile_at(batch, **options):
        return planned(batch, options, compile)
    compile_at.stages = lambda batch, order, **options: planned(batch, {**options, "stages": order}, compile_stages)
    compile_at.splits = lambda batch, **options: planned(batch, options, split)
    compile_at.typed = typed
    return compile_at


def max_batch(args):
    """For each strategy (and with --training each recomputation), the largest batch whose arena fits --budget."""
    from . import maxbatch
    if args.budget is None:
        raise MemplanError("max-batch needs the memory to fit: --budget SIZE, e.g. --budget 16GiB")
    check_output(args.output)
    budget = parse_bytes(args.budget)
    args.budget = None
    if args.serve:
        training_options(args)
        return cli_serving.max_batch(args, budget, config_of(args))
    if args.context or args.prompt:
        raise MemplanError("--context and --prompt describe what --serve serves: give --serve too")
    training = training_options(args)
    compile_at = batch_planner(args, training)
    rows = [(s, {"strategy": s}) for s in args.strategy]
    if training.get("training"):  # recomputation, offload and swap with the last strategy asked for (default auto)
        last = args.strategy[-1]
        rows += [(f"{last} + {r}", {"strategy": last, "remat": r}) for r in ("mirror", "sublinear")]
        rows += [] if training["offload"] else [(f"{last} + offload", {"strategy": last, "offload": "optimizer"})]
        rows += [(f"{last} + offload + swap", {"strategy": last, "offload": "optimizer", "remat": "swap",
                                               "memory_budget": budget})]
    failed, place = [], {label: k for k, (label, _) in enumerate(rows, 1)}
    with Progress("memplan max-batch", total=len(rows)) as bar:
        results = maxbatch.table(compile_at, budget, rows,
                                 lambda label, b: bar.update(place[label], f"{label}: batch {b}"), failed)
    if not results:
        raise failed[0][1]
    notes = [f"left out {label}: {e}" for label, e in failed]
    rows = [{"strategy": label, "max_batch": batch, "arena_bytes": plan.arena_bytes if plan else None,
             "host_arena_bytes": plan.host_arena_bytes if plan else None} for label, batch, plan in results]
    if args.json or args.csv:
        emit(args, json.dumps({"model": args.model, "budget_bytes": budget, "rows": rows, "notes": notes}, indent=1)
             if args.json else as_csv(rows))
        return 0
    host = any(r["host_arena_bytes"] for r in rows)  # a column where an offload or swap row has a host arena
    lines = [f"{args.model}: the largest batch whose {'training step' if training.get('training') else 'plan'} fits "
             f"{format_bytes(budget)}",
             f"{'strategy':<22} {'max batch':>9} {'arena':>13}" + f" {'host arena':>13}" * host]
    lines += [f"{r['strategy']:<22} {r['max_batch']:>9} {_bytes(r['arena_bytes']):>13}"
              + f" {_bytes(r['host_arena_bytes']):>13}" * host for r in rows]
    if any(not r["max_batch"] for r in rows):
        notes.append("a row fitting no batch shows its arena at batch 1")
    emit(args, "\n".join([*lines, *(f"note: {n}" for n in notes)]))
    return 0


def _bytes(nbytes):
    return "-" if nbytes is None else format_bytes(nbytes)


def _sizes(sizes, pinned):
    """The model-parallel sizes fit tries: `sizes`, or the one given (none for 1)."""
    return sizes if pinned is None else [pinned] if pinned > 1 else []


def fit(args):
    """The data-, tensor- and pipeline-parallel layouts of --gpus devices of --memory each, with the largest
    per-rank batch each fits."""
    from . import fit as layouts
    from .optimizers import OPTIMIZERS
    from .remat import layers
    from executor.threads import cores
    if args.microbatches is not None or args.stage is not None:
        raise MemplanError(f"fit plans every stage of a pipeline, with {layouts.MICROBATCHES} microbatches a stage: "
                           "leave out --microbatches and --stage")
    pinned = {name: getattr(args, name) for name in ("dp", "tp", "pp", "zero") if getattr(args, name) is not None}
    remat, args.remat = args.remat, None
    for name in PARALLEL_ARGS:
        setattr(args, name, None)
    check_output(args.output)
    memory, args.training = parse_bytes(args.memory, "--memory"), True
    rules = {"shard": args.shard, "prefetch": args.prefetch, "sync_batchnorm": args.sync_batchnorm,  # each layout's
             "bucket_bytes": parse_bytes(args.bucket, "--bucket") if args.bucket else 0}
    args.shard, args.prefetch, args.bucket, args.sync_batchnorm = "flat", 0, None, False
    training = training_options(args)
    compile_at = batch_planner(args, training)
    with Progress("memplan fit") as bar:
        bar.update(detail="which tensor- and pipeline-parallel sizes split the model")
        graph = compile_at.typed(1)
        transformer = layers.attends(graph)
        least = layouts.least_states(
            layouts.param_sizes(graph, args.precision, training["frozen"], training["trainable"]),
            len(OPTIMIZERS[training["optimizer"]][2]))

        def keep(parallel):
            return all(getattr(parallel, name) == value for name, value in pinned.items())
        tps, pps, notes = layouts.model_parallel_sizes(
            compile_at, args.gpus, _sizes(layouts.TENSOR_PARALLEL, pinned.get("tp")),
            _sizes(layouts.LAYER_PIPELINE if transformer else layouts.PIPELINE, pinned.get("pp")),
            lambda parallel: least(parallel) <= memory, keep)
        for kind, sizes in (("tp", tps), ("pp", pps)):
            if pinned.get(kind, 1) > 1 and pinned[kind] not in sizes:
                raise MemplanError(f"--{kind} {pinned[kind]}: " + next(
                    (n.split(": ", 1)[1] for n in notes if n.startswith(f"no {kind} ")), "it does not divide --gpus"))
        remats = (remat,) if remat else layouts.LAYER_REMATS if transformer else layouts.REMATS
        candidates = layouts.candidates(args.gpus, tps=tps, pps=pps, remats=remats, keep=keep,
                                        offload=not training["offload"], **rules)
        if not candidates:
            raise MemplanError(f"no layout of {args.gpus} devices is what was asked for")
        bar.label, bar.total = "memplan fit, layouts", len(candidates)
        started = {}

        def told(label, batch):
            started.setdefault(label, len(started) + 1)
            bar.update(len(started), f"{label}: batch {batch}")
        found, dropped = layouts.search(compile_at, memory, candidates, told, args.workers or cores(), least)
    notes += dropped
    if pps:
        notes.append(f"a pipeline's batch per rank is its microbatch; it plans {layouts.MICROBATCHES} microbatches "
                     "a stage, and more give a larger global batch and a smaller bubble at about the same memory")
    rows = [{"layout": label, "batch_per_rank": batch, "global_batch": total, "arena_bytes": arena,
             "arena_at_least": isinstance(arena, layouts.AtLeast),
             "flops_per_rank": (cost or {}).get("flops"), "sent_bytes_per_rank": (cost or {}).get("sent_bytes"),
             "host_arena_bytes": (cost or {}).get("host_bytes")} for label, batch, total, arena, cost in found]
    if args.json or args.csv:
        doc = {"model": args.model, "gpus": args.gpus, "memory_bytes": memory, "rows": rows, "notes": notes}
        emit(args, json.dumps(doc, indent=1) if args.json else as_csv(rows))
        return 0
    width = max(28, *(len(r['layout']) for r in rows))
    host = any(r["host_arena_bytes"] for r in rows)  # a column where an offloaded layout has a host arena
    lines = [f"{args.model} on {args.gpus} devices of {format_bytes(memory)}: the largest batch each layout's "
             "training step fits, largest global batch first",
             f"{'layout':<{width}} {'batch per rank':>14} {'global batch':>12} {'arena per rank':>15} "
             f"{'TFLOP a step':>12} {'sent a step':>12}" + f" {'host arena':>12}" * host]
    lines += [f"{r['layout']:<{width}} {r['batch_per_rank']:>14} {r['global_batch']:>12} "
              f"{('>= ' if r['arena_at_least'] else '') + _bytes(r['arena_bytes']):>15} "
              f"{_tflop(r['flops_per_rank']):>12} {_bytes(r['sent_bytes_per_rank']):>12}"
              + f" {_bytes(r['host_arena_bytes']):>12}" * host for r in rows]
    notes.append("per rank: its arena (a layout fitting no batch: at batch 1, where it was planned; '>=' the least "
                 "any placement of its buffers needs, its LOAD, where that alone is over the memory and it was not "
                 "placed), the FLOPs of its step (forward, backward and recomputation; a pipeline's fullest stage) "
                 "and the bytes its collectives and sends move a step"
                 + (", and its host arena (the optimizer offloaded)" if host else ""))
    emit(args, "\n".join([*lines, *notes]))
    return 0


def _tflop(flops):
    return "-" if flops is None else f"{flops / 1e12:.2f}"


def build_parser():
    """The argument parser of every command (planner/cli_parser.py)."""
    return _parser({"inspect": inspect, "report": report, "plan": plan, "viz": viz, "max-batch": max_batch,
                    "fit": fit, "generate": lambda args: cli_serving.generate(args, config_of(args)), "run": run,
                    "calibrate": cli_swap.calibrate})


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "model", None) == DEFAULT_MODEL and args.batch is None and not args.input:
        args.batch = 1
    surface = SURFACE.set("cli")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line
            return interruptible(lambda: args.run(args))
    except MemplanError as e:
        print(f"memplan: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # an allocation no check foresaw: NumPy's ArrayMemoryError names the array
        print(f"memplan: error: not enough memory: {(str(e).strip().splitlines() or ['an allocation failed'])[0]}",
              file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader (head, less) stopped early; Python docs' recipe for a quiet exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        SURFACE.reset(surface)


def _one_line(message, category, filename, lineno, file=None, line=None):
    """A warning as the command prints it: one line, without the source line Python shows."""
    text = " ".join(str(message).split())
    print(f"memplan: warning: {text}", file=file or sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
