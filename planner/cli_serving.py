"""The serving commands of `memplan` (planner/cli.py): `report --serve`, `max-batch --serve` and `generate`, which
plan an export with a cache as a planner.Generation (prefill and decode in one arena) and run it."""
import json
import time

from .errors import MemplanError
from .outputs import as_csv, emit
from .progress import Progress
from .units import format_bytes


def report(args, config):
    """`memplan report --serve`: one row per precision of serving (planner.serving), planned under `config`."""
    from .serving import Serving, ServingRow
    generation, precisions = serving_args(args)
    lengths = _lengths(args.lengths, generation.max_length)
    rows, notes = [], []
    for precision in precisions:
        try:
            rows.append(ServingRow.of(precision, serving_plan(args, generation, precision, config)))
        except MemplanError as e:
            if len(precisions) == 1:
                raise
            notes.append(f"left out {precision}: {e}")
    if not rows:
        raise MemplanError(notes[0].split(": ", 1)[1])
    result = Serving(args.model, generation, rows, lengths, notes)
    emit(args, json.dumps(result.as_dict(), indent=1) if args.json else as_csv(result.csv_rows()) if args.csv
         else result.table())
    return 0


def serving_args(args, batch=None):
    """(the Generation, the precisions) of a --serve command, its other flags refused."""
    from .generation import Generation
    if args.context is None:
        raise MemplanError("--serve needs the positions each sequence holds: --context L, e.g. --context 8192")
    if args.training or args.input or args.tp:
        raise MemplanError("--serve plans inference on one device from --batch, --context and --prompt: --training, "
                           "--input and --tp do not apply")
    prompt = args.prompt or max(args.context // 2, 1)
    generation = Generation(batch=batch or args.batch or 1, max_length=args.context, prompt=prompt)
    return generation, ("fp32", "fp16", "bf16") if args.precision == "all" else (args.precision,)


def serving_plan(args, generation, precision, config):
    """The GenerationPlan of args.model serving `generation` in `precision`, under `config` (a planner.Config), by
    the last --strategy given (default auto)."""
    from .compiler import compile
    strategy = (args.strategy[-1] if isinstance(args.strategy, list) else args.strategy) or "auto"
    return compile(args.model, generation=generation, strategy=strategy, schedule=args.schedule,
                   config=config, weights=not args.no_weights,
                   **({} if precision == "fp32" else {"precision": precision}))


def _lengths(text, context):
    """--lengths as ints, each from 1 to the context."""
    if text is None:
        return []
    try:
        lengths = [int(n) for n in text.split(",")]
    except ValueError:
        raise MemplanError(f"--lengths {text!r}: expected numbers of positions separated by commas") from None
    if not all(1 <= n <= context for n in lengths):
        raise MemplanError(f"--lengths: each length must be from 1 to --context {context}, got {text}")
    return lengths


def max_batch(args, budget, config):
    """The most sequences served at once whose GenerationPlan fits `budget`, per precision."""
    from dataclasses import replace
    from . import maxbatch
    generation, precisions = serving_args(args, batch=1)
    rows = []
    with Progress("memplan max-batch --serve", total=len(precisions)) as bar:
        for k, precision in enumerate(precisions, 1):
            plans = {}

            def size(batch):
                plans[batch] = serving_plan(args, replace(generation, batch=batch), precision, config)
                return plans[batch].arena_bytes
            batch, _ = maxbatch.largest(size, budget, lambda b: bar.update(k, f"{precision}: {b} sequences"))
            found = plans.get(batch) or plans[1]
            rows.append({"precision": precision, "max_sequences": batch, "arena_bytes": found.arena_bytes,
                         "kv_cache_bytes": found.cache_bytes, "weights_bytes": found.weights_bytes})
    if args.json or args.csv:
        emit(args, json.dumps({"model": args.model, "budget_bytes": budget, "context": generation.max_length,
                               "prompt": generation.prompt, "rows": rows}, indent=1) if args.json else as_csv(rows))
        return 0
    lines = [f"{args.model}: the most sequences of {generation.max_length} positions (prompts of {generation.prompt}) "
             f"served at once in {format_bytes(budget)}",
             f"{'precision':<10} {'sequences':>9} {'arena':>12} {'KV cache':>12} {'weights':>12}"]
    lines += [f"{r['precision']:<10} {r['max_sequences']:>9} {_size(r['arena_bytes']):>12} "
              f"{_size(r['kv_cache_bytes']):>12} {_size(r['weights_bytes']):>12}" for r in rows]
    if any(not r["max_sequences"] for r in rows):
        lines.append("note: a row serving no sequence shows the arena of one")
    emit(args, "\n".join(lines))
    return 0


def _size(nbytes):
    return "-" if nbytes is None else format_bytes(nbytes)


def generate(args, config):
    """`memplan generate`: greedy tokens after each --ids prompt, decoded from one arena, and the time a token took."""
    from .generation import Generation
    from executor.generator import Generator
    if not args.ids:
        raise MemplanError("generate needs a prompt: --ids 1,15,27 (token ids; repeat --ids for more sequences)")
    if args.training or args.input or args.tp or args.precision == "all":
        raise MemplanError("generate runs one precision's inference on one device: --training, --input, --tp and "
                           "--precision all do not apply")
    prompts = [_ids(text) for text in args.ids]
    longest = max(map(len, prompts))
    context = args.context or longest + args.max_new_tokens - 1
    generation = Generation(batch=len(prompts), max_length=context, prompt=args.prompt or longest)
    plan = serving_plan(args, generation, args.precision, config)
    gen = Generator(plan, args.backend, config=config, threads=args.threads, jit=False if args.no_jit else True)
    print(f"{args.model}: {len(prompts)} prompt{'s' * (len(prompts) > 1)} of up to {generation.prompt} tokens, "
          f"{args.max_new_tokens} new, cache of {context} positions; arena {format_bytes(plan.arena_bytes)} "
          f"(weights {format_bytes(plan.weights_bytes)}, KV cache {format_bytes(plan.cache_bytes)})")
    start = time.perf_counter()
    tokens = gen.generate(prompts, args.max_new_tokens, eos_token_id=args.eos)
    seconds = time.perf_counter() - start
    for k, row in enumerate(tokens):
        print(f"{k}: {','.join(map(str, row))}")
    print(f"{seconds / args.max_new_tokens * 1e3:.2f} ms a token ({args.max_new_tokens} tokens, prefill included) on "
          f"{gen.decode.backend.NAME}")
    return 0


def _ids(text):
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise MemplanError(f"--ids {text!r}: expected token ids separated by commas, e.g. --ids 1,15,27") from None
    if not ids or min(ids) < 0:
        raise MemplanError(f"--ids {text!r}: token ids are ints >= 0")
    return ids
