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


def test_a_measured_arena_is_the_smallest_plan_and_none_where_nothing_beats_the_bound(graph):
    plans = [planning.plan_graph(graph, "bestfit", order, Config()) for order in ORDERS]
    smallest = min(p.arena_bytes for p in plans)
    measured = planning.measure(graph, "bestfit", ORDERS, Config())
    assert measured.load == min(p.lower_bound_bytes for p in plans)
    assert measured.arena() == smallest and measured.arena(below=smallest + 1) == smallest
    assert measured.arena(below=smallest) is None
    chosen = planning.smallest_plan(graph, "bestfit", ORDERS, Config())
    assert chosen.schedule == min(plans, key=lambda p: p.arena_bytes).schedule and chosen.arena_bytes == smallest


def test_an_order_whose_load_cannot_beat_the_bound_is_not_allocated(graph, monkeypatch):
    placed = []
    allocate = allocators.allocate
    monkeypatch.setattr(allocators, "allocate", lambda *a, **k: placed.append(1) or allocate(*a, **k))
    measured = planning.measure(graph, "bestfit", ORDERS, Config())
    assert measured.arena(below=measured.load) is None
    assert placed == []


@pytest.mark.parametrize("case", ["resnet_deep", "densenet121"])
def test_sublinear_search_skips_only_candidates_that_cannot_win(case, monkeypatch):
    """The search with bounds recomputes what it recomputes when every candidate is allocated."""
    model = small_model(case)
    shapes = input_shapes(model, 2)
    placed = []
    allocate = allocators.allocate
    monkeypatch.setattr(allocators, "allocate", lambda *a, **k: placed.append(1) or allocate(*a, **k))
    bounded = planner.compile(model, shapes, training=True, optimizer="adam", remat="sublinear")
    with_bounds = len(placed)
    measured = planning.Measured.__init__

    def unbounded(self, buffers):  # a LOAD of 0 rules out no candidate
        measured(self, buffers)
        self.load = 0

    monkeypatch.setattr(planning.Measured, "__init__", unbounded)
    placed.clear()
    full = planner.compile(model, shapes, training=True, optimizer="adam", remat="sublinear")
    assert bounded.training["remat"]["recomputed"] == full.training["remat"]["recomputed"]
    assert bounded.arena_bytes == full.arena_bytes
    assert with_bounds < len(placed)
    assert None in [score for _, score in bounded.training["remat"]["search"]]
