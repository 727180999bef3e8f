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
    transposes = [sum(s.op == "Transpose" for s in p.steps) for p in plans]
    assert transposes[0] == transposes[1], "K comes from the export's own key Transpose, no second copy"
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


def additive_mask_model(bias):
    """softmax(Q K^T / 2 + bias) V over inputs Q, K^T, V of (1, 2, S, 4), the bias a constant."""
    from onnx import TensorProto, helper, numpy_helper
    s = bias.shape[-1]
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Div", ["qk", "two"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
              for n, shape in (("q", [1, 2, s, 4]), ("kt", [1, 2, 4, s]), ("v", [1, 2, s, 4]))]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"), numpy_helper.from_array(bias, "bias")]
    graph = helper.make_graph(nodes, "sdpa", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


S = 6
LOWER = np.tril(np.ones((S, S), bool))


@pytest.mark.parametrize("bias, causal, fill, kept", [
    (np.where(LOWER, 0, -np.inf), 1, -np.inf, False),           # a causal mask: the op's causal, no bias
    (np.where(LOWER, 0, np.finfo(np.float32).min), 1, float(np.finfo(np.float32).min), False),  # as transformers writes it
    (np.where(LOWER, 0, -1e4), 1, -1e4, False),                 # -1e4 need not underflow: added as the export adds it
    (np.zeros((S, S)), 0, -np.inf, False),                      # no mask at all
    (np.random.default_rng(0).standard_normal((S, S)), 0, -np.inf, True),  # a bias
])
def test_an_additive_causal_mask_becomes_causal_with_its_own_fill(bias, causal, fill, kept):
    m = additive_mask_model(bias.reshape(1, 1, S, S).astype(np.float32))
    shapes = {"q": (1, 2, S, 4), "kt": (1, 2, 4, S), "v": (1, 2, S, 4)}
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
    plans = [planner.compile(m, shapes, fuse_attention=f) for f in (True, False)]
    fused = next(s for s in plans[0].steps if s.op == "ScaledDotProductAttention")
    assert fused.attrs["causal"] == causal and (len(fused.inputs) == 4) == kept
    assert fused.attrs["fill"] == np.float32(fill) and fused.attrs["fill_mode"] == ("add" if causal else "set")
    got, want = (Executor(p, backend="numpy", poison=True).run(feeds)["y"] for p in plans)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
