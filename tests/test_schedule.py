"""Schedules: every order is a topological order of every node, "memory" never has a higher peak
than "file", and on hand-built graphs with a bad file order it finds the peak worked out by hand.

Tensors are rows of float32; one unit U = a (1, 256) row = 1024 bytes, a multiple of the alignment.
"""
import numpy as np
import pytest
from onnx import numpy_helper

import planner
from graphs import model, node, random_dag
from planner import PlanError
from planner.liveness import peak_bytes
from planner.schedule import ORDERS, schedule
from zoo_cases import CASES, input_shapes, small_model

U = 4 * 256


def check_topological(graph, steps):
    """Every node exactly once, each after the nodes writing its inputs."""
    assert sorted(map(id, steps)) == sorted(map(id, graph.nodes))
    done = set()
    for step in steps:
        for name in step.inputs:
            writer = graph.producers.get(name)
            assert writer is None or id(writer) in done, f"{step} runs before {writer}"
        done.add(id(step))


def peaks(graph, held=()):
    """{order: peak bytes} of every schedule order, each checked to be topological."""
    held = (*graph.outputs, *held)
    result = {}
    for order in ORDERS:
        steps = schedule(graph, order, held)
        check_topological(graph, steps)
        result[order] = peak_bytes(graph, steps, held)
    return result


@pytest.mark.parametrize("case", sorted(CASES))
def test_zoo_orders_are_topological_and_memory_is_no_worse(case):
    m = small_model(case)
    graph = planner.load(m, input_shapes(m, 1))
    assert schedule(graph, "file") == graph.nodes
    p = peaks(graph)
    assert p["memory"] <= p["file"]


@pytest.mark.parametrize("seed", range(8))
def test_random_dags_with_fetched_tensors(seed):
    rng = np.random.default_rng(seed)
    graph = planner.load(random_dag(lambda lo, hi: int(rng.integers(lo, hi + 1)), 40))
    fetched = tuple(n.outputs[0] for n in graph.nodes[::7])
    p = peaks(graph, fetched)
    assert p["memory"] <= p["file"]


def fan_out_fan_in(n=8):
    """x feeds n Relus summed by a chain of Adds; the file runs all the Relus first."""
    relus = [node("Relu", ["x"], [f"r{k}"]) for k in range(1, n + 1)]
    sums, acc = [], "r1"
    for k in range(2, n + 1):
        out = "y" if k == n else f"s{k}"
        sums.append(node("Add", [acc, f"r{k}"], [out]))
        acc = out
    return model(relus + sums, {"x": 256}, ["y"])


def test_memory_interleaves_producers_with_their_readers():
    # file: r1..r8, then s2 = r1 + r2, s3 = s2 + r3, ..., y = s7 + r8.
    #   At r8 the input and all eight rows are live: 9 U.
    # memory: r1, r2, s2, r3, s3, ..., r8, y: at most x, the running sum, one row and the new sum: 4 U.
    #
    #   U  file            memory
    #   9  ┃x r1..r8┃
    #   4                  ┃x s r s'┃
    graph = planner.load(fan_out_fan_in())
    assert peaks(graph) == {"file": 9 * U, "memory": 4 * U}
    steps = [n.outputs[0] for n in schedule(graph, "memory", graph.outputs)]
    assert steps[:5] == ["r1", "r2", "s2", "r3", "s3"]


def big_then_small():
    """y = Concat(a2, b2): branch a widens x to 4 U then slices 1 U; branch b doubles x to 2 U."""
    nodes = [node("Relu", ["x"], ["b1"]), node("Concat", ["b1", "b1"], ["b2"], axis=1),
             node("Concat", ["x", "x", "x", "x"], ["a1"], axis=1),
             node("Slice", ["a1", "starts", "ends", "axes"], ["a2"]),
             node("Concat", ["a2", "b2"], ["y"], axis=1)]
    bounds = {"starts": [0], "ends": [256], "axes": [1]}
    m = model(nodes, {"x": 256}, ["y"])
    m.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in bounds.items())
    return m


def test_memory_runs_the_hungrier_branch_first():
    # The file's order b1, b2, a1, a2, y is also the greedy list scheduler's (a1 allocates the
    # most, so it waits): a1 runs while b2 is held.   The DFS runs branch a first, holding only a2:
    #
    #   step   file / greedy                  DFS (a first)
    #   b1     x b1            2 U            a1   x a1          5 U
    #   b2     x b1 b2         4 U            a2   x a1 a2       6 U
    #   a1     x b2 a1         7 U  <- peak   b1   x a2 b1       3 U
    #   a2     b2 a1 a2        7 U            b2   a2 b1 b2      4 U
    #   y      b2 a2 y         6 U            y    a2 b2 y       6 U  <- peak
    graph = planner.load(big_then_small())
    assert peaks(graph) == {"file": 7 * U, "memory": 6 * U}


def test_same_result_every_time():
    m = small_model("densenet121")
    graph = planner.load(m, input_shapes(m, 1))
    first = schedule(graph, "memory", graph.outputs)
    again = planner.load(m, input_shapes(m, 1))
    assert [n.name for n in schedule(again, "memory", again.outputs)] == [n.name for n in first]
    assert schedule(graph, "memory", graph.outputs) == first


def test_unknown_order_names_the_choices():
    graph = planner.load(fan_out_fan_in(2))
    with pytest.raises(PlanError, match="'file', 'memory'"):
        schedule(graph, "auto")


def test_an_update_no_order_can_wait_for_is_refused_by_name():
    """A node writes the value that overwrites `w` while a node that must run after it still reads `w` (as where
    an exporter shares one initializer between a trained weight and a running statistic): no order runs every
    node, and the error names them instead of a schedule that leaves nodes out."""
    from dataclasses import replace
    m = model([node("Mul", ["x", "two"], ["t"]), node("Add", ["t", "w"], ["y"])], {"x": 256}, ["y"],
              {"two": np.full((1, 256), 2.0), "w": np.ones((1, 256))})
    graph = planner.load(m)
    graph = replace(graph, updates=(("t", "w"),))
    with pytest.raises(PlanError, match=r"no order runs every node: (t -> y -> t|y -> t -> y) wait on each other"):
        schedule(graph, "memory", graph.outputs)


def test_followed_moves_an_update_back_after_the_readers_of_what_it_overwrites():
    """`followed` keeps an order as it is where it may, and moves a node after what it must follow: here the update
    of `w`, placed first, after the Add that reads the old `w`."""
    from dataclasses import replace

    from planner.schedule import followed
    m = model([node("Mul", ["x", "two"], ["t"]), node("Add", ["x", "w"], ["y"]), node("Neg", ["t"], ["u"])],
              {"x": 256}, ["y", "u"], {"two": np.full((1, 256), 2.0), "w": np.ones((1, 256))})
    graph = planner.load(m)
    graph = replace(graph, updates=(("t", "w"),))
    mul, add, neg = graph.nodes
    assert followed(graph, [neg, mul, add]) == (add, mul, neg)
    assert followed(graph, [add, mul, neg]) == (add, mul, neg)
