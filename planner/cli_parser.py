"""The `memplan` command line's arguments: each command's flags, its own examples in its --help, and one-line
errors (exit status 2) that suggest the flag a misspelled one meant."""
import argparse
import difflib
import math
import re

DEFAULT_MODEL = "zoo:resnet50"
EXAMPLES = {
    "inspect": ["memplan inspect zoo:bert_base --input input_ids:8x128 --input attention_mask:8x128",
                "memplan inspect model.onnx --input input:8x3x224x224"],
    "report": ["memplan report                                    # the built-in default model (zoo:resnet50, batch 1)",
               "memplan report zoo:resnet50 --batch 32            # arena per strategy and the lower bound",
               "memplan report zoo:lenet --batch 16 --training --optimizer adam --budget 2.75MiB",
               "memplan report zoo:resnet50 --batch 32 --training --swap --device-model a100",
               "memplan report model_with_past.onnx --serve --batch 8 --context 8192 --precision all"],
    "plan": ["memplan plan zoo:gpt2_small --input input_ids:8x128 --strategy share -o plan.json"],
    "viz": ["memplan viz zoo:lenet --batch 8 --training -o timeline.svg --graph graph.svg"],
    "max-batch": ["memplan max-batch zoo:lenet --budget 64MiB --training --optimizer adam",
                  "memplan max-batch model_with_past.onnx --serve --context 8192 --budget 80GiB --precision bf16"],
    "fit": ["memplan fit zoo:resnet50 --batch 8 --gpus 8 --memory 16GiB --optimizer adam",
            "memplan fit config.json --input input_ids:1x8192 --precision amp-bf16 --optimizer adamw --gpus 64 "
            "--memory 80GiB --tp 8  # only the layouts of 8 tensor-parallel ranks"],
    "calibrate": ["memplan calibrate --backend cupy -o h100.json",
                  "memplan report zoo:resnet50 --batch 32 --training --swap --device-model h100.json"],
    "generate": ["memplan generate model_with_past.onnx --ids 1,15,27 --ids 1,9 --max-new-tokens 64"],
    "run": ["memplan run zoo:lenet --batch 8 --training --remat sublinear --repeat 3",
            "memplan run zoo:resnet50 --batch 8 --profile      # time per op type and the slowest steps"],
}
"""Each command's examples, shown in its --help; `memplan --help` shows the first of each."""


def examples(lines):
    """An --help epilog of example command lines."""
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)


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
    from .losses import LOSSES
    from .options import IGNORE_INDEX, OFFLOADS
    from .precision import PRECISIONS
    from .remat import REMATS
    from .optimizers import OPTIMIZERS
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL,
                   help="an .onnx file, zoo:NAME, a transformers config.json or hf:MODEL_ID (built without weights)")
    p.add_argument("--no-weights", action="store_true",
                   help="plan from the weights' shapes alone: external data is not read (whether it is there or not)")
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
    p.add_argument("--offload", choices=OFFLOADS, default=None,
                   help="with --training: hold the optimizer's state and master weights in host memory and update "
                        "there (ZeRO-Offload), gradients copied out and params back each step")
    p.add_argument("--dp", type=count(1), default=None, metavar="N",
                   help="with --training: plan one of N data-parallel ranks (its batch is --batch / --input)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="with --dp: ZeRO stage, 1 sharding the optimizer state, 2 the gradients too, 3 the params too "
                        "(default 0)")
    p.add_argument("--tp", type=count(1), default=None, metavar="N",
                   help="plan one of N tensor-parallel ranks splitting each transformer block's linear layers and "
                        "attention heads (Megatron's); with --training the step's ranks are --dp x --tp")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="with --tp: run the norms, residual adds and dropouts between the split layers on 1/N of the "
                        "sequence on each rank (Megatron's sequence parallelism)")
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
    p.add_argument("--sync-batchnorm", action="store_true",
                   help="with --dp: normalise BatchNormalization by the statistics of the whole batch of the ranks, "
                        "all-reduced (PyTorch's SyncBatchNorm); without it each rank normalises its own rows (DDP's)")
    p.add_argument("--bucket", default=None, metavar="SIZE",
                   help="with --dp: reduce the gradients in buckets of SIZE (e.g. 25MiB, PyTorch DDP's bucket_cap_mb; "
                        "default each gradient alone)")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="with --training: the least recomputation whose arena fits SIZE (e.g. 2GiB)")
    p.add_argument("--device-model", default=None, metavar="NAME",
                   help="the time model host copies are placed by: cpu, v100, a100, h100, h200 or a file of "
                        "`memplan calibrate` (default MEMPLAN_DEVICE_MODEL, else h100 for cuda, cpu otherwise)")
    p.add_argument("--link", default=None, metavar="SIZE",
                   help="bytes a second the host link copies each way (default MEMPLAN_LINK_BANDWIDTH or 25GB, "
                        "PCIe 4 x16)")
    p.add_argument("--workspace-mode", choices=("auto", "pool", "tensor"), default=None,
                   help="op scratch as shared slots kept for the run (pool, MXNet's), one-step tensors (tensor), "
                        "or whichever plans the smaller arena (auto); default MEMPLAN_WORKSPACE_MODE or auto")
    p.add_argument("--schedule", choices=SCHEDULES, default="auto",
                   help="the file's order, a memory-aware order, or the better of both (auto)")
    p.add_argument("--precision", choices=[*PRECISIONS, "all"], default="fp32",
                   help="compute in fp32, in fp16 or bf16 throughout, or by autocast's policy with fp32 master "
                        "weights (amp-fp16, amp-bf16); report --precision all shows them side by side")
    if one_strategy:
        p.add_argument("--strategy", choices=list(STRATEGIES), default="auto")


class Parser(argparse.ArgumentParser):
    """argparse with the one-line errors of every other user mistake (exit status 2); a flag the command does not
    know is named with the closest one it does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = {}

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = self.commands.get(getattr(parsed, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(unknown)}{command.suggestion(unknown)}")
        return parsed

    def suggestion(self, unknown):
        """'; did you mean --budget?' for the first of `unknown` that is close to one of this parser's flags."""
        flags = set(re.findall(r"--[\w-]+", self.format_usage()))
        for word in unknown:
            close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if word.startswith("-") and close:
                return f"; did you mean {close[0]}?"
        return ""


def _output_args(p):
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON instead of a table")
    form.add_argument("--csv", action="store_true", help="print the rows as CSV instead of a table")
    p.add_argument("-o", "--output", default=None, help="write the result to this file instead of stdout")


def _serve_args(p):
    p.add_argument("--serve", action="store_true",
                   help="plan serving a causal LM exported with a cache (past key/values in, present out): prefill and "
                        "decode over a static KV cache in one arena, --batch sequences of --context positions")
    p.add_argument("--context", type=count(2), default=None, metavar="L",
                   help="with --serve: the positions each sequence holds in the cache (prompt and generated tokens)")
    p.add_argument("--prompt", type=count(1), default=None, metavar="P",
                   help="with --serve: the prompt's tokens, which prefill runs at once (default half of --context)")


def build_parser(commands):
    """The parser of every command; `commands` maps each name to the function that runs it (on the args)."""
    from .compiler import STRATEGIES
    from .config import Config
    parser = Parser(prog="memplan", description="Static memory planning for computation graphs.",
                    epilog=examples(lines[0] for lines in EXAMPLES.values()),
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name, help, one_strategy=True):
        p = sub.add_parser(name, help=help, epilog=examples(EXAMPLES[name]),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _model_args(p, one_strategy)
        p.set_defaults(run=commands[name])
        parser.commands[name] = p
        return p

    p = command("inspect", "shapes, dtypes and sizes of every tensor")
    p.add_argument("--top", type=count(0), default=5, help="how many of the largest activations to list")
    p = command("report", "peak memory under each strategy", one_strategy=False)
    p.add_argument("--strategy", choices=list(STRATEGIES), nargs="+", default=None,
                   help="only these rows (naive and bestfit are always shown)")
    p.add_argument("--time-limit", type=seconds, default=None,
                   help="seconds for each optimal search: the allocator, each try of --remat optimal (default "
                        f"MEMPLAN_TIME_LIMIT or {Config.time_limit:g})")
    p.add_argument("--swap", action="store_true",
                   help="with --training: keep, recompute, swap to host memory, and both chosen together, side by "
                        "side under --budget (default half the arena of keeping everything), with modeled step times")
    _serve_args(p)
    p.add_argument("--lengths", default=None, metavar="N,N,...",
                   help="with --serve: also the KV cache of sequences of these lengths in a paged cache (blocks of 16 "
                        "tokens, vLLM's)")
    _output_args(p)
    p = command("plan", "write a verified plan as JSON")
    p.add_argument("-o", "--output", required=True, help="where to write the plan (.json; values go beside it as .npz)")
    p = command("viz", "draw the memory timeline (and the graph) as SVG or PNG")
    p.add_argument("-o", "--output", default="timeline.svg", help="the timeline picture (.svg or .png)")
    p.add_argument("--graph", default=None, metavar="PATH", help="also draw the computation graph (.svg or .png)")
    p.add_argument("--max-nodes", type=count(1), default=200, help="collapse runs of steps above this many graph nodes")
    p = command("max-batch", "the largest batch each strategy fits in --budget", one_strategy=False)
    p.add_argument("--strategy", choices=[s for s in STRATEGIES if s != "optimal"], nargs="+",
                   default=["naive", "inplace", "share", "bestfit", "auto"],
                   help="strategies to search (recomputation rows take the last)")
    _serve_args(p)
    _output_args(p)
    p = command("fit", "the largest global batch each parallel layout trains on --gpus devices of --memory "
                       "(--dp, --tp, --pp, --zero and --remat, where given, keep the layouts that have them)")
    p.add_argument("--gpus", type=count(1), required=True, help="how many devices")
    p.add_argument("--memory", required=True, metavar="SIZE", help="the memory of each device, e.g. 80GiB")
    p.add_argument("--workers", type=count(1), default=None,
                   help="processes sharing the search, at most 2 (default: one per core; the answers are the "
                        "same)")
    _output_args(p)
    p = command("generate", "greedy tokens from a causal LM exported with a cache, decoded out of one arena")
    p.add_argument("--ids", action="append", default=[], metavar="N,N,...",
                   help="a prompt's token ids (repeat for more sequences, decoded together)")
    p.add_argument("--max-new-tokens", type=count(1), default=32, help="tokens to generate (default 32)")
    p.add_argument("--eos", type=int, default=None, metavar="ID", help="the end-of-sequence token, after which a "
                   "sequence gives the pad token 0")
    p.add_argument("--context", type=count(2), default=None, metavar="L",
                   help="the cache's positions (default: the longest prompt and the new tokens)")
    p.add_argument("--prompt", type=count(1), default=None, metavar="P",
                   help="the prompt length planned (default the longest prompt's)")
    p.add_argument("--backend", choices=["numpy", "cupy", "auto"], default="auto")
    p.add_argument("--threads", type=count(1), default=None, help="host BLAS threads during the run")
    p.add_argument("--no-jit", action="store_true", help="numpy backend: the NumPy kernels alone")
    p = sub.add_parser("calibrate", help="measure this machine's rates for the time model swapping places its "
                       "copies by (a GEMM, a copy, a launch)", epilog=examples(EXAMPLES["calibrate"]),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["numpy", "cupy", "auto"], default="auto")
    p.add_argument("--name", default=None, help="the model's name (default the backend's)")
    p.add_argument("-o", "--output", default=None,
                   help="write the model as JSON, for --device-model FILE (default: print it)")
    p.set_defaults(run=commands["calibrate"])
    parser.commands["calibrate"] = p
    p = command("run", "run the planned graph out of one arena and time it")
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
