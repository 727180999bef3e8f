"""`memplan fit`: how to train a model on N devices of one memory size. Each candidate layout (data
parallelism over all N at ZeRO stage 0 to 3, and tensor parallelism over 2, 4 or 8 of them with ZeRO-1 over
the rest, as Megatron pairs them with its distributed optimizer; each with and without recomputation) gets
the largest per-rank batch whose rank plan fits the memory; the table puts the largest global batch first. The layouts are shared
among worker processes, one per core: the planner is pure Python, so this is how a search uses more than
one core."""
import multiprocessing
import pickle
import queue as queues

from . import maxbatch
from .errors import ConfigError, MemplanError
from .parallel import STAGES, Parallel

REMATS = (None, "sublinear")
TENSOR_PARALLEL = (2, 4, 8)
"""The tensor-parallel sizes tried: within one node's devices, as Megatron keeps them."""
TP_ZERO = 1


def tensor_parallel_sizes(compile_at, gpus):
    """([tp], [note]): the sizes of TENSOR_PARALLEL that divide `gpus` and split the model (planned once at
    batch 1), and why each other one that divides `gpus` does not."""
    sizes, refused = [], {}
    for tp in TENSOR_PARALLEL:
        if gpus % tp == 0:
            try:
                compile_at(1, parallel=Parallel(dp=gpus // tp, tp=tp, zero=TP_ZERO), remat=None)
                sizes.append(tp)
            except ConfigError as e:
                refused.setdefault(str(e), []).append(str(tp))
    return sizes, [f"no tp {', '.join(tps)}: {reason}" for reason, tps in refused.items()]


def candidates(gpus, shard="flat", prefetch=0, bucket_bytes=0, tps=()):
    """(label, compile options) of each layout of `gpus` ranks, neighbours alike (each search starts from
    the one before): data-parallel at each ZeRO stage, then `tps` tensor-parallel ranks with ZeRO-1 over the
    rest; their shards cut by `shard` where they have shards, ZeRO-3's gathers `prefetch` ahead, their
    gradients reduced in buckets of `bucket_bytes` (planner.parallel)."""
    layouts = [(1, zero) for zero in STAGES] + [(tp, TP_ZERO) for tp in tps]
    return [(f"dp {gpus // tp}" + (f" x tp {tp}" if tp > 1 else "") + f", ZeRO-{zero}" + (f", {remat}" if remat else ""),
             {"parallel": Parallel(dp=gpus // tp, tp=tp, zero=zero, shard=shard if zero else "flat",
                                   prefetch=prefetch if zero == 3 else 0,
                                   bucket_bytes=bucket_bytes if gpus > tp else 0),
              "remat": remat})
            for remat in REMATS for tp, zero in layouts]


def search(compile_at, gpus, memory, progress=None, workers=1, tps=(), **rules):
    """[(label, per-rank batch, global batch, the rank's arena bytes or None)], the largest global batch first;
    `compile_at(batch, **options)` plans one rank at a per-rank batch (a tensor-parallel rank's batch is its
    data rank's), `progress(label, batch)` is told of each plan; `tps` and `rules` (Parallel's shard, prefetch,
    bucket_bytes) are `candidates`'. With `workers` > 1 the layouts are dealt to that many forked processes (on
    Linux; one process elsewhere), every `workers`-th to each, so that each process's layouts are neighbours
    as in one search and the processes take about as long."""
    layouts = candidates(gpus, tps=tps, **rules)
    workers = min(workers, len(layouts)) if "fork" in multiprocessing.get_all_start_methods() else 1
    chains = [layouts[k::workers] for k in range(workers)]
    found = {label: (batch, arena) for chain in _searched(compile_at, memory, chains, progress)
             for label, batch, arena in chain}
    rows = [(label, *found[label]) for label, _ in layouts]
    ranks = {label: options["parallel"].dp for label, options in layouts}
    return sorted(((label, batch, batch * ranks[label], arena) for label, batch, arena in rows), key=lambda r: -r[2])


def _chain(compile_at, memory, layouts, progress):
    """[(label, largest batch, its arena bytes or None)] of one chain of layouts."""
    return [(label, batch, plan.arena_bytes if plan else None)
            for label, batch, plan in maxbatch.table(compile_at, memory, layouts, progress)]


def _searched(compile_at, memory, chains, progress):
    """Each chain's rows: in this process for one chain, else one forked process a chain."""
    if len(chains) == 1:
        return [_chain(compile_at, memory, chains[0], progress)]
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    workers = [context.Process(target=_worker, args=(compile_at, memory, chain, messages, k), daemon=True)
               for k, chain in enumerate(chains)]
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
            else:
                done[k] = payload
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join()
    return [done[k] for k in range(len(workers))]


def _worker(compile_at, memory, layouts, messages, k):
    """A forked process's chain: its progress, then its rows or the error it met, on `messages`."""
    try:
        rows = _chain(compile_at, memory, layouts, lambda label, batch: messages.put(("progress", k, (label, batch))))
        messages.put(("rows", k, rows))
    except Exception as e:  # the parent raises it, as it is where it crosses processes
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:
            e = MemplanError(f"{type(e).__name__}: {e}")
        messages.put(("error", k, e))
