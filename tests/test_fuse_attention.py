"""The attention fusion pass: exported attention becomes one memplan.ScaledDotProductAttention, results
do not change (with and without the pass, and against onnxruntime), and memory grows linearly with the
sequence instead of with its square."""
import numpy as np
import pytest

import planner
from executor import Executor
from frontends import zoo
from zoo_cases import reference, rel_l2, small_model, input_shapes


@pytest.mark.parametrize("case", ["gpt2_small", "bert_base"])
def test_fused_attention_changes_no_result(case):
    model, inputs, want = reference(case, 2)
    shapes = {k: v.shape for k, v in inputs.items()}
    plans = [planner.compile(model, shapes, fuse_attention=f) for f in (True, False)]
    assert plans[0].stats["fused_attention"] == 2 and plans[1].stats["fused_attention"] == 0
    assert not any(s.op == "Softmax" for s in plans[0].steps)
    fused, plain = (Executor(p, backend="numpy", poison=True).run(inputs) for p in plans)
    for name in want:
        assert rel_l2(fused[name], plain[name]) < 1e-6, name
        np.testing.assert_allclose(fused[name], want[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["gpt2_small", "bert_base"])
def test_training_through_fused_attention_matches_the_exported_form(case):
    model = small_model(case)
    shapes = input_shapes(model, 2)
    _, inputs, _ = reference(case, 2)
    losses = []
    for fuse in (True, False):
        plan = planner.compile(model, shapes, training=True, loss="mse", fuse_attention=fuse)
        targets = plan.tensors[plan.training["labels"]]
        feeds = {**inputs, targets.name: np.full(targets.shape, 0.1, np.dtype(targets.dtype))}
        ex = Executor(plan, backend="numpy", poison=True)
        losses.append([ex.train_step(feeds) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def transient(plan):
    return plan.arena_bytes - sum(plan.breakdown.get(f, 0) for f in ("params", "workspace"))


def test_gpt2_memory_grows_linearly_with_the_sequence():
    """gpt2_small (two layers) at batch 1, sequence 128 and 4,096: the transient arena grows at most x40
    (linear: x32), and no tensor is (seq, seq), where the exported form holds the scores (and the
    causal mask) as such, 805 MiB for the twelve heads at 4,096."""
    model = zoo.build("gpt2_small", layers=2, max_positions=4096)
    short, long = (planner.compile(model, {"input_ids": (1, s)}) for s in (128, 4096))
    assert transient(long) <= 40 * transient(short)
    plain = planner.compile(model, {"input_ids": (1, 4096)}, fuse_attention=False)
    square = [(plan, [t for t in plan.tensors.values() if tuple(t.shape[-2:]) == (4096, 4096)]) for plan in (long, plain)]
    assert not square[0][1] and square[1][1]
    assert transient(plain) - transient(long) >= 12 * 4096 ** 2 * 4
