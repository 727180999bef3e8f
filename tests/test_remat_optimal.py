"""remat="optimal" (Checkmate's program over a training step) and the budget planner it measures:
plans fit their budget and verify, train bit for bit like keeping everything, even when a node is
recomputed more than once, and the solver is never beaten by the heuristic when it proves optimality."""
import numpy as np
import pytest

import planner
from executor import Executor
from frontends import read, zoo
from planner import CompileOptions, PlanError, passes
from planner.ir import Phase
from planner.remat import optimal
from zoo_cases import input_shapes, small_model

SHAPES = {"input": (512, 64)}


def deep_mlp():
    """A 54-node training step (Adam) whose activations, not its params, fill the arena."""
    return zoo.build("mlp", in_features=64, hidden=(64,) * 4, classes=10)


def compile_mlp(**kw):
    return planner.compile(deep_mlp(), SHAPES, training=True, optimizer="adam", **kw)


def train(plan, steps=2):
    ex = Executor(plan, backend="numpy", poison=True)
    rng = np.random.default_rng(0)
    data = {"input": rng.standard_normal(SHAPES["input"], dtype=np.float32),
            plan.training["labels"]: rng.integers(0, 10, plan.tensors[plan.training["labels"]].shape)}
    return [ex.train_step(data) for _ in range(steps)], ex.parameters()


@pytest.fixture(scope="module")
def none():
    return compile_mlp()


def test_optimal_fits_recomputes_twice_and_trains_exactly_like_keeping_everything(none):
    budget = int(0.75 * none.arena_bytes)
    plan = compile_mlp(remat="optimal", memory_budget=budget)
    assert plan.arena_bytes <= budget and plan.stats["recompute_flops"] > 0
    solver = plan.training["remat"]["solver"]
    assert solver["gap"] == 0 and solver["tries"] >= 1 and "Optimal" in solver["status"]
    assert any(s.name.endswith("/recompute2") for s in plan.steps)  # beyond what one drop set can do
    losses, params = train(plan)
    base_losses, base_params = train(none)
    assert losses == base_losses and all(np.array_equal(params[k], base_params[k]) for k in params)


@pytest.mark.parametrize("share", [0.95, 0.9])
def test_the_budget_planner_is_never_cheaper_than_a_proven_optimum(none, share):
    budget = int(share * none.arena_bytes)
    heuristic = compile_mlp(remat="budget", memory_budget=budget)
    best = compile_mlp(remat="optimal", memory_budget=budget)
    assert best.training["remat"]["solver"]["gap"] == 0
    assert best.stats["recompute_flops"] <= heuristic.stats["recompute_flops"]
    assert max(best.arena_bytes, heuristic.arena_bytes) <= budget


@pytest.mark.parametrize("share", [0.95, 0.85, 0.75, 0.65, 0.5])
def test_the_budget_planner_never_exceeds_its_budget(none, share):
    budget = int(share * none.arena_bytes)
    try:
        plan = compile_mlp(remat="budget", memory_budget=budget)
    except planner.InfeasibleBudgetError as e:
        assert e.minimum > budget
        assert compile_mlp(remat="budget", memory_budget=e.minimum).arena_bytes <= e.minimum
    else:
        assert plan.arena_bytes <= budget


def test_optimal_with_room_to_spare_recomputes_nothing(none):
    plan = compile_mlp(remat="optimal", memory_budget=none.arena_bytes)
    assert plan.arena_bytes == none.arena_bytes and plan.stats["recompute_flops"] == 0
    assert plan.training["remat"]["solver"]["tries"] == 0


def test_optimal_under_an_impossible_budget_says_the_smallest_found(none):
    with pytest.raises(planner.InfeasibleBudgetError) as error:
        compile_mlp(remat="optimal", memory_budget=none.stats["persistent_bytes"])
    assert none.stats["persistent_bytes"] < error.value.minimum <= none.arena_bytes


def test_optimal_needs_a_budget_and_a_small_graph():
    with pytest.raises(PlanError, match="memory_budget= goes with"):
        compile_mlp(remat="optimal")
    m = small_model("resnet_deep")
    with pytest.raises(PlanError, match=f"up to {optimal.MAX_NODES} nodes"):
        planner.compile(m, input_shapes(m, 2), training=True, remat="optimal", memory_budget=2**30)


def test_the_dag_counts_only_what_can_be_freed(none):
    graph, _ = passes.run(passes.pipeline(CompileOptions(training=True, optimizer="adam")), read(deep_mlp()),
                          passes.Context(SHAPES))
    sizes, costs, deps, allowed, inplace = optimal.dag(graph)
    assert all(p < k and p in deps[k] for k, p in inplace.items()) and inplace
    nodes = graph.nodes
    assert len(sizes) == len(nodes) and min(costs) >= 1
    for t, i in zip(*np.nonzero(allowed)):
        assert i < t and not nodes[t].notes.forward and nodes[i].notes.forward
    updates = [k for k, n in enumerate(nodes) if n.notes.phase is Phase.OPTIMIZER]
    assert updates and all(sizes[k] == 0 for k in updates if all(o in dict(graph.updates) for o in nodes[k].outputs))


def test_budget_beyond_one_clone_per_tensor_uses_nearby_clones_and_trains_exactly(none):
    budget = int(0.8 * none.arena_bytes)
    plan = compile_mlp(remat="budget", memory_budget=budget)
    assert plan.arena_bytes <= budget and plan.training["remat"]["horizon"] is not None
    assert any(s.name.endswith("/recompute2") for s in plan.steps)
    losses, params = train(plan)
    base_losses, base_params = train(none)
    assert losses == base_losses and all(np.array_equal(params[k], base_params[k]) for k in params)


def test_a_shorter_horizon_recomputes_more():
    from planner.remat import budget
    from planner.remat.recompute import droppable, recompute
    graph, _ = passes.run(passes.pipeline(CompileOptions(training=True, optimizer="adam")), read(deep_mlp()),
                          passes.Context(SHAPES))
    drop = droppable(graph)
    flops = [budget.recompute_flops(recompute(graph, drop, horizon)) for horizon in (None, 16, 4, 0)]
    assert flops == sorted(flops) and flops[0] < flops[-1]


def test_cpsat_solves_the_same_step(none):
    pytest.importorskip("ortools")
    budget = int(0.8 * none.arena_bytes)
    milp = compile_mlp(remat="optimal", memory_budget=budget)
    cpsat = compile_mlp(remat="optimal", memory_budget=budget, config=planner.Config(remat_solver="cpsat"))
    assert cpsat.arena_bytes <= budget and cpsat.training["remat"]["solver"]["solver"] == "cpsat"
    assert cpsat.stats["recompute_flops"] == milp.stats["recompute_flops"]
