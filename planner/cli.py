"""The `memplan` command line. Every user mistake ends in one line on stderr and exit status 2."""
import argparse
import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path

from .errors import SURFACE, MemplanError
from .interrupt import interruptible
from .outputs import as_csv, check_output, emit, written
from .progress import Progress
from .units import format_bytes, parse_bytes

DEFAULT_MODEL = "zoo:resnet50"
PARALLEL_ARGS = ("dp", "zero", "tp", "pp", "microbatches", "stage")
"""The options that lay out a parallel training step's ranks (`fit` chooses them itself)."""

EXAMPLES = """examples:
  memplan report                                    # the built-in default model (zoo:resnet50, batch 1)
  memplan report zoo:resnet50 --batch 32            # arena per strategy and the lower bound
  memplan report zoo:lenet --batch 16 --training --optimizer adam --budget 2.75MiB
  memplan run zoo:lenet --batch 8 --training --remat sublinear --repeat 3
  memplan run zoo:resnet50 --batch 8 --profile      # time per op type and the slowest steps
  memplan plan zoo:gpt2_small --input input_ids:8x128 --strategy share -o plan.json
  memplan inspect zoo:bert_base --input input_ids:8x128 --input attention_mask:8x128
  memplan inspect model.onnx --input input:8x3x224x224
  memplan viz zoo:lenet --batch 8 --training -o timeline.svg --graph graph.svg
  memplan max-batch zoo:lenet --budget 64MiB --training --optimizer adam
  memplan fit zoo:resnet50 --batch 8 --gpus 8 --memory 16GiB --optimizer adam
"""


def parse_input(text):
    """'NAME:8x3x224x224' -> ('NAME', (8, 3, 224, 224))."""
    m = re.fullmatch(r"(.+):(\d+(?:x\d+)*)", text)
    if not m:
        raise MemplanError(f"--input {text!r}: expected NAME:DIMS, e.g. --input input:8x3x224x224")
    return m.group(1), tuple(int(d) for d in m.group(2).split("x"))


def input_shapes(graph, inputs, batch):
    """Shapes from --input flags; --batch fills the first dim of every other input whose first dim is not
    fixed and whose other dims are. Warns on stderr when --batch binds no input."""
    shapes = {}
    for text in inputs:
        name, dims = parse_input(text)
        if name in shapes:
            raise MemplanError(f"--input {name} is given twice ({'x'.join(map(str, shapes[name]))} and "
                               f"{'x'.join(map(str, dims))}); give each input once")
        shapes[name] = dims
    if batch is not None and not bind_batch(graph, shapes, batch):
        print(f"memplan: warning: --batch {batch} binds no input: each has a fixed first dim, other unbound "
              "dims, or an --input of its own", file=sys.stderr)
    return shapes


def bind_batch(graph, shapes, batch):
    """Add to `shapes` each input not in it whose first dim is free and whose other dims are fixed, with
    `batch` as its first dim; returns the names bound."""
    bound = []
    for name in graph.inputs:
        declared = graph.tensors[name].shape
        if name not in shapes and declared and not isinstance(declared[0], int) \
                and all(isinstance(d, int) for d in declared[1:]):
            shapes[name] = (batch, *declared[1:])
            bound.append(name)
    return bound


def load_graph(args):
    """The typed graph of args.model with the shapes from --input and --batch."""
    from frontends import read
    from .shapes import infer
    raw = read(args.model)
    return infer(raw, input_shapes(raw, args.input, args.batch))


def config_of(args):
    """The Config from the environment, with --workspace-mode when given."""
    from .config import Config
    return Config.from_env(**({"workspace_mode": args.workspace_mode} if args.workspace_mode else {}))


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
    from .losses import IGNORE_INDEX
    if not args.training:
        if args.loss or args.optimizer or args.lr is not None or args.remat or args.budget or args.trainable \
                or args.frozen or args.class_axis is not None or args.ignore_index != IGNORE_INDEX \
                or args.shard != "flat" or args.prefetch or args.bucket \
                or any(getattr(args, name) is not None for name in PARALLEL_ARGS):
            raise MemplanError("--loss, --optimizer, --lr, --remat, --budget, --trainable, --frozen, --class-axis, "
                               "--ignore-index, --dp, --zero, --tp, --pp, --microbatches, --stage, --shard, --prefetch "
                               "and --bucket apply with --training")
        return {}
    parallel = None
    if args.dp is None and args.zero is None and (args.shard != "flat" or args.prefetch or args.bucket):
        raise MemplanError("--shard, --prefetch and --bucket say how the ranks of --dp N --zero Z shard and reduce: "
                           "give those too")
    if any(getattr(args, name) is not None for name in PARALLEL_ARGS):
        from .parallel import Parallel
        parallel = Parallel(dp=args.dp or 1, zero=args.zero or 0, tp=args.tp or 1, pp=args.pp or 1,
                            microbatches=args.microbatches or 1, stage=args.stage or 0, shard=args.shard,
                            prefetch=args.prefetch, bucket_bytes=parse_bytes(args.bucket) if args.bucket else 0)
    return {"training": True, "loss": args.loss or "cross_entropy", "optimizer": args.optimizer or "sgd",
            "optimizer_args": {} if args.lr is None else {"lr": args.lr}, "remat": args.remat,
            "memory_budget": None if args.budget is None else parse_bytes(args.budget),
            "trainable": tuple(args.trainable), "frozen": tuple(args.frozen), "class_axis": args.class_axis,
            "ignore_index": args.ignore_index, "parallel": parallel}


def report(args):
    """Print one row per strategy: arena, x LOAD, saving vs naive, plan time (and the breakdown when training)."""
    from .report import report as build
    check_output(args.output)
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
    check_output(args.output)
    result = compile_args(args, load_graph(args))
    try:
        with written(args.output) as path:
            result.to_json(path)
    except OSError as e:
        raise MemplanError(f"-o {args.output}: cannot write the plan ({e.strerror})") from None
    print(f"{Path(args.output)}: {result.strategy}, {result.schedule} schedule, "
          f"arena {format_bytes(result.arena_bytes)} "
          f"(LOAD {format_bytes(result.lower_bound_bytes)}), {len(result.steps)} steps, {len(result.tensors)} tensors")
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
    what = f"training step with {plan.training['optimizer']}" if plan.training else "inference"
    print(f"{args.model}: {shapes}; {what}, {plan.strategy} plan, arena {format_bytes(plan.arena_bytes)}")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    device_before = backend.used_bytes()
    ex = Executor(plan, backend=args.backend, config=config_of(args), profile=args.profile,
                  threads=args.threads, jit=False if args.no_jit else None, cuda_graph=args.cuda_graph, tf32=args.tf32)
    times = []
    with Progress("memplan run", total=args.repeat + 1) as bar:
        for k in range(args.repeat + 1):
            start = time.perf_counter()
            loss = ex.train_step(feeds) if plan.training else ex.run(feeds)
            times.append(time.perf_counter() - start)
            if k == 0 and ex.profile:
                ex.profile.clear()
            if plan.training:
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
          f"{peak}" + (f" ({format_bytes(device_before)} before the executor)" if device is not None else ""))
    if ex.profile:
        print(ex.profile.table(args.top))
    return 0


def _host_mkl(ex):
    """Whether the host GEMMs of `ex` run on MKL (planner/ops/mkl.py)."""
    from .ops import mkl
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
    **options) yields the plans of the pipeline stages `order` lists (planner.compile_stages)."""
    from frontends import read
    from .compiler import compile, compile_stages
    from .shapes import infer
    config = config_of(args)
    raw = read(args.model)
    given = input_shapes(raw, args.input, None)
    check_free_batch(raw, given)

    def planned(batch, options, how):
        shapes = {n: (batch, *s[1:]) for n, s in given.items()}
        bind_batch(raw, shapes, batch)
        return how(infer(raw, shapes), schedule=args.schedule, config=config,
                   **{**training, **precision_option(args), **options})

    def compile_at(batch, **options):
        return planned(batch, options, compile)
    compile_at.stages = lambda batch, order, **options: planned(batch, {**options, "stages": order}, compile_stages)
    return compile_at


def max_batch(args):
    """For each strategy (and with --training each recomputation), the largest batch whose arena fits --budget."""
    from . import maxbatch
    if args.budget is None:
        raise MemplanError("max-batch needs the memory to fit: --budget SIZE, e.g. --budget 16GiB")
    check_output(args.output)
    budget = parse_bytes(args.budget)
    args.budget = None
    training = training_options(args)
    compile_at = batch_planner(args, training)
    rows = [(s, {"strategy": s}) for s in args.strategy]
    if training:
        rows += [(f"bestfit + {r}", {"remat": r}) for r in ("mirror", "sublinear")]
    with Progress("memplan max-batch") as bar:
        results = maxbatch.table(compile_at, budget, rows, lambda label, b: bar.update(detail=f"{label}: batch {b}"))
    rows = [{"strategy": label, "max_batch": batch, "arena_bytes": plan.arena_bytes if plan else None}
            for label, batch, plan in results]
    if args.json or args.csv:
        emit(args, json.dumps({"model": args.model, "budget_bytes": budget, "rows": rows}, indent=1) if args.json
             else as_csv(rows))
        return 0
    lines = [f"{args.model}: the largest batch whose {'training step' if training else 'plan'} fits "
             f"{format_bytes(budget)}", f"{'strategy':<22} {'max batch':>9} {'arena':>13}"]
    lines += [f"{r['strategy']:<22} {r['max_batch']:>9} {format_bytes(r['arena_bytes'] or 0):>13}" for r in rows]
    emit(args, "\n".join(lines))
    return 0


def fit(args):
    """The data-, tensor- and pipeline-parallel layouts of --gpus devices of --memory each, with the largest
    per-rank batch each fits."""
    from . import fit as layouts
    from .threads import cores
    if any(getattr(args, name) is not None for name in PARALLEL_ARGS):
        raise MemplanError("fit chooses --dp, --tp, --pp, --microbatches and --zero itself: give --gpus N and "
                           "--memory SIZE")
    check_output(args.output)
    memory, args.training = parse_bytes(args.memory), True
    rules = {"shard": args.shard, "prefetch": args.prefetch,  # each layout's, not one --dp's
             "bucket_bytes": parse_bytes(args.bucket) if args.bucket else 0}
    args.shard, args.prefetch, args.bucket = "flat", 0, None
    compile_at = batch_planner(args, training_options(args))
    with Progress("memplan fit") as bar:
        tps, pps, notes = layouts.model_parallel_sizes(compile_at, args.gpus)
        found = layouts.search(compile_at, args.gpus, memory, lambda label, b: bar.update(detail=f"{label}: batch {b}"),
                               args.workers or cores(), tps, pps, **rules)
    if pps:
        notes.append(f"a pipeline's batch per rank is its microbatch; it plans {layouts.MICROBATCHES} microbatches "
                     "a stage, and more give a larger global batch and a smaller bubble at about the same memory")
    rows = [{"layout": label, "batch_per_rank": batch, "global_batch": total, "arena_bytes": arena}
            for label, batch, total, arena in found]
    if args.json or args.csv:
        doc = {"model": args.model, "gpus": args.gpus, "memory_bytes": memory, "rows": rows, "notes": notes}
        emit(args, json.dumps(doc, indent=1) if args.json else as_csv(rows))
        return 0
    width = max(28, *(len(r['layout']) for r in rows))
    lines = [f"{args.model} on {args.gpus} devices of {format_bytes(memory)}: the largest batch each layout's "
             "training step fits, largest global batch first",
             f"{'layout':<{width}} {'batch per rank':>14} {'global batch':>12} {'arena per rank':>15}"]
    lines += [f"{r['layout']:<{width}} {r['batch_per_rank']:>14} {r['global_batch']:>12} "
              f"{format_bytes(r['arena_bytes'] or 0):>15}" for r in rows]
    emit(args, "\n".join([*lines, *notes]))
    return 0


def check_free_batch(raw, given):
    """Refuse a model whose batch max-batch cannot vary: an --input whose first dim the model fixes, or no
    input with a free first dim (its other dims fixed, or given by --input)."""
    fixed = {n: raw.tensors[n].shape for n in (given or raw.inputs)
             if raw.tensors[n].shape and isinstance(raw.tensors[n].shape[0], int)}
    hint = "; export the model with a free batch dim (torch.onnx.export(..., dynamic_shapes=...))"
    for name in given:
        if name in fixed:
            raise MemplanError(f"max-batch varies the first dim of the inputs, but the model fixes {name}'s at "
                               f"{fixed[name][0]} (shape {tuple(fixed[name])}){hint}")
    if not given and not bind_batch(raw, {}, 1):
        if fixed and len(fixed) == len(raw.inputs):
            shapes = ", ".join(f"{n} {tuple(s)}" for n, s in fixed.items())
            raise MemplanError(f"max-batch varies the first dim of the inputs, but the model fixes the first dim "
                               f"of every input ({shapes}){hint}")
        raise MemplanError("max-batch varies the first dim of the inputs, but no input has a free first dim with "
                           "its other dims fixed: give the other dims with --input NAME:DIMS")


def count(least):
    """An argparse type: an integer of at least `least`."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value
    return parse


def seconds(text):
    """An argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not value > 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def label_index(text):
    """An argparse type: an int label value, or 'none'."""
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value: {text!r}; give an int or none") from None


def _model_args(p, one_strategy):
    from .compiler import SCHEDULES, STRATEGIES
    from .losses import IGNORE_INDEX, LOSSES
    from .precision import PRECISIONS
    from .remat import REMATS
    from .training import OPTIMIZERS
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="an .onnx file or zoo:NAME")
    p.add_argument("--input", action="append", default=[], metavar="NAME:DIMS", help="bind an input, e.g. input:8x3x224x224")
    p.add_argument("--batch", type=count(1), default=None, help="batch size for inputs whose other dims are known")
    p.add_argument("--training", action="store_true", help="plan a training step: forward, loss, backward, optimizer")
    p.add_argument("--loss", choices=LOSSES, default=None, help="the loss on the first output (default cross_entropy)")
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), default=None, help="the optimizer (default sgd)")
    p.add_argument("--lr", type=float, default=None, help="the learning rate (default: the optimizer's)")
    p.add_argument("--trainable", action="append", default=[], metavar="NAME",
                   help="train this initializer even if it looks like a number of the model's code (repeatable)")
    p.add_argument("--frozen", action="append", default=[], metavar="NAME",
                   help="keep this initializer constant (repeatable)")
    p.add_argument("--class-axis", type=int, default=None, metavar="N",
                   help="the dim of the logits holding the classes (default 1, or the last for a language model)")
    p.add_argument("--ignore-index", type=label_index, default=IGNORE_INDEX, metavar="N",
                   help=f"labels equal to N count neither in the loss nor its mean (default {IGNORE_INDEX}; "
                        "none for none)")
    p.add_argument("--remat", choices=REMATS, default=None, help="recompute forward tensors in backward")
    p.add_argument("--dp", type=count(1), default=None, metavar="N",
                   help="with --training: plan one of N data-parallel ranks (its batch is --batch / --input)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="with --dp: ZeRO stage, 1 sharding the optimizer state, 2 the gradients too, 3 the params too "
                        "(default 0)")
    p.add_argument("--tp", type=count(1), default=None, metavar="N",
                   help="with --training: plan one of N tensor-parallel ranks splitting each transformer block's "
                        "linear layers and attention heads (Megatron's); the step's ranks are --dp x --tp")
    p.add_argument("--pp", type=count(1), default=None, metavar="N",
                   help="with --training: cut the step into N pipeline stages (1F1B) and plan one of them, --stage")
    p.add_argument("--microbatches", type=count(1), default=None, metavar="M",
                   help="with --training: run each step's batch as M microbatches, --batch / --input being one "
                        "microbatch's (gradient accumulation; the pipeline's microbatches with --pp)")
    p.add_argument("--stage", type=int, default=None, metavar="S",
                   help="with --pp: the pipeline stage to plan, 0 to N - 1 (default 0; report lists every stage's)")
    p.add_argument("--shard", choices=("flat", "dim0"), default="flat",
                   help="with --dp: cut shards evenly (flat, DeepSpeed) or in rows of the first dim (dim0, FSDP2)")
    p.add_argument("--prefetch", type=int, default=0, metavar="N",
                   help="with --zero 3: all-gather each param N gathers ahead of its first reader (default 0)")
    p.add_argument("--bucket", default=None, metavar="SIZE",
                   help="with --dp: reduce the gradients in buckets of SIZE (e.g. 25MiB, PyTorch DDP's bucket_cap_mb; "
                        "default each gradient alone)")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="with --training: the least recomputation whose arena fits SIZE (e.g. 2GiB)")
    p.add_argument("--workspace-mode", choices=("pool", "tensor"), default=None,
                   help="op scratch as shared slots kept for the run (pool, MXNet's) or one-step tensors (tensor); "
                        "default MEMPLAN_WORKSPACE_MODE or pool")
    p.add_argument("--schedule", choices=SCHEDULES, default="auto",
                   help="the file's order, a memory-aware order, or the better of both (auto)")
    p.add_argument("--precision", choices=[*PRECISIONS, "all"], default="fp32",
                   help="compute in fp32, in fp16 or bf16 throughout, or by autocast's policy with fp32 master "
                        "weights (amp-fp16, amp-bf16); report --precision all shows them side by side")
    if one_strategy:
        p.add_argument("--strategy", choices=list(STRATEGIES), default="bestfit")


class Parser(argparse.ArgumentParser):
    """argparse with the one-line errors of every other user mistake (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _output_args(p):
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON instead of a table")
    form.add_argument("--csv", action="store_true", help="print the rows as CSV instead of a table")
    p.add_argument("-o", "--output", default=None, help="write the result to this file instead of stdout")


def build_parser():
    from .compiler import STRATEGIES
    parser = Parser(prog="memplan", description="Static memory planning for computation graphs.",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name, help, run, one_strategy=True):
        p = sub.add_parser(name, help=help, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
        _model_args(p, one_strategy)
        p.set_defaults(run=run)
        return p

    p = command("inspect", "shapes, dtypes and sizes of every tensor", inspect)
    p.add_argument("--top", type=count(0), default=5, help="how many of the largest activations to list")
    p = command("report", "peak memory under each strategy", report, one_strategy=False)
    p.add_argument("--strategy", choices=list(STRATEGIES), nargs="+", default=None,
                   help="only these rows (naive and bestfit are always shown)")
    p.add_argument("--time-limit", type=seconds, default=2.0, help="seconds for each optimal search: the allocator, each try of --remat optimal (default 2)")
    _output_args(p)
    p = command("plan", "write a verified plan as JSON", plan)
    p.add_argument("-o", "--output", required=True, help="where to write the plan (.json; values go beside it as .npz)")
    p = command("viz", "draw the memory timeline (and the graph) as SVG or PNG", viz)
    p.add_argument("-o", "--output", default="timeline.svg", help="the timeline picture (.svg or .png)")
    p.add_argument("--graph", default=None, metavar="PATH", help="also draw the computation graph (.svg or .png)")
    p.add_argument("--max-nodes", type=count(1), default=200, help="collapse runs of steps above this many graph nodes")
    p = command("max-batch", "the largest batch each strategy fits in --budget", max_batch, one_strategy=False)
    p.add_argument("--strategy", choices=[s for s in STRATEGIES if s != "optimal"], nargs="+",
                   default=["naive", "inplace", "share", "bestfit"], help="strategies to search")
    _output_args(p)
    p = command("fit", "the largest global batch each parallel layout trains on --gpus devices of --memory",
                fit)
    p.add_argument("--gpus", type=count(1), required=True, help="how many devices")
    p.add_argument("--memory", required=True, metavar="SIZE", help="the memory of each device, e.g. 80GiB")
    p.add_argument("--workers", type=count(1), default=None,
                   help="processes sharing the search, at most 2 (default: one per core; the answers are the "
                        "same)")
    _output_args(p)
    p = command("run", "run the planned graph out of one arena and time it", run)
    p.add_argument("--backend", choices=["numpy", "cupy", "auto"], default="auto")
    p.add_argument("--repeat", type=count(1), default=10, help="timed runs after one warm-up (default 10)")
    p.add_argument("--threads", type=count(1), default=None,
                   help="host BLAS threads during the run (default: the BLAS library's choice, one per core)")
    p.add_argument("--no-jit", action="store_true",
                   help="numpy backend: the NumPy kernels alone, not numba's compiled ones (also MEMPLAN_JIT=0)")
    p.add_argument("--profile", action="store_true",
                   help="time each step (synchronising after it) and print the time per op type and the slowest steps")
    p.add_argument("--cuda-graph", action="store_true",
                   help="cupy backend: capture the plan once as a CUDA graph and replay it on every later run")
    p.add_argument("--tf32", action="store_true",
                   help="cupy backend: let fp32 GEMMs and convolutions round to TF32 on the tensor cores (default off)")
    p.add_argument("--top", type=count(1), default=10, help="how many of the slowest steps --profile lists (default 10)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model == DEFAULT_MODEL and args.batch is None and not args.input:
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
