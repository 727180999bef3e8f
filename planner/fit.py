"""`memplan fit`: how to train a model on N devices of one memory size. Each candidate layout (for now the
data-parallel ones: ZeRO stage 0 to 2, with and without recomputation) gets the largest per-rank batch
whose rank plan fits the memory; the table puts the largest global batch first."""
from . import maxbatch
from .parallel import STAGES, Parallel

REMATS = (None, "sublinear")


def candidates(gpus):
    """(label, compile options) of each layout of `gpus` data-parallel ranks, neighbours alike (each search
    starts from the one before)."""
    return [(f"dp {gpus}, ZeRO-{zero}" + (f", {remat}" if remat else ""),
             {"parallel": Parallel(dp=gpus, zero=zero), "remat": remat}) for remat in REMATS for zero in STAGES]


def search(compile_at, gpus, memory, progress=None):
    """[(label, per-rank batch, global batch, the rank's plan or None)], the largest global batch first;
    `compile_at(batch, **options)` plans one rank at a per-rank batch."""
    rows = maxbatch.table(compile_at, memory, candidates(gpus), progress)
    return sorted(((label, batch, batch * gpus, plan) for label, batch, plan in rows), key=lambda r: -r[2])
