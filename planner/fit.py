"""`memplan fit`: how to train a model on N devices of one memory size. Each candidate layout (data
parallelism over all N at ZeRO stage 0 to 3; tensor parallelism over 2, 4 or 8 of them, a pipeline of 2 or 4
stages (8 too for a transformer, whose layers are many), or both, with ZeRO-1 over the rest as Megatron pairs
them with its distributed optimizer; tensor parallelism beside ZeRO-3; each without recomputation and with
it: sublinear, or Megatron's full for a transformer) gets the largest per-rank batch (a pipeline's
microbatch) whose rank plan fits the memory (a pipeline's fullest stage's); the table puts the largest global
batch first. A layout whose params and optimizer state alone cannot fit (`least_states`, a lower bound) is not
planned. A pipeline is planned with MICROBATCHES microbatches a stage: its memory grows from pp microbatches to
2 pp (the steady state runs forwards beside gradients being summed) and hardly after, so more microbatches give
a larger global batch and a smaller bubble at about the same memory. The layouts are dealt to CHAINS chains,
each searched in its own worker process where there are cores for them: the planner is pure Python, so this is
how a search uses more than one core."""
import math
import multiprocessing
import queue as queues
import signal
from dataclasses import replace

from . import forked, maxbatch, progress as progress_line
from .dtypes import is_float
from .errors import AboveLimitError, MemplanError
from .options import Precision
from .parallel import STAGES, Parallel
from .training import choose_params
from .units import format_bytes

REMATS = (None, "sublinear")
LAYER_REMATS = (None, "full")
"""The recomputations tried for a transformer: none, and Megatron's full (each layer from its input). Not its
selective: recomputing the attention core from Q, K and V is what memplan's fused attention does already (its
gradient op recomputes the scores tile by tile), so that it plans as without recomputation."""
TENSOR_PARALLEL = (2, 4, 8)
"""The tensor-parallel sizes tried: within one node's devices, as Megatron keeps them."""
PIPELINE = (2, 4)
LAYER_PIPELINE = (2, 4, 8)
"""The pipeline stages tried, and for a transformer."""
MICROBATCHES = 2
"""A pipeline's microbatches, per stage."""
CHAINS = 2
"""The chains of layouts a search is dealt to. Each layout's search starts from the answer of the one before
it in its chain, and a batch's arena is not always monotone (recomputation may pay at one batch and not
at a smaller one), so the answers depend on the chains: they are the same however many processes run."""


def model_parallel_sizes(compile_at, gpus, tensor=TENSOR_PARALLEL, pipeline=PIPELINE, fits=None, keep=None):
    """([tp], [pp], [note]): the sizes of `tensor` and `pipeline` (PIPELINE, or LAYER_PIPELINE for a transformer)
    that divide `gpus` and split the model (at batch 1: `compile_at.splits` where it has one, which runs the passes
    as far as the split, else planned), and why each other one that divides `gpus` does not (the error). A size
    none of whose layouts `keep(parallel)` keeps is left alone, and one none of whose kept layouts
    `fits(parallel)` (the params and optimizer state alone) is not tried."""
    found, refused, splits = {"tp": [], "pp": []}, {}, getattr(compile_at, "splits", compile_at)
    tensor, pipeline = [s for s in tensor if gpus % s == 0], [s for s in pipeline if gpus % s == 0]
    layouts = [o["parallel"] for _, o in candidates(gpus, tps=tensor, pps=pipeline, remats=(None,), keep=keep)]
    for kind, sizes in (("tp", tensor), ("pp", pipeline)):
        for size in sizes:
            if not any(getattr(p, kind) == size for p in layouts):
                continue
            if fits and not any(fits(p) for p in layouts if getattr(p, kind) == size):
                refused.setdefault((kind, "no layout of it holds the params and optimizer state"), []).append(str(size))
            else:
                try:
                    splits(1, parallel=_parallel(gpus, **{kind: size}), remat=None)
                    found[kind].append(size)
                except MemplanError as e:
                    refused.setdefault((kind, str(e)), []).append(str(size))
    return found["tp"], found["pp"], [f"no {kind} {', '.join(sizes)}: {reason}"
                                      for (kind, reason), sizes in refused.items()]


def _parallel(gpus, tp=1, pp=1, zero=None, shard="flat", prefetch=0, bucket_bytes=0, sync_batchnorm=False):
    """The Parallel of `gpus` ranks with `tp` and `pp` (ZeRO-1 over the data ranks where there are some
    beside them, unless `zero` says), MICROBATCHES a pipeline stage, and the rules that apply to it."""
    dp = gpus // tp // pp
    zero = (1 if dp > 1 else 0) if zero is None else zero
    return Parallel(dp=dp, tp=tp, pp=pp, microbatches=MICROBATCHES * pp if pp > 1 else 1, zero=zero,
                    shard=shard if zero else "flat", prefetch=prefetch if zero == 3 else 0,
                    bucket_bytes=bucket_bytes if dp > 1 else 0, sync_batchnorm=sync_batchnorm and dp > 1)


def candidates(gpus, shard="flat", prefetch=0, bucket_bytes=0, tps=(), pps=(), sync_batchnorm=False,
               remats=REMATS, keep=None, offload=False):
    """(label, compile options) of each layout of `gpus` ranks under each of `remats`, neighbours alike (each
    search starts from the one before): data-parallel at each ZeRO stage, then `tps` tensor-parallel ranks (with
    ZeRO-1, then ZeRO-3, over the rest), `pps` pipeline stages, and each pair of them that divides `gpus`;
    their shards cut by `shard` where they have shards, ZeRO-3's gathers `prefetch` ahead, their gradients
    reduced in buckets of `bucket_bytes`, BatchNormalization's statistics all-reduced over the data ranks where
    `sync_batchnorm` (planner.parallel); with `offload`, then each data-parallel layout without recomputation
    again with the optimizer offloaded to the host (ZeRO-Offload); only those whose Parallel `keep(parallel)` keeps,
    where given."""
    rows = []
    rules = {"shard": shard, "prefetch": prefetch, "bucket_bytes": bucket_bytes, "sync_batchnorm": sync_batchnorm}
    for remat in remats:
        layouts = [_parallel(gpus, zero=zero, **rules) for zero in STAGES]
        layouts += [_parallel(gpus, tp=tp, **rules) for tp in tps]
        layouts += [_parallel(gpus, tp=tp, zero=3, **rules) for tp in tps if gpus > tp]
        layouts += [_parallel(gpus, pp=pp, **rules) for pp in pps]
        layouts += [_parallel(gpus, tp=tp, pp=pp, **rules) for tp in tps for pp in pps if gpus % (tp * pp) == 0]
        layouts = [p for p in layouts if keep is None or keep(p)]
        rows += [(_label(p) + (f", {remat}" if remat else ""), {"parallel": p, "remat": remat}) for p in layouts]
    rows += [(f"{label}, offload", {**options, "offload": "optimizer"}) for label, options in list(rows)
             if offload and options["parallel"].tp == options["parallel"].pp == 1 and not options["remat"]]
    return rows


def param_sizes(graph, precision="fp32", frozen=(), trainable=()):
    """[(elements, bytes an element as `precision` stores it, trains)] of a typed graph's params: those a step
    training on its outputs updates (planner.training.choose_params) train."""
    trained = set(choose_params(graph, frozen, trainable, graph.outputs)[0])
    stored = Precision.parse(precision)
    low = stored.low if stored.low is not None and not stored.mixed else None
    return [(math.prod(t.shape), (low if low is not None and is_float(t.dtype) else t.dtype).itemsize,
             t.name in trained) for t in graph.params()]


def least_states(params, states):
    """f(parallel): bytes that a rank of the layout `parallel` holds at least whatever its batch: its share of the
    params and optimizer state. `params` is [(elements, bytes an element, trains)], `states` the optimizer's state
    tensors per trained param. The fullest stage holds at least 1/pp of the params and a tensor-parallel rank at
    least 1/tp of its stage's; ZeRO-1 divides the state by dp, ZeRO-3 the trained params too; an `offload`ed
    optimizer holds its state on the host; gradients, live
    for a moment under eager updates, and the activations count nothing here."""
    def least(parallel, offload=None):
        dp, share = parallel.dp, 1 / (parallel.tp * parallel.pp)
        total = 0.0
        for elements, itemsize, trains in params:
            held = 1 / dp if trains and parallel.zero == 3 else 1
            state = states * (1 / dp if parallel.zero else 1) if trains and not offload else 0
            total += elements * share * itemsize * (held + state)
        return int(total)
    return least


def _label(p):
    parts = [f"dp {p.dp}", *([f"tp {p.tp}"] if p.tp > 1 else []), *([f"pp {p.pp}"] if p.pp > 1 else [])]
    return " x ".join(parts) + f", ZeRO-{p.zero}" + (f", {p.microbatches} microbatches" if p.pp > 1 else "")


def search(compile_at, memory, layouts, progress=None, workers=1, least=None):
    """([(label, per-rank batch, global batch, the rank's arena bytes or None, its cost a step or None: see `cost`)],
    the largest global batch first;
    [note]): a layout whose planning fails (a MemplanError other than no fit) is left out, a note saying why,
    and the first error is raised where every layout fails.
    `compile_at(batch, **options)` plans one rank at a per-rank batch (a tensor-parallel rank's batch is its data
    rank's, a pipeline's its microbatch; a pipeline fits where its fullest stage does), `progress(label, batch)` is
    told of each plan; `layouts` are `candidates`' (label, compile options), one group of them a recomputation. A
    layout for which `least(parallel)` (least_states) is over `memory` is not planned: its row fits no batch, and a
    note says why. The layouts are dealt to CHAINS chains, every CHAINS-th to each, so that each chain's layouts are
    neighbours as in one search; the layouts with recomputation are dealt in the opposite order, so that the
    costliest layouts with and without it (the last: the most pipeline stages) go to different chains, which take
    about as long. With `workers` > 1 each chain runs in a forked process (on Linux; the chains run one after the
    other in this process elsewhere)."""
    compile_at = _fullest_stage(compile_at, memory)
    held = {label: least(options["parallel"], options.get("offload")) if least else 0 for label, options in layouts}
    full = {label for label, nbytes in held.items() if nbytes > memory}
    per_remat = len(layouts) // len({options["remat"] for _, options in layouts})
    chains = [[layout for j, layout in enumerate(layouts) if _dealt(j % per_remat, j // per_remat) == k
               and layout[0] not in full] for k in range(CHAINS)]
    in_workers = workers > 1 and "fork" in multiprocessing.get_all_start_methods()
    found, failed = {}, {}
    for rows, errors in _searched(compile_at, memory, [c for c in chains if c], progress, in_workers):
        found.update((label, row) for label, *row in rows)
        failed.update(errors)
    found.update((label, (0, None, None)) for label in full)
    if not found:
        raise MemplanError(f"no layout could be planned: {failed[layouts[0][0]]}")
    rows = [(label, *found[label]) for label, _ in layouts if label in found]
    ranks = {label: options["parallel"].dp * options["parallel"].microbatches for label, options in layouts}
    by_reason = {}
    for label, _ in layouts:
        if label in failed:
            by_reason.setdefault(failed[label], []).append(label)
    notes = [f"left out {'; '.join(labels)}: {reason}" for reason, labels in by_reason.items()]
    if full:
        notes.append(f"not planned, fitting no batch: {len(full)} layout(s) whose params and optimizer state alone "
                     f"need more than {format_bytes(memory)} a rank (at least {format_bytes(min(held[f] for f in full))})")
    return sorted(((label, batch, batch * ranks[label], arena, cost) for label, batch, arena, cost in rows),
                  key=lambda r: -r[2]), notes


class AtLeast(int):
    """An arena that was not placed, as its LOAD is above the memory (planner.AboveLimitError): the least it can be."""


class _Unplaced:
    """A rank plan left unplaced (AboveLimitError): its arena_bytes, an AtLeast."""

    def __init__(self, load):
        self.arena_bytes = AtLeast(load)


def _dealt(index, group):
    """The chain of the `index`-th layout of a group of layouts (one remat): every CHAINS-th, from the first
    chain in even groups and from the last in odd ones."""
    return index % CHAINS if group % 2 == 0 else CHAINS - 1 - index % CHAINS


def _fullest_stage(compile_at, memory):
    """compile_at planning each pipeline stage of a layout and returning the one of the largest arena, or the
    first that does not fit `memory`: placed only where its LOAD fits (`arena_limit`), else a stand-in whose
    arena is that LOAD (AtLeast). The stage that was the fullest at the layout's last batch goes first (at first
    the first stage, which holds the most microbatches in flight), so that a batch too large is most often told
    by one stage. The stages come from compile_at.stages where it has one (the passes before the cut run once)."""
    stages_at, fullest_of = getattr(compile_at, "stages", None), {}

    def plan(batch, parallel, **options):
        layout = (parallel, tuple(options.items()))
        first = fullest_of.get(layout, 0)
        order = [first, *(s for s in range(parallel.pp) if s != first)]
        options["arena_limit"] = memory
        stages = stages_at(batch, order, parallel=parallel, **options) if stages_at else \
            (compile_at(batch, parallel=replace(parallel, stage=s), **options) for s in order)
        fullest = None
        for index in order:
            try:
                stage = next(stages)
            except AboveLimitError as e:
                stage = _Unplaced(e.minimum)
            if fullest is None or stage.arena_bytes > fullest[1].arena_bytes:
                fullest = (index, stage)
            if stage.arena_bytes > memory:
                break
        fullest_of[layout] = fullest[0]
        return fullest[1]
    return plan


def _chain(compile_at, memory, layouts, progress):
    """([(label, largest batch, its arena bytes (at batch 1 where none fits) or None, its cost or None)], {label: why
    it failed}) of one chain of layouts."""
    failed = []
    rows = [(label, batch, plan.arena_bytes if plan else None, cost(plan) if plan and batch else None)
            for label, batch, plan in maxbatch.table(compile_at, memory, layouts, progress, failed)]
    return rows, {label: str(e) for label, e in failed}


def cost(plan):
    """What a rank's step costs beside its device memory: {"flops": forward, backward and recomputation, "sent_bytes":
    what its collectives and a pipeline stage's sends move, "host_bytes": its host arena (an offloaded optimizer)}; a
    pipeline's is its fullest stage's."""
    parallel = plan.training.get("parallel") or {}
    pipeline = plan.training.get("pipeline") or {}
    return {"flops": sum(plan.stats.get(k, 0) for k in ("forward_flops", "backward_flops", "recompute_flops")),
            "sent_bytes": parallel.get("collective_bytes", 0) + pipeline.get("sent_bytes", 0),
            "host_bytes": plan.host_arena_bytes}


def _searched(compile_at, memory, chains, progress, in_workers):
    """Each chain's rows: one forked process a chain, or `in_workers` False (or one chain) one after the other in
    this process."""
    if not in_workers or len(chains) == 1:
        return [_chain(compile_at, memory, chain, progress) for chain in chains]
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    workers = [context.Process(target=_worker, args=(compile_at, memory, chain, messages, k), daemon=True)
               for k, chain in enumerate(chains)]
    with forked.forking():
        for worker in workers:
            worker.start()
    done = {}
    try:
        while len(done) < len(workers):
            try:
                kind, k, payload = messages.get(timeout=1)
            except queues.Empty:
                dead = [w for j, w in enumerate(workers) if j not in done and w.exitcode not in (None, 0)]
                if dead:
                    raise MemplanError(f"a fit worker process died (exit code {dead[0].exitcode})") from None
                continue
            if kind == "error":
                raise payload
            if kind == "progress":
                if progress:
                    progress(*payload)
            elif kind == "show":
                current = progress_line.CURRENT.get()
                if current is not None:
                    current.show(payload)
            else:
                done[k] = payload
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join()
    return [done[k] for k in range(len(workers))]


class _Sent:
    """A worker's stand-in for the parent's progress line: what a search inside it shows goes to the parent,
    which draws the one line."""

    def __init__(self, messages, k):
        self.messages, self.k = messages, k

    def show(self, text):
        self.messages.put(("show", self.k, text))


def _worker(compile_at, memory, layouts, messages, k):
    """A forked process's chain: its progress, then its rows or the error it met, on `messages`. Ctrl-C is the
    parent's to handle: it ends the workers (`_searched`), so a worker ignores it rather than print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    progress_line.CURRENT.set(_Sent(messages, k))
    try:
        rows = _chain(compile_at, memory, layouts, lambda label, batch: messages.put(("progress", k, (label, batch))))
        messages.put(("rows", k, rows))
    except Exception as e:  # the parent raises it, as it is where it crosses processes
        messages.put(("error", k, forked.portable(e)))
