"""Processes of one gloo process group (torch.distributed) for the data-parallel tests."""
import pkgutil
import socket

import pytest

import executor.jit


def preloaded():
    """What the fork server imports once, so that each rank starts as a fork of a process that has it already:
    spawned, every rank imports torch, memplan and its compiled kernels anew (seconds each on a small machine)."""
    kernels = [f"executor.jit.{module.name}" for module in pkgutil.iter_modules(executor.jit.__path__)]
    return ["numpy", "onnx", "torch", "torch.distributed", "planner", "executor", *kernels]


def spawned(target, world):
    """The results `target(rank, port, results)` puts on `results` in each of `world` processes, which join the
    group at 127.0.0.1:`port`, sorted by rank (a result is a tuple whose first item is the rank)."""
    mp = pytest.importorskip("torch.multiprocessing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(preloaded())
    results = context.Queue()
    workers = [context.Process(target=target, args=(rank, port, results)) for rank in range(world)]
    for w in workers:
        w.start()
    got = sorted((results.get(timeout=240) for _ in workers), key=lambda result: result[0])
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    return got
