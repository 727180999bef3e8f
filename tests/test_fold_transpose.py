"""The fold_transpose pass: MatMul(A, Transpose(W)) of a matrix W becomes a Gemm reading W transposed in
place (a tied LM head), results do not change (with and without the pass, against onnxruntime, and
through a training step), and neither pass keeps a transposed copy of W."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor

VOCAB, HIDDEN = 50, 8
RNG = np.random.default_rng(0)


def tied_lm(ids_shape=(2, 5), perm=(1, 0), vocab=VOCAB):
    """ids -> Gather(E) -> Tanh -> MatMul(., Transpose(E)): an LM head tied to its token embedding."""
    nodes = [helper.make_node("Gather", ["E", "ids"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Transpose", ["E"], ["Et"], perm=list(perm)),
             helper.make_node("MatMul", ["t", "Et"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, ids_shape)],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(RNG.standard_normal((vocab, HIDDEN)).astype(np.float32), "E")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def ids(shape=(2, 5)):
    return np.random.default_rng(1).integers(0, VOCAB, shape)


@pytest.mark.parametrize("shape", [(2, 5), (7,)])
def test_the_fold_changes_no_result(shape):
    ort = pytest.importorskip("onnxruntime")
    model = tied_lm(shape)
    plans = [planner.compile(model, {"ids": shape}, fold_transpose=f) for f in (True, False)]
    assert [p.stats["folded_transposes"] for p in plans] == [1, 0]
    assert not any(s.op == "Transpose" for s in plans[0].steps) and any(s.op == "Transpose" for s in plans[1].steps)
    feeds = {"ids": ids(shape)}
    folded, plain = (Executor(p, backend="numpy", poison=True).run(feeds)["logits"] for p in plans)
    np.testing.assert_allclose(folded, plain, rtol=1e-5, atol=1e-6)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(folded, want, rtol=1e-4, atol=1e-5)


def test_training_through_the_fold_matches_the_exported_form_without_a_transposed_copy():
    """Three SGD steps of the tied LM with and without the pass: the same losses and embedding; with it no
    (hidden, vocab) tensor is made, where the exported form keeps one for backward and makes another for
    the gradient."""
    model, results = tied_lm(), []
    for fold in (True, False):
        plan = planner.compile(model, {"ids": (2, 5)}, training=True, optimizer="sgd", optimizer_args={"lr": 0.5},
                               fold_transpose=fold)
        transposed = [t for t in plan.tensors.values() if tuple(t.shape) == (HIDDEN, VOCAB)]
        assert bool(transposed) != fold, [t.name for t in transposed]
        ex = Executor(plan, backend="numpy", poison=True)
        labels = np.random.default_rng(2).integers(0, VOCAB, (2, 5))
        losses = [ex.train_step({"ids": ids(), "labels": labels}) for _ in range(3)]
        results.append((losses, ex.parameters()["E"]))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)
    assert results[0][0][-1] < results[0][0][0]


def test_only_the_transpose_of_a_matrix_folds():
    """The identity permutation of a square table, and a 1-D A (a vector, not rows), stay as they are."""
    assert planner.compile(tied_lm(perm=(0, 1), vocab=HIDDEN), {"ids": (2, 5)}).stats["folded_transposes"] == 0
    assert planner.compile(tied_lm(ids_shape=()), {"ids": ()}).stats["folded_transposes"] == 0
