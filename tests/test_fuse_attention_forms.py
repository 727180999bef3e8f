"""The attention fusion on exported forms written by hand (tests/attention_graphs.py), against onnxruntime
and the unfused plan: masks read as causal or a window only with the export's own fill, set or added as the
export does; rows that see nothing as the export gives them (NaN for -inf fills, the uniform average for
finite ones); soft-capping, 3-D batched scores, one K/V head for many, dropout; and near misses left alone."""
import numpy as np
import pytest

import planner
from attention_graphs import Attention, causal
from executor import Executor

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(44)
LOWEST = float(np.finfo(np.float32).min)


def check(graph, model, fused, scale=1.0, feeds=None):
    """Plans `model` with and without the fusion: `fused` attention ops in the first, outputs equal to the
    unfused plan's and onnxruntime's (NaN and inf where they have them). Returns the fused plan."""
    feeds = feeds or graph.feeds(RNG, scale)
    shapes = {n: v.shape for n, v in feeds.items()}
    plans = [planner.compile(model, shapes, fuse_attention=f) for f in (True, False)]
    assert plans[0].stats["fused_attention"] == fused
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    tol = 1e-4 if want.dtype.itemsize >= 4 else 1e-2
    for plan in plans:
        got = Executor(plan, backend="numpy", poison=True).run(feeds)["y"]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol / 10)
    return plans[0]


def attrs(plan):
    return next(s for s in plan.steps if s.op == "ScaledDotProductAttention").attrs


@pytest.mark.parametrize("fill", [5.0, -1e4, LOWEST, -np.inf])
def test_a_where_mask_is_causal_with_its_own_fill(fill):
    """Where(tril, scores, fill) before Softmax: causal, hidden scores set to the fill (5.0 was read as -inf)."""
    g = Attention()
    plan = check(g, g.model(terms=[("where", causal(6, 6), fill, True)]), 1)
    a = attrs(plan)
    assert (a["causal"], a["fill"], a["fill_mode"]) == (1, np.float32(fill), "set")


@pytest.mark.parametrize("guard", [False, True])
@pytest.mark.parametrize("fill", [-np.inf, LOWEST])
def test_rows_that_see_nothing_give_what_the_export_gives(fill, guard):
    """S > T: the first rows see no key. A -inf fill gives NaN there, as Softmax does (0 under SDPA's guard);
    a finite one the uniform average of V."""
    g = Attention(s=8, t=5)
    plan = check(g, g.model(terms=[("where", causal(8, 5), fill, True)], guard=guard), 1)
    assert attrs(plan)["empty_rows"] == ("zero" if guard else "nan")


def test_left_padding_with_the_lowest_fill_averages_the_padded_rows():
    """GPT-2's eager form: Where(causal, scores, lowest) and then a padding bias (0 or lowest) from an input:
    rows whose visible keys are all padding average exactly those keys, as the export computes."""
    g = Attention(s=6, t=6)
    model = g.model(terms=[("where", causal(6, 6), LOWEST, True), ("add", "padding")],
                    inputs={"padding": ((2, 1, 1, 6), np.float32)})
    feeds = g.feeds(RNG)
    feeds["padding"] = np.where(np.arange(6) < np.array([[3], [1]]), LOWEST, 0).reshape(2, 1, 1, 6).astype(np.float32)
    plan = check(g, model, 1, feeds=feeds)
    assert (attrs(plan)["causal"], attrs(plan)["fill_mode"]) == (1, "set")


def test_a_mask_set_after_the_bias_keeps_that_order():
    """Where(causal, scores + bias, 5.0): hidden scores are 5.0 whatever the bias."""
    g = Attention()
    plan = check(g, g.model(terms=[("add", RNG.standard_normal((6, 6)).astype(np.float32)),
                                   ("where", causal(6, 6), 5.0, True)]), 1)
    assert attrs(plan)["fill_mode"] == "set_after_bias"


@pytest.mark.parametrize("window", [2, 4])
@pytest.mark.parametrize("fill", [LOWEST, -np.inf])
def test_a_sliding_window_mask_becomes_the_ops_window(window, fill):
    """An additive constant mask keeping the last `window` keys of each query (Gemma 2, Mistral)."""
    g = Attention(s=7, t=9)
    mask = np.where(causal(7, 9, window), 0, fill).astype(np.float32).reshape(1, 1, 7, 9)
    plan = check(g, g.model(terms=[("add", np.repeat(mask, 2, axis=0))]), 1)
    a = attrs(plan)
    assert (a["causal"], a["window"], a["fill_mode"]) == (1, window, "add") and len(plan.steps[-1].inputs) == 3


def test_softcapped_scores_fuse_with_the_softcap():
    g = Attention()
    plan = check(g, g.model(scale=("Mul", 0.25), softcap=3.0, terms=[("add", np.where(causal(6, 6), 0, LOWEST)
                                                                             .astype(np.float32))]), 1, scale=4.0)
    assert attrs(plan)["softcap"] == 3.0 and attrs(plan)["scale"] == 0.25


def test_bloom_3d_scores_with_alibi_reshaped_around_the_mask():
    """(B H, S, T) scores plus a (B H, 1, T) ALiBi bias, reshaped to (B, H, S, T) for a causal mask and back
    for the product with (B H, T, D) values: the bias stays (B, H, 1, T), linear in the sequence."""
    g = Attention(layout="3d")
    alibi = (RNG.standard_normal((8, 1, 1)) * np.arange(6)).astype(np.float32)
    plan = check(g, g.model(scale=("Mul", 0.5), terms=[("add3", alibi), ("add", np.where(causal(6, 6), 0, LOWEST)
                                                                             .astype(np.float32))]), 1)
    step = next(s for s in plan.steps if s.op == "ScaledDotProductAttention")
    assert attrs(plan)["causal"] == 1 and plan.tensors[step.inputs[3]].shape == (2, 4, 1, 6)


def test_one_key_and_value_head_broadcast_over_the_query_heads():
    """Falcon's multi-query attention: K^T (B, 1, D, T) and V (B, 1, T, D) broadcast by the MatMuls."""
    g = Attention(kv_heads=1)
    plan = check(g, g.model(terms=[("add", np.where(causal(6, 6), 0, LOWEST).astype(np.float32))], guard=True), 1)
    step = next(s for s in plan.steps if s.op == "ScaledDotProductAttention")
    assert plan.tensors[step.inputs[1]].shape == (2, 1, 6, 4)


def test_a_where_mask_from_an_input_becomes_the_mask_input():
    g = Attention()
    inputs = {"keep": ((2, 1, 6, 6), np.bool_)}
    for fill, attends in ((-np.inf, True), (LOWEST, False), (2.0, True)):
        plan = check(g, g.model(terms=[("where", "keep", fill, attends)], inputs=inputs), 1)
        step = next(s for s in plan.steps if s.op == "ScaledDotProductAttention")
        assert plan.tensors[step.inputs[4]].dtype == "bool" and attrs(plan)["fill"] == np.float32(fill)


@pytest.mark.parametrize("case, fused", [
    (dict(terms=[("where", RNG.random((6, 6)) < 0.5, 5.0, True)]), 1),  # a mask that is no band: the mask input
    (dict(terms=[("where", "keep", -5.0, False)], inputs={"keep": ((2, 1, 6, 6), np.bool_)}), 1),  # from an input
    (dict(terms=[("where", causal(6, 6), 5.0, True), ("where", RNG.random((6, 6)) < 0.7, 5.0, True)]), 1),
    (dict(terms=[("where", causal(6, 6), 5.0, True), ("where", RNG.random((6, 6)) < 0.7, 4.0, True)]), 0),  # two fills
    (dict(terms=[("where", causal(6, 6), "fill", True)], inputs={"fill": ((2, 4, 6, 6), np.float32)}), 0),  # a tensor fill
    (dict(terms=[("add", RNG.standard_normal((6, 6)).astype(np.float32))], after=("Mul", 3.0)), 0),  # scaled after
    (dict(softcap=2.0, after=("Add", 1.0)), 1),  # a bias of 1 on every score
], ids=["mask", "mask from an input", "band and mask", "two fills", "tensor fill", "scaled after the bias",
        "constant bias"])
def test_other_masks_fuse_exactly_and_near_misses_are_left_alone(case, fused):
    g = Attention()
    check(g, g.model(**case), fused)


def test_a_mask_between_biases_with_a_finite_fill_is_left_alone():
    """scores + b1, then Where(mask, ., 5.0), then + b2: neither order of the op's fill holds."""
    g = Attention()
    bias = RNG.standard_normal((6, 6)).astype(np.float32)
    check(g, g.model(terms=[("add", bias), ("where", causal(6, 6), 5.0, True), ("add", bias + 1)]), 0)


def test_a_softmax_over_another_axis_is_left_alone():
    g = Attention()
    model = g.model()
    next(n for n in model.graph.node if n.op_type == "Softmax").attribute[0].i = 2
    check(g, model, 0)


def test_a_sixteen_bit_export_is_left_alone():
    g = Attention(dtype=np.float16)
    check(g, g.model(terms=[("where", causal(6, 6), -np.inf, True)]), 0)


@pytest.mark.parametrize("layout", ["4d", "3d"])
def test_dropout_on_the_probabilities_fuses_in_training_and_draws_the_same_masks(layout):
    """A training step through Dropout(Softmax(scores)) fused draws memplan.Dropout's masks: the losses of
    three steps equal the unfused step's; in inference a training-mode Dropout is left alone."""
    g = Attention(layout=layout)
    model = g.model(terms=[("add", np.where(causal(6, 6), 0, LOWEST).astype(np.float32))], dropout=(0.25, 11),
                    params=("kt", "v"), rng=RNG)
    feeds = g.feeds(RNG)
    shapes = {n: v.shape for n, v in feeds.items()}
    losses = []
    for fuse in (True, False):
        plan = planner.compile(model, shapes, training=True, loss="mse", optimizer="sgd", fuse_attention=fuse,
                               frozen=[t.name for t in planner.load(model, shapes).params() if t.name not in ("kt", "v")])
        assert plan.stats["fused_attention"] == fuse
        labels = plan.tensors[plan.training["labels"]]
        ex = Executor(plan, backend="numpy", poison=True)
        losses.append([ex.train_step({**feeds, labels.name: np.full(labels.shape, 0.1, np.float32)}) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    assert planner.compile(model, shapes).stats["fused_attention"] == 0
