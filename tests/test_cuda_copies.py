"""The copy stream (executor/backends/cuda_copies.py) checked on the CPU against streams that run each copy as late
as its events allow: a step that read a copy back before waiting for it, or overwrote what a pending copy out reads,
would train differently from the plan run with its copies in place. (Not in poison mode, whose fills of the host
arena wait for every copy.)"""
import numpy as np
import pytest

import planner
from executor import Executor
from executor.backends import cuda_copies, numpy_backend
from zoo_cases import feeds, input_shapes, small_model


class _Stream:
    """A stream whose work runs when something waits for it (the compute stream runs its work at once)."""

    def __init__(self, lazy=True):
        self.lazy, self.queue = lazy, []

    def wait_event(self, event):
        if event.stream is not None and event.stream is not self:
            event.stream.run(event.mark)

    def run(self, upto):
        while self.queue and self.queue[0][0] < upto:
            self.queue.pop(0)[1]()

    def synchronize(self):
        self.run(float("inf"))


class _Event:
    def __init__(self):
        self.stream, self.mark = None, 0

    def record(self, stream):
        self.stream, self.mark = stream, _Cuda.clock


class _Cuda:
    clock = 0
    compute = _Stream(lazy=False)

    @staticmethod
    def Stream(non_blocking=True):
        return _Stream()

    Event = _Event

    @staticmethod
    def get_current_stream():
        return _Cuda.compute


class _Cupy:
    cuda = _Cuda


def _late_copy(src, dst, stream):
    """np.copyto(dst, src) queued on `stream`, run when the stream is waited for past it."""
    _Cuda.clock += 1
    stream.queue.append((_Cuda.clock - 1, lambda: np.copyto(dst, src)))


def _trained(plan, m, poison=False):
    ex = Executor(plan, backend="numpy", poison=poison)
    data = dict(feeds(m, 4))
    data[plan.training["labels"]] = np.random.default_rng(0).integers(0, 4, plan.tensors[plan.training["labels"]].shape)
    return [ex.train_step(data) for _ in range(2)], ex.parameters()


@pytest.mark.parametrize("options", [{"remat": "swap"}, {"offload": "optimizer"},
                                     {"remat": "hybrid", "offload": "optimizer", "precision": "amp-bf16"}])
def test_copies_on_a_stream_of_their_own_train_as_copies_in_place(options, monkeypatch):
    m = small_model("resnet_deep")
    shapes = input_shapes(m, 4)
    base = planner.compile(m, shapes, training=True, optimizer="adam", precision=options.get("precision", "fp32"))
    budget = {"memory_budget": int(base.arena_bytes * 0.6)} if "remat" in options else {}
    plan = planner.compile(m, shapes, training=True, optimizer="adam", **options, **budget)
    assert any(s.op == "SwapIn" for s in plan.steps)
    base_losses, base_params = _trained(plan, m)
    monkeypatch.setattr(numpy_backend, "copies", lambda plan, view: cuda_copies.CopyStream(_Cupy, plan, view,
                                                                                          copy=_late_copy))
    losses, params = _trained(plan, m)
    assert losses == base_losses
    assert all(np.array_equal(params[k], base_params[k]) for k in base_params)


def test_numpy_runs_its_copies_in_place():
    assert numpy_backend.copies(None, None) is None
