"""passes.pattern: what a pattern matches (and what it must not), and a rewrite that keeps the results."""
import numpy as np
import pytest

import planner
from executor import Executor
from frontends import symbol as S
from planner import shapes
from planner.errors import ModelError
from planner.ir import Node
from planner.passes.pattern import Op, matches, rewrite

SILU = Op("Mul", "x", Op("Sigmoid", "x"))
LINEAR = Op("Add", Op("MatMul", "a", "b", name="matmul"), "c")
RNG = np.random.default_rng(0)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def silus():
    x = S.var("x", (2, 3))
    y = S.var("y", (2, 3))
    one = S.op("Mul", x, S.op("Sigmoid", x, name="s1"), name="m1")            # x * sigmoid(x)
    two = S.op("Mul", S.op("Sigmoid", one, name="s2"), one, name="m2")        # sigmoid(v) * v: swapped
    three = S.op("Mul", y, S.op("Sigmoid", two, name="s3"), name="m3")        # y * sigmoid(v): not a SiLU
    return planner.load(three)


def linear(shared=False):
    x = S.var("x", (4, 8))
    h = S.op("MatMul", x, S.param("w", _w(8, 5)), name="mm")
    y = S.op("Add", S.param("b", _w(5)), h, name="add")                      # bias first: commuted
    out = S.op("Relu", y, name="relu")
    return planner.load(S.group(out, S.op("Neg", h, name="neg")) if shared else out)


def test_silu_matches_either_order_and_binds_one_tensor():
    found = matches(silus(), SILU)
    assert [(m.root.name, [n.name for n in m.nodes]) for m in found] == [("m1", ["s1", "m1"]), ("m2", ["s2", "m2"])]
    assert found[0].bindings == {"x": "x"} and found[1].bindings == {"x": found[0].root.outputs[0]}


def test_linear_binds_variables_and_named_nodes():
    graph = linear()
    (m,) = matches(graph, LINEAR)
    assert m.bindings == {"a": "x", "b": "w", "c": "b"} and m.named["matmul"].name == "mm" and m.root.name == "add"


def test_a_match_whose_inner_value_is_read_elsewhere_is_not_exclusive():
    assert matches(linear(shared=True), LINEAR) == []


def test_attributes_must_agree_with_defaults_filled_in():
    x = S.var("x", (2, 3, 4))
    graph = planner.load(S.op("Transpose", x, perm=[0, 2, 1], name="t"))
    assert len(matches(graph, Op("Transpose", "x", attrs={"perm": [0, 2, 1]}))) == 1
    assert matches(graph, Op("Transpose", "x", attrs={"perm": [2, 1, 0]})) == []
    graph = planner.load(S.op("Softmax", x, name="s"))
    assert len(matches(graph, Op("Softmax", "x", attrs={"axis": -1}))) == 1


def as_gemm(m):
    return [Node("Gemm", (m.bindings["a"], m.bindings["b"], m.bindings["c"]), m.root.outputs, {}, m.root.name)]


def test_rewrite_replaces_the_match_and_keeps_results():
    graph = linear()
    fused, modified = rewrite(graph, LINEAR, as_gemm)
    assert modified and [n.op for n in fused.nodes] == ["Gemm", "Relu"]
    assert all(t.is_static for t in fused.tensors.values()) and "mm:0" not in fused.tensors
    again = shapes.infer(fused)
    assert [(t.name, t.shape, t.dtype) for t in again.tensors.values()] == \
        [(t.name, t.shape, t.dtype) for t in fused.tensors.values()]
    feeds = {"x": _w(4, 8)}
    before = Executor(planner.compile(graph), backend="numpy").run(feeds)
    after = Executor(planner.compile(fused), backend="numpy").run(feeds)
    assert before.keys() == after.keys() and all(np.allclose(before[k], after[k], atol=1e-5) for k in before)


def test_rewrite_without_a_match_changes_nothing():
    graph = linear(shared=True)
    assert rewrite(graph, LINEAR, as_gemm) == (graph, False)


def test_a_rewrite_must_write_the_roots_outputs():
    with pytest.raises(ModelError, match="does not write"):
        rewrite(linear(), LINEAR, lambda m: [Node("Relu", (m.bindings["a"],), ("other",), {}, "r")])
