"""The `memplan` command line. Every user mistake ends in one line on stderr and exit status 2."""
import argparse
import json
import os
import re
import sys

from .errors import MemplanError

DEFAULT_MODEL = "zoo:resnet50"

EXAMPLES = """examples:
  memplan inspect                                   # the built-in default model (zoo:resnet50, batch 1)
  memplan report zoo:resnet50 --batch 32            # arena per strategy and the lower bound
  memplan report zoo:resnet50 --batch 32 --training --loss cross_entropy --optimizer adam
  memplan run zoo:resnet_deep --batch 8 --training --remat sublinear --backend numpy
  memplan plan zoo:gpt2_small --input input_ids:8x128 --strategy share -o plan.json
  memplan inspect zoo:bert_base --batch 8 --input input_ids:8x128 --input attention_mask:8x128
  memplan inspect model.onnx --input input:8x3x224x224
  memplan viz zoo:lenet --batch 8 --training -o timeline.svg --graph graph.svg
  memplan max-batch zoo:resnet50 --budget 16GiB --training --optimizer adam
"""


def parse_input(text):
    """'NAME:8x3x224x224' -> ('NAME', (8, 3, 224, 224))."""
    m = re.fullmatch(r"(.+):(\d+(?:x\d+)*)", text)
    if not m:
        raise MemplanError(f"--input {text!r}: expected NAME:DIMS, e.g. --input input:8x3x224x224")
    return m.group(1), tuple(int(d) for d in m.group(2).split("x"))


def input_shapes(graph, inputs, batch):
    """Shapes from --input flags; --batch fills the first dim of every other input whose rest is known."""
    shapes = dict(parse_input(text) for text in inputs)
    if batch is not None:
        for name in graph.inputs:
            declared = graph.tensors[name].shape
            if name not in shapes and declared and all(isinstance(d, int) for d in declared[1:]):
                shapes[name] = (batch, *declared[1:])
    return shapes


def _mib(n):
    return f"{n / 2**20:,.2f} MiB"


def load_graph(args):
    """The typed graph of args.model with the shapes from --input and --batch."""
    from frontends import read
    from .shapes import infer
    raw = read(args.model)
    return infer(raw, input_shapes(raw, args.input, args.batch))


def inspect(args):
    """Print the typed graph: inputs, outputs, op counts, parameter and activation bytes."""
    graph = load_graph(args)
    kinds = {}
    for t in graph.tensors.values():
        kinds.setdefault(t.kind, []).append(t)
    print(graph.summary())
    for name in graph.inputs + graph.outputs:
        t = graph.tensors[name]
        print(f"  {t.kind:<6} {name}: {t.shape} {t.dtype}")
    for kind in ("param", "const", "activation", "output"):
        ts = kinds.get(kind, [])
        print(f"  {kind + 's':<12} {len(ts):>6} tensors {_mib(sum(t.nbytes for t in ts)):>14}")
    largest = sorted(kinds.get("activation", []), key=lambda t: -t.nbytes)[:args.top]
    if largest:
        print("  largest activations:")
        for t in largest:
            print(f"    {t.name}: {t.shape} {t.dtype} {_mib(t.nbytes)}")
    return 0


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text):
    """'2GiB' -> 2147483648; '1.5 GB' -> 1500000000; '4096' -> 4096."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise MemplanError(f"--budget {text!r}: expected a size such as 2GiB, 512MiB, 1.5GB or 4096 (bytes)")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def training_options(args):
    """compile()'s training keywords from --training, --loss, --optimizer and --lr."""
    if not args.training:
        if args.loss or args.optimizer or args.lr is not None or args.remat or args.budget:
            raise MemplanError("--loss, --optimizer, --lr, --remat and --budget apply with --training")
        return {}
    return {"training": True, "loss": args.loss or "cross_entropy", "optimizer": args.optimizer or "sgd",
            "optimizer_args": {} if args.lr is None else {"lr": args.lr}, "remat": args.remat,
            "memory_budget": None if args.budget is None else parse_bytes(args.budget)}


def report(args):
    """Print one row per strategy: arena, x LOAD, saving vs naive, plan time (and the breakdown when training)."""
    from . import report as rep
    training = training_options(args)
    graph = load_graph(args)
    recompute = {k: training.pop(k) for k in ("remat", "memory_budget") if k in training}
    rows = rep.report(graph, time_limit=args.time_limit, schedule=args.schedule, strategies=args.strategy, **training)
    modes = rep.workspace_modes(graph, schedule=args.schedule, **training)
    updates = rep.update_modes(graph, schedule=args.schedule, **training) if training else None
    remats = rep.remat_modes(graph, schedule=args.schedule, memory_budget=recompute.get("memory_budget"),
                             **training) if training else None
    budget = recompute.get("memory_budget")
    doc = rep.as_dict(rows, graph, modes, updates, remats, budget)
    emit(args, json.dumps(doc, indent=1) if args.json else as_csv(doc["rows"]) if args.csv
         else rep.format_table(rows, graph, modes, updates, remats, budget))
    return 0


def plan(args):
    """Compile one plan, verify it and write it as JSON (params and consts beside it, .npz)."""
    from .compiler import compile
    result = compile(load_graph(args), strategy=args.strategy, schedule=args.schedule, **training_options(args))
    path = result.to_json(args.output)
    print(f"{path}: {result.strategy}, {result.schedule} schedule, arena {_mib(result.arena_bytes)} "
          f"(LOAD {_mib(result.lower_bound_bytes)}), {len(result.steps)} steps, {len(result.tensors)} tensors")
    return 0


def run(args):
    """Plan, then run on random feeds: median latency, arena bytes and the memory the run grew by."""
    import resource
    import time

    import numpy as np

    from executor import Executor, backends
    from .compiler import compile
    plan = compile(load_graph(args), strategy=args.strategy, **training_options(args))
    rng = np.random.default_rng(0)
    scalars = (plan.training.get("lr"), plan.training.get("step"))
    feeds = {n: (rng.standard_normal(plan.tensors[n].shape).astype(plan.tensors[n].dtype)
                 if np.dtype(plan.tensors[n].dtype).kind == "f" else np.zeros(plan.tensors[n].shape, plan.tensors[n].dtype))
             for n in plan.inputs if n not in scalars}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    device_before = backends.get(args.backend).used_bytes()
    ex = Executor(plan, backend=args.backend)
    times = []
    for _ in range(args.repeat + 1):
        start = time.perf_counter()
        ex.train_step(feeds) if plan.training else ex.run(feeds)
        times.append(time.perf_counter() - start)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    device = ex.backend.used_bytes()
    peak = f"device bytes in use {_mib(device)}" if device is not None else f"RSS grew {_mib(max(grown, 0))}"
    print(f"{plan.strategy} on {ex.backend.NAME}: median {1e3 * sorted(times[1:])[len(times[1:]) // 2]:.2f} ms over "
          f"{args.repeat} runs; arena {_mib(plan.arena_bytes)}; {peak}"
          + (f" ({_mib(device_before)} before the executor)" if device is not None else ""))
    return 0


def viz(args):
    """Draw the plan's memory timeline (and with --graph its computation graph) through graphviz."""
    from . import viz as pictures
    from .compiler import compile
    result = compile(load_graph(args), strategy=args.strategy, schedule=args.schedule, **training_options(args))
    written = [pictures.timeline(result, args.output)]
    if args.graph:
        written.append(pictures.graph_view(result, args.graph, max_nodes=args.max_nodes))
    print(f"{', '.join(written)}: {result.strategy}, {result.schedule} schedule, arena {_mib(result.arena_bytes)} "
          f"(LOAD {_mib(result.lower_bound_bytes)}), {len(result.steps)} steps")
    return 0


def max_batch(args):
    """For each strategy (and with --training each recomputation), the largest batch whose arena fits --budget."""
    from . import maxbatch
    from .compiler import compile
    from frontends import read
    from .shapes import infer
    budget = parse_bytes(args.budget)
    args.budget = None
    training = training_options(args)
    raw = read(args.model)
    given = dict(parse_input(text) for text in args.input)

    def compile_at(batch, **options):
        shapes = {**input_shapes(raw, [], batch), **{n: (batch, *s[1:]) for n, s in given.items()}}
        return compile(infer(raw, shapes), schedule=args.schedule, **{**training, **options})

    rows = [(s, {"strategy": s}) for s in args.strategy]
    if training:
        rows += [(f"bestfit + {r}", {"remat": r}) for r in ("mirror", "sublinear")]
    results = maxbatch.table(compile_at, budget, rows, maxbatch.tty_progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    rows = [{"strategy": label, "max_batch": batch, "arena_bytes": plan.arena_bytes if plan else None}
            for label, batch, plan in results]
    if args.json or args.csv:
        emit(args, json.dumps({"model": args.model, "budget_bytes": budget, "rows": rows}, indent=1) if args.json
             else as_csv(rows))
        return 0
    lines = [f"{args.model}: the largest batch whose {'training step' if training else 'plan'} fits {_mib(budget)}",
             f"{'strategy':<22} {'max batch':>9} {'arena MiB':>11}"]
    lines += [f"{r['strategy']:<22} {r['max_batch']:>9} {(r['arena_bytes'] or 0) / 2**20:>11,.2f}" for r in rows]
    emit(args, "\n".join(lines))
    return 0


def _model_args(p):
    from .losses import LOSSES
    from .remat import REMATS
    from .training import OPTIMIZERS
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="an .onnx file or zoo:NAME")
    p.add_argument("--input", action="append", default=[], metavar="NAME:DIMS", help="bind an input, e.g. input:8x3x224x224")
    p.add_argument("--batch", type=int, default=None, help="batch size for inputs whose other dims are known")
    p.add_argument("--training", action="store_true", help="plan a training step: forward, loss, backward, optimizer")
    p.add_argument("--loss", choices=LOSSES, default=None, help="the loss on the first output (default cross_entropy)")
    p.add_argument("--optimizer", choices=list(OPTIMIZERS), default=None, help="the optimizer (default sgd)")
    p.add_argument("--lr", type=float, default=None, help="the learning rate (default: the optimizer's)")
    p.add_argument("--remat", choices=REMATS, default=None, help="recompute forward tensors in backward")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="with --training: the least recomputation whose arena fits SIZE (e.g. 2GiB)")


class Parser(argparse.ArgumentParser):
    """argparse with the one-line errors of every other user mistake (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def emit(args, text):
    """Print the command's result, or write it to -o when given."""
    if getattr(args, "output", None):
        with open(args.output, "w") as f:
            f.write(text + "\n")
        print(f"wrote {args.output}")
    else:
        print(text)


def as_csv(rows):
    """Rows (dicts with the same keys) as CSV text; nested values are written as JSON."""
    import csv
    import io
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in row.items()} for row in rows)
    return out.getvalue().rstrip("\n")


def _output_args(p):
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON instead of a table")
    form.add_argument("--csv", action="store_true", help="print the rows as CSV instead of a table")
    p.add_argument("-o", "--output", default=None, help="write the result to this file instead of stdout")


def build_parser():
    from .compiler import SCHEDULES, STRATEGIES
    parser = Parser(prog="memplan", description="Static memory planning for computation graphs.",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser("inspect", help="shapes, dtypes and sizes of every tensor", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(p)
    p.add_argument("--top", type=int, default=5, help="how many of the largest activations to list")
    p.set_defaults(run=inspect)
    p = sub.add_parser("report", help="peak memory under each strategy", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(p)
    p.add_argument("--schedule", choices=SCHEDULES, default="auto")
    p.add_argument("--strategy", choices=list(STRATEGIES), nargs="+", default=None,
                   help="only these rows (naive and bestfit are always shown)")
    p.add_argument("--time-limit", type=float, default=2.0, help="seconds for the optimal search (default 2)")
    _output_args(p)
    p.set_defaults(run=report)
    p = sub.add_parser("plan", help="write a verified plan as JSON")
    _model_args(p)
    p.add_argument("--strategy", choices=list(STRATEGIES), default="bestfit")
    p.add_argument("--schedule", choices=SCHEDULES, default="auto")
    p.add_argument("-o", "--output", required=True, help="where to write the plan (.json; values go beside it as .npz)")
    p.set_defaults(run=plan)
    p = sub.add_parser("viz", help="draw the memory timeline (and the graph) as SVG or PNG", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(p)
    p.add_argument("--strategy", choices=list(STRATEGIES), default="bestfit")
    p.add_argument("--schedule", choices=SCHEDULES, default="auto")
    p.add_argument("-o", "--output", default="timeline.svg", help="the timeline picture (.svg or .png)")
    p.add_argument("--graph", default=None, metavar="PATH", help="also draw the computation graph (.svg or .png)")
    p.add_argument("--max-nodes", type=int, default=200, help="collapse runs of steps above this many graph nodes")
    p.set_defaults(run=viz)
    p = sub.add_parser("max-batch", help="the largest batch each strategy fits in --budget", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(p)
    p.add_argument("--strategy", choices=[s for s in STRATEGIES if s != "optimal"], nargs="+",
                   default=["naive", "inplace", "share", "bestfit"], help="strategies to search")
    p.add_argument("--schedule", choices=SCHEDULES, default="auto")
    _output_args(p)
    p.set_defaults(run=max_batch)
    p = sub.add_parser("run", help="run the planned graph out of one arena and time it")
    _model_args(p)
    p.add_argument("--strategy", choices=list(STRATEGIES), default="bestfit")
    p.add_argument("--backend", choices=["numpy", "cupy", "auto"], default="auto")
    p.add_argument("--repeat", type=int, default=10, help="timed runs after one warm-up (default 10)")
    p.set_defaults(run=run)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model == DEFAULT_MODEL and args.batch is None and not args.input:
        args.batch = 1
    try:
        return args.run(args)
    except MemplanError as e:
        print(f"memplan: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader (head, less) stopped early; Python docs' recipe for a quiet exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
