"""memplan.SoftmaxCrossEntropyGrad, the gradient of SoftmaxCrossEntropyLoss as one op: against finite
differences of the loss for each reduction, with class weights and an ignored label, on (N, C), (N, C, d1)
and a language model's (batch, seq, vocab) logits; chunked and 16-bit against a float64 reference; its
kernel allocating nothing; a language model's training step matching PyTorch. And the loss itself, whose
scratch without the log_prob output is a chunk of rows."""
import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner import ShapeError
from planner.autodiff import backward
from planner import ops
from planner.ops import Info, loss_grad
from test_no_hidden_allocations import allocations, assert_bounded
from zoo_cases import input_shapes, rel_l2, small_model

IGNORE = -1


def loss_model(scores, labels, weights, reduction, ignore_index=IGNORE):
    """y = sum(SoftmaxCrossEntropyLoss(s, labels[, w]) * k), s and w params, labels an input, k random (so
    that reduction "none" weighs its positions differently)."""
    rng = np.random.default_rng(1)
    shape = labels.shape if reduction == "none" else ()
    params = {"s": scores, **({"w": weights} if weights is not None else {}), "k": rng.uniform(0.5, 2, shape)}
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    nodes = [helper.make_node("SoftmaxCrossEntropyLoss", ["s", "labels", *(["w"] if weights is not None else [])],
                              ["l"], reduction=reduction, **attrs),
             helper.make_node("Mul", ["l", "k"], ["lk"]), helper.make_node("ReduceSum", ["lk"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "sce", [helper.make_tensor_value_info("labels", TensorProto.INT64, labels.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [])],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def value(m, labels, name, array):
    """y of the model `m` with its initializer `name` set to `array`."""
    init = next(i for i in m.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(array, name))
    return float(Executor(planner.compile(m, schedule="file"), backend="numpy").run({"labels": labels})["y"])


def numeric_gradient(m, labels, name, array, eps=1e-6):
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
        moved = [array.copy(), array.copy()]
        moved[0][index] += eps
        moved[1][index] -= eps
        grad[index] = (value(m, labels, name, moved[0]) - value(m, labels, name, moved[1])) / (2 * eps)
    value(m, labels, name, array)
    return grad


def memplan_gradient(m, labels):
    """d y / d s through the op, and the ops of the backward pass."""
    trained, grads = backward(planner.load(m), "y", ["s"])
    got = Executor(planner.compile(trained, schedule="file"), backend="numpy", poison=True).run({"labels": labels})
    return got[grads["s"]], [n.op for n in trained.nodes if not n.notes.forward]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2)], ids=["NC", "NCd"])
def test_gradient_matches_finite_differences(reduction, weighted, shape):
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(shape) * 3
    labels = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    labels.reshape(-1)[1] = IGNORE
    weights = rng.uniform(0.5, 2, shape[1]) if weighted else None
    m = loss_model(scores, labels, weights, reduction)
    got, ops = memplan_gradient(m, labels)
    assert "SoftmaxCrossEntropyGrad" in ops and not {"LogSoftmax", "Exp", "OneHot"} & set(ops), ops
    np.testing.assert_allclose(got, numeric_gradient(m, labels, "s", scores), rtol=1e-6, atol=1e-8)
    ignored = np.moveaxis(got, 1, -1).reshape(-1, shape[1])[1]
    assert not ignored.any(), "an ignored position's scores get gradient"


def test_without_ignore_index_every_label_counts():
    rng = np.random.default_rng(2)
    scores, labels = rng.standard_normal((4, 3)), np.array([0, 2, 1, 2])
    m = loss_model(scores, labels, None, "mean", ignore_index=None)
    got, _ = memplan_gradient(m, labels)
    np.testing.assert_allclose(got, numeric_gradient(m, labels, "s", scores), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("uses", [("l", "lp"), ("lp",)], ids=["loss-and-log-prob", "log-prob-only"])
def test_log_probabilities_output_adds_its_gradient(uses):
    """y = sum(loss k) + sum(log_prob k2), or the second term alone: the log-probabilities' gradient flows
    back through LogSoftmax's rule besides the op's."""
    rng = np.random.default_rng(7)
    scores, labels = rng.standard_normal((4, 3, 2)), np.array([[0, 2], [1, IGNORE], [2, 2], [0, 1]])
    params = {"s": scores, "k": rng.uniform(0.5, 2, ()), "k2": rng.standard_normal((4, 3, 2))}
    terms = {"l": ("l", "k"), "lp": ("lp", "k2")}
    nodes = [helper.make_node("SoftmaxCrossEntropyLoss", ["s", "labels"], ["l", "lp"], ignore_index=IGNORE)]
    for name in uses:
        nodes += [helper.make_node("Mul", list(terms[name]), [f"{name}k"]),
                  helper.make_node("ReduceSum", [f"{name}k"], [f"{name}y"], keepdims=0)]
    nodes.append(helper.make_node("Sum", [f"{name}y" for name in uses], ["y"]))
    graph = helper.make_graph(nodes, "sce2", [helper.make_tensor_value_info("labels", TensorProto.INT64, labels.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [])],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    got, ops = memplan_gradient(m, labels)
    assert ("SoftmaxCrossEntropyGrad" in ops) == ("l" in uses)
    np.testing.assert_allclose(got, numeric_gradient(m, labels, "s", scores), rtol=1e-6, atol=1e-8)


def language_model(vocab=7, hidden=4):
    """ids (2, 3) -> embedding Gather -> MatMul -> (batch, seq, vocab) logits: a language model to the
    loss pass, which puts the classes of its cross_entropy on the last dim."""
    rng = np.random.default_rng(3)
    params = {"emb": rng.standard_normal((vocab, hidden)), "head": rng.standard_normal((hidden, vocab))}
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]), helper.make_node("MatMul", ["h", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("logits", TensorProto.DOUBLE, [2, 3, vocab])],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), params


def test_language_model_logits_classes_on_the_last_dim():
    """The loss pass views (batch, seq, vocab) as (positions, vocab), the op's (N, C): d loss / d head by
    finite differences, with a padding label ignored."""
    from planner.losses import append_loss
    m, params = language_model()
    ids, labels = np.array([[1, 4, 6], [0, 2, 5]]), np.array([[4, 6, -100], [2, 5, 3]])
    graph, _ = append_loss(planner.load(m), "cross_entropy")
    trained, grads = backward(graph, "loss", ["head"])
    grad_node = next(n for n in trained.nodes if n.op == "SoftmaxCrossEntropyGrad")
    assert trained.tensors[grad_node.inputs[0]].shape == (6, 7)
    plan = planner.compile(trained, schedule="file")
    got = Executor(plan, backend="numpy", poison=True).run({"ids": ids, "labels": labels})[grads["head"]]

    def loss(head):
        typed, _ = append_loss(planner.load(with_param(m, "head", head)), "cross_entropy")
        return float(Executor(planner.compile(typed, schedule="file"), backend="numpy").run(
            {"ids": ids, "labels": labels})["loss"])

    want = np.zeros_like(params["head"])
    for index in np.ndindex(want.shape):
        up, down = params["head"].copy(), params["head"].copy()
        up[index] += 1e-6
        down[index] -= 1e-6
        want[index] = (loss(up) - loss(down)) / 2e-6
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def with_param(m, name, array):
    out = type(m)()
    out.CopyFrom(m)
    next(i for i in out.graph.initializer if i.name == name).CopyFrom(numpy_helper.from_array(array, name))
    return out


def grad_model(shape, dtype, reduction="mean", ignore_index=IGNORE, weights=None):
    """One memplan.SoftmaxCrossEntropyGrad node over inputs scores, labels and dloss."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    labels_shape = (shape[0], *shape[2:])
    attrs = {} if ignore_index is None else {"ignore_index": ignore_index}
    names = ["scores", "labels", "w" if weights is not None else "", "dloss"]
    node = helper.make_node("SoftmaxCrossEntropyGrad", names, ["dscores"], domain="memplan", reduction=reduction, **attrs)
    inputs = [helper.make_tensor_value_info("scores", elem, shape),
              helper.make_tensor_value_info("labels", TensorProto.INT64, labels_shape),
              helper.make_tensor_value_info("dloss", elem, labels_shape if reduction == "none" else [])]
    inits = [] if weights is None else [numpy_helper.from_array(weights.astype(dtype), "w")]
    graph = helper.make_graph([node], "grad", inputs, [helper.make_tensor_value_info("dscores", elem, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])


def reference(scores, labels, weights, dloss, reduction, ignore_index=IGNORE):
    """(softmax - onehot) * factor in float64, classes on dim 1."""
    s = np.moveaxis(scores.astype(np.float64), 1, -1)
    soft = np.exp(s - s.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    ignored = labels == ignore_index
    safe = np.where(ignored, 0, labels)
    taken = np.where(ignored, 0, 1.0 if weights is None else weights.astype(np.float64)[safe])
    factor = taken * dloss.astype(np.float64)
    if reduction == "mean":
        factor = factor / taken.sum()
    onehot = np.eye(s.shape[-1])[safe]
    return np.moveaxis((soft - onehot) * factor[..., None], -1, 1)


def run_grad(shape, dtype, reduction="mean", weights=None, seed=0):
    rng = np.random.default_rng(seed)
    scores = (rng.standard_normal(shape) * 4).astype(dtype)
    labels = rng.integers(0, shape[1], (shape[0], *shape[2:]))
    labels.reshape(-1)[::5] = IGNORE
    dloss = rng.uniform(0.5, 2, labels.shape if reduction == "none" else ()).astype(dtype)
    plan = planner.compile(grad_model(shape, dtype, reduction, weights=weights), schedule="file")
    feeds = {"scores": scores, "labels": labels, "dloss": dloss}
    got = Executor(plan, backend="numpy", poison=True).run(feeds)["dscores"]
    return got, reference(scores, labels, weights, dloss, reduction), plan


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_rows_in_many_chunks(monkeypatch, reduction):
    """Chunks of one row, then of two rows with a short last one, as one whole chunk computes."""
    weights = np.random.default_rng(4).uniform(0.5, 2, 9)
    whole, want, _ = run_grad((7, 9, 3), np.float64, reduction, weights)
    np.testing.assert_allclose(whole, want, rtol=1e-12, atol=1e-15)
    for rows in (1, 2):
        monkeypatch.setattr(loss_grad, "CHUNK_BYTES", rows * 9 * 3 * 8)
        np.testing.assert_array_equal(run_grad((7, 9, 3), np.float64, reduction, weights)[0], whole)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_16_bit_scores_keep_row_statistics_in_float32(dtype):
    got, want, plan = run_grad((6, 50, 2), dtype)
    step = next(s for s in plan.steps if s.op == "SoftmaxCrossEntropyGrad")
    ins = [Info((6, 50, 2), np.dtype(dtype)), Info((6, 2), np.dtype(np.int64)), None, Info((), np.dtype(dtype))]
    schema = ops.get("SoftmaxCrossEntropyGrad", "memplan")
    layout = schema.workspace(step, ins, [((6, 50, 2), np.dtype(dtype))], 1 << 20)
    assert {s.name: s.dtype for s in layout.slices}["rows"] == "float32"
    tolerance = 2 ** -(8 if dtype is np.float16 else 5)
    assert np.abs(got.astype(np.float64) - want).max() <= tolerance * np.abs(want).max()


def test_kernel_allocates_nothing():
    """Scores of 1 MiB (64 rows of 4096 classes), with weights and an ignore_index: any temporary of the
    scores' size, or of a chunk's, shows."""
    rng = np.random.default_rng(5)
    shape = (64, 4096)
    plan = planner.compile(grad_model(shape, np.float32, weights=rng.uniform(0.5, 2, 4096)), schedule="file")
    labels = rng.integers(0, 4096, 64)
    labels[3] = IGNORE
    data = {"scores": rng.standard_normal(shape, dtype=np.float32), "labels": labels, "dloss": np.float32(1.5)}
    ex = Executor(plan, backend="numpy")
    assert_bounded(allocations(ex, lambda: ex.run(data)), exempt=set())


def test_dloss_must_have_the_loss_shape():
    """Reduction "none" takes one dloss per position, not a scalar."""
    m = grad_model((4, 3), np.float32, "none")
    m.graph.input[2].CopyFrom(helper.make_tensor_value_info("dloss", TensorProto.FLOAT, []))
    with pytest.raises(ShapeError, match="dloss of shape"):
        planner.compile(m)


@pytest.mark.torch
def test_language_model_training_matches_torch():
    """gpt2_small (reduced) trained three SGD steps on (batch, seq) labels with padding ignored: the loss
    and every param as PyTorch's F.cross_entropy over the last dim gives them; the backward of its loss is
    one SoftmaxCrossEntropyGrad."""
    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch, torch_optimizer
    model, batch = small_model("gpt2_small"), 2
    shapes = input_shapes(model, batch)
    rng = np.random.default_rng(6)
    feeds = {"input_ids": rng.integers(0, 100, shapes["input_ids"], dtype=np.int64)}
    labels = rng.integers(0, 100, shapes["input_ids"], dtype=np.int64)
    labels[:, -3:] = -100
    plan = planner.compile(model, shapes, training=True, optimizer="sgd", optimizer_args={"lr": 0.1})
    assert [s.op for s in plan.steps].count("SoftmaxCrossEntropyGrad") == 1
    ex = Executor(plan, backend="numpy", poison=True)
    ours = [ex.train_step({**feeds, "labels": labels}) for _ in range(3)]
    module = to_torch(model, shapes).train()
    params = module.graph_parameters()
    opt = torch_optimizer("sgd", list(params.values()), {"lr": 0.1})
    theirs = []
    for _ in range(3):
        opt.zero_grad()
        logits = module(**{k: torch.as_tensor(v) for k, v in feeds.items()})[module.graph.outputs[0]]
        flat = logits.reshape(-1, logits.shape[-1])
        loss = torch.nn.functional.cross_entropy(flat, torch.as_tensor(labels).reshape(-1))
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    for name, p in params.items():
        assert rel_l2(ex.parameters()[name], p.detach().numpy()) < 1e-4, name


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_loss_without_log_prob_output_in_chunks_of_rows(monkeypatch, reduction):
    """The forward loss without its log_prob output: its scratch a chunk of rows, not the scores' size, and
    its value the same whatever the chunk, as the float64 reference gives it."""
    from planner.ops import loss
    rng = np.random.default_rng(8)
    scores, labels = rng.standard_normal((7, 9, 3)) * 4, rng.integers(0, 9, (7, 3))
    labels[2, 1] = IGNORE
    weights = rng.uniform(0.5, 2, 9)
    m = loss_model(scores, labels, weights, reduction)
    s = np.moveaxis(scores, 1, -1)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    taken = np.where(labels == IGNORE, 0, weights[np.where(labels == IGNORE, 0, labels)])
    losses = (lse - np.take_along_axis(s, np.where(labels == IGNORE, 0, labels)[..., None], -1)[..., 0]) * taken
    k = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == "k"))
    want = (losses * k).sum() if reduction == "none" else losses.sum() / taken.sum() * k
    for rows in (7, 2, 1):
        monkeypatch.setattr(loss, "CHUNK_BYTES", rows * 9 * 3 * 8)
        plan = planner.compile(m, schedule="file")
        step = next(s for s in plan.steps if s.op == "SoftmaxCrossEntropyLoss")
        assert plan.stats["workspace"]["largest"] < rows * 9 * 3 * 8 + 1024, step
        got = Executor(plan, backend="numpy", poison=True).run({"labels": labels})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-12)
