"""planner.planning: a search that compares arenas gets what planning every candidate in full gives, while
allocating only the candidates whose LOAD can beat the best arena so far."""
import pytest

import planner
from planner import Config, allocators, planning
from zoo_cases import input_shapes, small_model

ORDERS = ("file", "memory")


@pytest.fixture(scope="module")
def graph():
    model = small_model("resnet_deep")
    return planner.load(model, input_shapes(model, 2))


def test_arena_bytes_is_the_smallest_plan_and_none_where_nothing_beats_the_bound(graph):
    plans = [planning.plan_graph(graph, "bestfit", order, Config()) for order in ORDERS]
    smallest = min(p.arena_bytes for p in plans)
    assert planning.arena_bytes(graph, "bestfit", ORDERS, Config()) == smallest
    assert planning.arena_bytes(graph, "bestfit", ORDERS, Config(), below=smallest + 1) == smallest
    assert planning.arena_bytes(graph, "bestfit", ORDERS, Config(), below=smallest) is None
    chosen = planning.smallest_plan(graph, "bestfit", ORDERS, Config())
    assert chosen.schedule == min(plans, key=lambda p: p.arena_bytes).schedule and chosen.arena_bytes == smallest


def test_an_order_whose_load_cannot_beat_the_bound_is_not_allocated(graph, monkeypatch):
    placed = []
    allocate = allocators.allocate
    monkeypatch.setattr(allocators, "allocate", lambda *a, **k: placed.append(1) or allocate(*a, **k))
    load = min(planning.plan_graph(graph, "bestfit", order, Config()).lower_bound_bytes for order in ORDERS)
    placed.clear()
    assert planning.arena_bytes(graph, "bestfit", ORDERS, Config(), below=load) is None
    assert placed == []


@pytest.mark.parametrize("case", ["resnet_deep", "densenet121"])
def test_sublinear_search_skips_only_candidates_that_cannot_win(case, monkeypatch):
    """The search with bounds recomputes what it recomputes when every candidate is planned in full."""
    model = small_model(case)
    shapes = input_shapes(model, 2)
    placed = []
    allocate = allocators.allocate
    monkeypatch.setattr(allocators, "allocate", lambda *a, **k: placed.append(1) or allocate(*a, **k))
    bounded = planner.compile(model, shapes, training=True, optimizer="adam", remat="sublinear")
    with_bounds = len(placed)
    every = planning.arena_bytes
    monkeypatch.setattr(planner.compiler, "arena_bytes", lambda *a: every(*a[:6]))  # no bound
    placed.clear()
    full = planner.compile(model, shapes, training=True, optimizer="adam", remat="sublinear")
    assert bounded.training["remat"]["recomputed"] == full.training["remat"]["recomputed"]
    assert bounded.arena_bytes == full.arena_bytes
    assert with_bounds < len(placed)
    assert None in [score for _, score in bounded.training["remat"]["search"]]
