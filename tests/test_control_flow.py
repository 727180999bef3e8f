"""If, Loop and Scan planned statically (their subgraphs inlined), within a bound on what unrolling adds, and
ops that fold away before support is checked: each model runs like onnxruntime, or is refused with the reason."""
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper

import planner
from isolation import isolated
from planner.ops import control_flow
from zoo_cases import run_on

F = T.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def value(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array)))


def runs_like_onnxruntime(backend, m, feeds):
    """The plan's outputs (NumPy backend, poison on) equal onnxruntime's; returns the plan."""
    plan = planner.compile(m, {k: v.shape for k, v in feeds.items()})
    got = run_on(backend, plan, feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for out, w in zip(m.graph.output, want):
        np.testing.assert_allclose(got[out.name], w, rtol=1e-5, atol=1e-6, err_msg=out.name)
    return plan


def branches(then_shape=(2, 3)):
    """then: x * 2 (or a reshaped copy when `then_shape` differs); else: x + outer, `outer` captured."""
    then = helper.make_graph([const("two", np.float32(2)), helper.make_node("Mul", ["x", "two"], ["t"])]
                             if then_shape == (2, 3) else
                             [const("s", np.array(then_shape, np.int64)), helper.make_node("Reshape", ["x", "s"], ["t"])],
                             "then", [], [value("t")])
    other = helper.make_graph([helper.make_node("Add", ["x", "outer"], ["e"])], "else", [], [value("e")])
    return dict(then_branch=then, else_branch=other)


def test_if_with_a_known_condition_takes_one_branch(backend):
    nodes = [const("c", np.array(False)), helper.make_node("Relu", ["x"], ["outer"]),
             helper.make_node("If", ["c"], ["y"], **branches())]
    m = model(nodes, [value("x", F, [2, 3])], [value("y")])
    plan = runs_like_onnxruntime(backend, m, {"x": np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)})
    assert {s.op for s in plan.steps} == {"Relu", "Add"}


@pytest.mark.parametrize("flag", [True, False])
def test_if_with_a_runtime_condition_runs_both_and_selects(flag, backend):
    nodes = [helper.make_node("Relu", ["x"], ["outer"]), helper.make_node("If", ["c"], ["y"], **branches())]
    m = model(nodes, [value("x", F, [2, 3]), value("c", T.BOOL, [])], [value("y")])
    feeds = {"x": np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32), "c": np.array(flag)}
    plan = runs_like_onnxruntime(backend, m, feeds)
    assert "Select" in {s.op for s in plan.steps}


def test_if_whose_branches_differ_in_shape_is_refused_when_the_condition_is_data():
    nodes = [helper.make_node("Relu", ["x"], ["outer"]), helper.make_node("If", ["c"], ["y"], **branches((3, 2)))]
    m = model(nodes, [value("x", F, [2, 3]), value("c", T.BOOL, [])], [value("y")])
    with pytest.raises(planner.ShapeError, match=r"If_1.*one shape"):
        planner.compile(m)


def loop_body(stop_at=None):
    """(i, cond, acc) -> (cond', acc + x[i], acc as a scan output); cond' = i + 1 < stop_at when given."""
    nodes = [helper.make_node("Unsqueeze", ["i", "zero"], ["at"]), const("zero", np.array([0], np.int64)),
             helper.make_node("Gather", ["x", "i"], ["row"]), helper.make_node("Add", ["acc", "row"], ["acc2"]),
             helper.make_node("Identity", ["acc"], ["seen"])]
    nodes.insert(0, nodes.pop(1))
    if stop_at is None:
        nodes.append(helper.make_node("Identity", ["cond"], ["cond2"]))
    else:
        nodes += [const("one", np.int64(1)), const("stop", np.int64(stop_at)), helper.make_node("Add", ["i", "one"], ["next"]),
                  helper.make_node("Less", ["next", "stop"], ["cond2"])]
    return helper.make_graph(nodes, "body", [value("i", T.INT64, []), value("cond", T.BOOL, []), value("acc", F, [3])],
                             [value("cond2", T.BOOL, []), value("acc2", F, [3]), value("seen", F, [3])])


@pytest.mark.parametrize("trips, stop_at", [(4, None), (10, 3)])
def test_loop_unrolls_while_its_count_and_condition_are_known(trips, stop_at, backend):
    nodes = [const("m", np.int64(trips)), const("go", np.array(True)), const("start", np.zeros(3, np.float32)),
             helper.make_node("Loop", ["m", "go", "start"], ["total", "seen"], body=loop_body(stop_at))]
    m = model(nodes, [value("x", F, [5, 3])], [value("total"), value("seen")])
    plan = runs_like_onnxruntime(backend, m, {"x": np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)})
    assert plan.tensors["seen"].shape == (min(trips, stop_at or trips), 3)


def test_loop_with_a_data_dependent_count_is_refused():
    nodes = [const("go", np.array(True)), const("start", np.zeros(3, np.float32)),
             helper.make_node("Loop", ["m", "go", "start"], ["total", "seen"], body=loop_body())]
    m = model(nodes, [value("x", F, [5, 3]), value("m", T.INT64, [])], [value("total")])
    with pytest.raises(planner.ShapeError, match="trip count M depends on input data"):
        planner.compile(m)


def test_scan_runs_backwards_and_stacks_on_another_axis(backend):
    body = helper.make_graph([helper.make_node("Add", ["s", "row"], ["s2"]), helper.make_node("Mul", ["s2", "w"], ["out"])],
                             "body", [value("s", F, [4]), value("row", F, [4])], [value("s2", F, [4]), value("out", F, [4])])
    nodes = [helper.make_node("Exp", ["x"], ["w0"]), helper.make_node("ReduceMean", ["w0"], ["w"], keepdims=0),
             helper.make_node("Scan", ["init", "x"], ["final", "stacked"], body=body, num_scan_inputs=1,
                              scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[-1])]
    m = model(nodes, [value("init", F, [4]), value("x", F, [4, 5])], [value("final"), value("stacked")])
    rng = np.random.default_rng(3)
    plan = runs_like_onnxruntime(backend, m, {"init": rng.normal(size=4).astype(np.float32),
                                     "x": rng.normal(size=(4, 5)).astype(np.float32)})
    assert plan.tensors["stacked"].shape == (4, 5)


def test_an_if_inside_a_loop_reads_names_of_both_scopes(backend):
    inner = dict(then_branch=helper.make_graph([helper.make_node("Mul", ["acc2", "scale"], ["r"])], "t", [], [value("r")]),
                 else_branch=helper.make_graph([helper.make_node("Neg", ["acc2"], ["r2"])], "e", [], [value("r2")]))
    body = loop_body()
    body.node.extend([helper.make_node("Less", ["i", "two"], ["early"]),
                      helper.make_node("If", ["early"], ["picked"], **inner)])
    body.node.insert(0, const("two", np.int64(2)))
    body.output[2].CopyFrom(value("picked", F, [3]))
    nodes = [const("m", np.int64(4)), const("go", np.array(True)), const("start", np.zeros(3, np.float32)),
             helper.make_node("Sigmoid", ["x0"], ["scale"]),
             helper.make_node("Loop", ["m", "go", "start"], ["total", "picks"], body=body)]
    m = model(nodes, [value("x", F, [5, 3]), value("x0", F, [3])], [value("total"), value("picks")])
    rng = np.random.default_rng(4)
    runs_like_onnxruntime(backend, m, {"x": rng.normal(size=(5, 3)).astype(np.float32), "x0": rng.normal(size=3).astype(np.float32)})


def nonzero_model(source):
    nodes = [const("c", np.array([[1, 0, 2], [0, 0, 3]], np.float32)), helper.make_node("NonZero", [source], ["nz"]),
             helper.make_node("Shape", ["nz"], ["s"]), helper.make_node("Cast", ["s"], ["sf"], to=F),
             helper.make_node("ReduceSum", ["sf"], ["t"], keepdims=0), helper.make_node("Mul", ["x", "t"], ["y"])]
    return model(nodes, [value("x", F, [2, 3])], [value("y")])


def test_an_op_without_a_schema_folds_away_when_its_inputs_are_constants(backend):
    plan = runs_like_onnxruntime(backend, nonzero_model("c"), {"x": np.ones((2, 3), np.float32)})
    assert [s.op for s in plan.steps] == ["Mul"]


def test_an_op_refused_by_design_says_why():
    with pytest.raises(planner.UnsupportedOpError, match=r"NonZero \(x1\); NonZero: the length of its output depends "
                                                         r"on the input's values"):
        planner.compile(nonzero_model("x"))


def nested_loops(outer, inner, inner_from_outer=False):
    """y = x + outer * inner by a Loop of `outer` iterations around a Loop of `inner` adding one each time;
    with `inner_from_outer`, the inner trip count is the outer iteration plus `inner`, so known only as each
    outer iteration is unrolled."""
    add_one = helper.make_graph([helper.make_node("Add", ["a", "one"], ["a2"]),
                                 helper.make_node("Identity", ["c"], ["c2"])],
                                "inner", [value("j", T.INT64, []), value("c", T.BOOL, []), value("a", F, [1])],
                                [value("c2", T.BOOL, []), value("a2", F, [1])])
    count = ([const("k", np.int64(inner)), helper.make_node("Add", ["i", "k"], ["m"])] if inner_from_outer
             else [const("m", np.int64(inner))])
    body = helper.make_graph([*count, helper.make_node("Loop", ["m", "", "b"], ["b2"], body=add_one),
                              helper.make_node("Identity", ["c"], ["c2"])],
                             "outer", [value("i", T.INT64, []), value("c", T.BOOL, []), value("b", F, [1])],
                             [value("c2", T.BOOL, []), value("b2", F, [1])])
    nodes = [const("one", np.ones(1, np.float32)), const("n", np.int64(outer)),
             helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="outer")]
    return model(nodes, [value("x", F, [1])], [value("y")])


def scan_of_loops(length, inner):
    """A Scan over the `length` rows of x whose body adds one `inner` times (a Loop) to its state."""
    loop_body = nested_loops(1, inner).graph.node[2].attribute[0].g
    body = helper.make_graph(list(loop_body.node[:-1]), "scan", [value("b", F, [1]), value("row", F, [1])],
                             [value("b2", F, [1])])
    nodes = [const("one", np.ones(1, np.float32)),
             helper.make_node("Scan", ["x0", "x"], ["y"], body=body, num_scan_inputs=1, name="scan")]
    return model(nodes, [value("x0", F, [1]), value("x", F, [length, 1])], [value("y")])


def test_nested_loops_within_the_bound_plan_and_run(backend):
    plan = runs_like_onnxruntime(backend, nested_loops(3, 4), {"x": np.zeros(1, np.float32)})
    assert sum(s.op == "Add" for s in plan.steps) == 12
    feeds = {"x0": np.zeros(1, np.float32), "x": np.ones((3, 1), np.float32)}
    runs_like_onnxruntime(backend, scan_of_loops(3, 2), feeds)


def planned_steps(m):
    return len(planner.compile(m).steps)


@pytest.mark.parametrize("m,pattern", [
    (nested_loops(1024, 1024), r"node 'outer' \(Loop\): unrolling it \(1,024 iterations of a body of 2,050 nodes, "
                               r"nested Loops and Scans multiplied\) makes at least 2,099,200 nodes, more than the "
                               r"65,536 memplan unrolls \(planner.ops.control_flow.MAX_UNROLLED\)"),
    (nested_loops(2000, 1), r"node 'outer' \(Loop\): it runs 2,000 iterations, more than the 1024 memplan unrolls"),
    (scan_of_loops(1000, 1000), r"node 'scan' \(Scan\): unrolling it \(1,000 iterations of a body of 2,001 nodes"),
])
def test_nested_loops_past_the_bound_are_refused_before_any_copy(m, pattern):
    # Unrolled, the first would add two million nodes and plan for many minutes (the child's time cap is 60 s).
    kind, detail = isolated(planned_steps, m)
    assert kind == "error" and detail.startswith("ShapeError: ") and re.search(pattern, detail), detail


def test_loops_whose_counts_are_known_late_are_counted_as_they_unroll(monkeypatch):
    monkeypatch.setattr(control_flow, "MAX_UNROLLED", 300)
    planner.compile(nested_loops(4, 10, inner_from_outer=True))  # 10 + 11 + 12 + 13 inner iterations: within it
    with pytest.raises(planner.ShapeError, match=r"node 'outer/\d+/Loop_\d' \(Loop\): unrolling the model's control "
                                                 r"flow makes 30\d nodes, more than the 300 memplan unrolls"):
        planner.compile(nested_loops(16, 10, inner_from_outer=True))
