"""The arena's breakdown (planner/breakdown.py): each field defined once, the same way for every
strategy and for inference and training, checked against a step-by-step recount; and naive as the
arena that keeps every tensor."""
import pytest

import planner
from graphs import model, node
from planner import Config, breakdown
from planner.allocators import align
from zoo_cases import input_shapes, small_model

ROW = 4 * 256
STRATEGIES = ("naive", "inplace", "share", "bestfit")
CASES = [("mlp", False), ("resnet18", False), ("bert_base", False), ("lenet", True), ("mobilenet_v2", True)]


def recount(plan):
    """The breakdown by brute force: at every step, each live buffer in the category of the member that
    took it over last; the first step holding the most wins; persistent tensors count throughout."""
    parts = dict.fromkeys(breakdown.fields(bool(plan.training)), 0)
    groups = {}
    for t in plan.tensors.values():
        if t.lifetime is None and t.alias_of is None:
            parts[breakdown.FIELDS[breakdown.category(t)]] += align(t.nbytes)
        elif t.lifetime is not None:
            groups.setdefault(t.alias_of or t.name, []).append(t)
    best, at = None, None
    for step in range(len(plan.steps) + 1):
        live = dict.fromkeys(parts, 0)
        for root, members in groups.items():
            if plan.tensors[root].lifetime is None:
                continue
            start, end = min(m.lifetime[0] for m in members), max(m.lifetime[1] for m in members)
            if start <= step <= end:
                holder = max((m for m in members if m.lifetime[0] <= step), key=lambda m: m.lifetime)
                live[breakdown.FIELDS[breakdown.category(holder)]] += align(plan.tensors[root].nbytes)
        if best is None or sum(live.values()) > sum(best.values()):
            best, at = live, step
    for k, v in best.items():
        parts[k] += v
    parts["free"] = plan.arena_bytes - sum(parts.values())
    return parts, at


@pytest.mark.parametrize("mode", ["pool", "tensor"])
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case, training", CASES)
def test_every_field_means_the_same_for_every_strategy(case, training, strategy, mode):
    m = small_model(case)
    plan = planner.compile(m, input_shapes(m, 2), strategy=strategy, training=training,
                           config=Config(workspace_mode=mode))
    parts, step = recount(plan)
    assert plan.breakdown == parts and plan.stats["fullest_step"] == step
    assert sum(plan.breakdown.values()) == plan.arena_bytes
    assert plan.breakdown["free"] == plan.arena_bytes - plan.lower_bound_bytes >= 0
    assert set(plan.breakdown) == set(breakdown.fields(training))


@pytest.mark.parametrize("case, training", CASES)
def test_naive_keeps_every_tensor_in_bytes_of_its_own(case, training):
    m = small_model(case)
    plan = planner.compile(m, input_shapes(m, 2), strategy="naive", training=training)
    roots = [t for t in plan.tensors.values() if t.alias_of is None]
    assert plan.arena_bytes == sum(align(t.nbytes) for t in roots)
    shared = [t for t in plan.tensors.values() if t.alias_of is not None]
    assert all(t.view or t.role == "update" for t in shared), "naive writes nothing in place"


def test_io_holds_the_graph_inputs_and_outputs_live_at_the_fullest_step():
    # x is read again by the last node, so it is live at every step. Naive: the fullest step is 1
    # (x, a, b); in place, b and y overwrite a, and the first fullest step is 0 (x, a).
    #   naive   bytes ▲      [ b       ]          in place  bytes ▲ [ a = b = y ]
    #                 │ [ a       ] [ y ]                         │ [ x         ]
    #                 │ [ x             ]                         └──0───1───2──▶ step
    #                 └──0────1────2──▶ step
    m = model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]), node("Add", ["x", "b"], ["y"])],
              {"x": 256}, ["y"])
    for strategy, step, activations in (("naive", 1, 2 * ROW), ("inplace", 0, ROW), ("bestfit", 0, ROW)):
        plan = planner.compile(m, strategy=strategy, schedule="file")
        assert plan.stats["fullest_step"] == step
        assert plan.breakdown["io"] == ROW and plan.breakdown["activations"] == activations


def test_training_fields_cover_saved_values_and_gradients():
    m = small_model("mlp")
    plan = planner.compile(m, input_shapes(m, 4), training=True, optimizer="adam", update="after_backward")
    assert plan.breakdown["optimizer"] == sum(align(t.nbytes) for t in plan.tensors.values() if t.kind == "state")
    assert plan.breakdown["params"] >= sum(align(t.nbytes) for t in plan.tensors.values() if t.kind == "param")
    assert plan.breakdown["saved"] + plan.breakdown["grads"] > 0


def test_peak_of_some_fields_is_their_most_bytes_at_one_step():
    """peak(plan, fields) against a step-by-step recount: all the transient fields peak at the fullest step
    with the breakdown's bytes (the workspace pooled, so persistent); without the gradients (a training step's
    activation memory) no step holds more than the peak, and its step holds that much."""
    m = small_model("lenet")
    plan = planner.compile(m, input_shapes(m, 4), training=True, update="after_backward",
                           config=Config(workspace_mode="pool"))
    transient = ("workspace", "io", "saved", "grads", "activations")
    groups = {}
    for t in plan.tensors.values():
        if t.lifetime is not None:
            groups.setdefault(t.alias_of or t.name, []).append(t)
    assert breakdown.peak(plan, transient) == (sum(plan.breakdown[f] for f in transient[1:]),
                                               plan.stats["fullest_step"])
    fields = ("io", "saved", "activations")
    most, at = breakdown.peak(plan, fields)

    def held(step):
        total = 0
        for root, members in groups.items():
            if plan.tensors[root].lifetime is None or not any(m.lifetime[0] <= step <= m.lifetime[1] for m in members):
                continue
            holder = max((m for m in members if m.lifetime[0] <= step), key=lambda m: m.lifetime)
            total += align(plan.tensors[root].nbytes) * (breakdown.FIELDS[breakdown.category(holder)] in fields)
        return total
    assert held(at) == most == max(held(s) for s in range(len(plan.steps)))
    assert most < plan.lower_bound_bytes
