"""planner.compile end to end: hand-built graphs with known arenas, planted faults that verify()
must catch, random DAGs under every strategy, and every zoo model under every strategy."""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from graphs import model, node, random_dag
from planner import Config, PlanError
from planner.compiler import STRATEGIES
from zoo_cases import CASES, input_shapes, small_model

ROW = 4 * 256  # bytes of one (1, 256) float32 row: already a multiple of the 256-byte alignment
FAST = Config(time_limit=1.0)


def plan(m, strategy="bestfit", **kw):
    return planner.compile(m, strategy=strategy, schedule="file", config=kw.pop("config", FAST), **kw)


def chain(n=4):
    names = ["x", *(f"t{k}" for k in range(n - 1)), "y"]
    return model([node("Relu", [a], [b]) for a, b in zip(names, names[1:])], {"x": 256}, ["y"])


def test_inplace_chain_uses_one_buffer():
    # x ─Relu─▶ t0 ─Relu─▶ t1 ─Relu─▶ t2 ─Relu─▶ y: x is the caller's, t0 takes a new buffer and
    # t1, t2 and y overwrite it in turn.
    #   bytes ▲ [ t0 = t1 = t2 = y ]
    #         │ [ x ]
    #         └──0────1────2────3──▶ step
    p = plan(chain())
    assert p.arena_bytes == 2 * ROW and p.lower_bound_bytes == 2 * ROW
    assert [p.tensors[n].alias_of for n in ("t0", "t1", "t2", "y")] == [None, "t0", "t0", "t0"]
    assert p.stats["inplace"] == 3
    assert plan(chain(), "naive").arena_bytes == 5 * ROW
    assert plan(chain(), "inplace").arena_bytes == 2 * ROW


def test_diamond():
    # a has two readers, so b may not overwrite it; c, its last reader, may; d overwrites b.
    #   x ─▶ a ─▶ b ─┐
    #         └─▶ c ─┴▶ d
    m = model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]), node("Relu", ["a"], ["c"]),
               node("Add", ["b", "c"], ["d"])], {"x": 256}, ["d"])
    p = plan(m)
    assert p.tensors["b"].alias_of is None and p.tensors["c"].alias_of == "a" and p.tensors["d"].alias_of == "b"
    # x dies at step 0; b, born at step 1, takes its place: two rows in all.
    assert p.arena_bytes == 2 * ROW
    assert p.tensors["b"].offset == p.tensors["x"].offset


def test_graph_output_survives():
    # y is a graph output read by the next node: z must not overwrite it.
    m = model([node("Relu", ["x"], ["y"]), node("Relu", ["y"], ["z"])], {"x": 256}, ["y", "z"])
    for strategy in STRATEGIES:
        p = plan(m, strategy)
        assert p.tensors["z"].alias_of is None
        assert p.tensors["y"].lifetime == (0, 2) and p.tensors["z"].lifetime == (1, 2)


def test_fetched_tensor_is_held():
    p = plan(chain(), fetch=("t0",))
    assert p.tensors["t1"].alias_of is None and p.tensors["t0"].lifetime == (0, 4)
    with pytest.raises(PlanError, match="nope"):
        plan(chain(), fetch=("nope",))


def test_views_alias_without_writing():
    m = model([node("Relu", ["x"], ["a"]), node("Flatten", ["a"], ["b"], axis=0), node("Relu", ["a"], ["c"]),
               node("Add", ["b", "c"], ["y"])], {"x": 256}, ["y"])
    p = plan(m)
    assert p.tensors["b"].alias_of == "a" and p.tensors["b"].view
    # c may not overwrite a: the view b still reads those bytes.
    assert p.tensors["c"].alias_of is None


def test_no_inplace_into_inputs_or_params():
    m = model([node("Add", ["x", "w"], ["y"])], {"x": 256}, ["y"], {"w": np.ones((1, 256))})
    p = plan(m)
    assert p.tensors["y"].alias_of is None
    assert p.breakdown["params"] == ROW and p.arena_bytes == 3 * ROW


def test_match_range_zero_and_inplace_off_is_naive():
    m = chain(6)
    off = Config(match_range=0, enable_inplace=False)
    assert plan(m, "share", config=off).arena_bytes == plan(m, "naive").arena_bytes


def test_verify_catches_a_planted_overlap():
    # d = Add(b, c) of two live rows: place c on top of b.
    m = model([node("Relu", ["x"], ["b"]), node("Relu", ["x"], ["c"]), node("Add", ["b", "c"], ["d"])],
              {"x": 256}, ["d"])
    p = plan(m, "naive")
    p.tensors["c"] = replace(p.tensors["c"], offset=p.tensors["b"].offset)
    with pytest.raises(PlanError, match="'b'.*'c'|'c'.*'b'"):
        p.verify()


def test_verify_catches_a_write_into_a_graph_output():
    m = model([node("Relu", ["x"], ["y"]), node("Relu", ["y"], ["z"])], {"x": 256}, ["y", "z"])
    p = plan(m)
    p.tensors["z"] = replace(p.tensors["z"], alias_of="y", offset=p.tensors["y"].offset)
    with pytest.raises(PlanError, match="graph output 'y'"):
        p.verify()


def test_verify_catches_misalignment_and_dead_reads():
    p = plan(chain())
    bad = replace(p, tensors={**p.tensors, "t1": replace(p.tensors["t1"], alias_of=None, offset=8)})
    with pytest.raises(PlanError, match="multiple of 256"):
        bad.verify()
    bad = replace(p, tensors={**p.tensors, "x": replace(p.tensors["x"], lifetime=(1, 1))})
    with pytest.raises(PlanError, match="outside its lifetime"):
        bad.verify()


def test_json_round_trip(tmp_path):
    p = plan(model([node("MatMul", ["x", "w"], ["y"])], {"x": 256}, ["y"], {"w": np.eye(256)}))
    q = planner.Plan.from_json(p.to_json(tmp_path / "plan.json"))
    assert q.tensors == p.tensors and q.steps == p.steps and q.arena_bytes == p.arena_bytes
    np.testing.assert_array_equal(q.data["w"], p.data["w"])
    q.verify()


def test_bad_arguments():
    with pytest.raises(PlanError, match="bestfit"):
        plan(chain(), "tetris")
    with pytest.raises(PlanError, match="file, memory, auto"):
        planner.compile(chain(), schedule="random")
    with pytest.raises(planner.MemplanError, match="no trainable float params"):
        planner.compile(chain(), training=True)
    with pytest.raises(planner.MemplanError, match="apply to training=True"):
        planner.compile(chain(), remat="sublinear")


@settings(derandomize=True, max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(1, 30))
def test_random_dags(data, n_nodes):
    m = random_dag(lambda lo, hi: data.draw(st.integers(lo, hi)), n_nodes)
    plans = {s: planner.compile(m, strategy=s, config=FAST) for s in STRATEGIES if s != "optimal"}
    for p in plans.values():
        assert p.arena_bytes >= p.lower_bound_bytes
    assert plans["bestfit"].arena_bytes <= plans["naive"].arena_bytes
    assert plans["inplace"].arena_bytes <= plans["naive"].arena_bytes
    off = planner.compile(m, strategy="share", schedule="file", config=Config(match_range=0, enable_inplace=False))
    assert off.arena_bytes == planner.compile(m, strategy="naive", schedule="file").arena_bytes


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", CASES)
def test_zoo_plans_verify(case, strategy):
    m = small_model(case)
    p = planner.compile(m, input_shapes(m, 2), strategy=strategy, config=FAST,
                        schedule="file" if strategy == "optimal" else "auto")
    assert p.lower_bound_bytes <= p.arena_bytes
    assert sum(p.breakdown.values()) == p.arena_bytes
    assert all(t.offset % 256 == 0 for t in p.tensors.values())


def conv_model():
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.zeros((8, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("mode", ["pool", "tensor"])
def test_workspace_modes(mode):
    columns = 4 * 3 * 3 * 3 * 16 * 16 * 4  # im2col of the whole batch: 4 images of 27 x 256 floats
    p = plan(conv_model(), config=Config(workspace_mode=mode))
    used = p.tensors[p.steps[0].workspace]
    assert used.nbytes == columns and p.breakdown["workspace"] == columns
    assert (used.kind, used.lifetime) == (("workspace_slot", None) if mode == "pool" else ("workspace", (0, 0)))
    small = plan(conv_model(), config=Config(workspace_mode=mode, workspace_limit=columns // 3))
    assert small.tensors[small.steps[0].workspace].nbytes == columns // 4, "chunks of one image"


def test_share_with_colours_verifies():
    m = small_model("resnet18")
    p = planner.compile(m, input_shapes(m, 2), strategy="share", config=Config(num_temp=2))
    assert p.stats["workspace"]["slots"] and len(p.stats["workspace"]["slots"]) <= 2


def test_inference_dropout_is_a_view():
    m = model([node("Relu", ["x"], ["a"]), node("Dropout", ["a"], ["d"]), node("Relu", ["d"], ["y"])],
              {"x": 256}, ["y"])
    p = plan(m)
    assert p.tensors["d"].alias_of == "a" and p.tensors["d"].view


def test_graph_inputs_that_are_outputs():
    assert plan(model([], {"x": 256}, ["x"])).arena_bytes == ROW
    p = plan(model([node("Relu", ["x"], ["y"])], {"x": 256}, ["x", "y"]))
    assert p.tensors["x"].lifetime == (0, 1) and p.tensors["y"].alias_of is None and p.arena_bytes == 2 * ROW
