"""LinearAttention and CausalConvWithState (planner/ops/linear_attention.py): their gradients against
finite differences (in float32, the widest type they take), forms beyond the ONNX node cases against
onnx's reference, a prefill continued from its state, and the refusals."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import planner
from executor import Executor
from planner.autodiff import backward
from zoo_cases import run_on

RNG = np.random.default_rng(15)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def one_node(op, inputs, outputs, **attrs):
    """A model of one `op` node (opset 27) reading `inputs` (name -> array, None for an omitted one)."""
    node = helper.make_node(op, [k if v is not None else "" for k, v in inputs.items()], outputs, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for k, v in inputs.items() if v is not None],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])


def run(m, feeds, backend="numpy"):
    feeds = {k: v for k, v in feeds.items() if v is not None}
    plan = planner.compile(m, {k: v.shape for k, v in feeds.items()}, schedule="file")
    return run_on(backend, plan, feeds)


def matches_reference(m, feeds, rtol=1e-5, atol=1e-6, backend="numpy"):
    want = ReferenceEvaluator(m).run(None, {k: v for k, v in feeds.items() if v is not None})
    got = run(m, feeds, backend)
    for out, value in zip(m.graph.output, want):
        assert got[out.name].shape == value.shape and got[out.name].dtype == value.dtype, out.name
        np.testing.assert_allclose(got[out.name], value, rtol=rtol, atol=atol, err_msg=out.name)


def check_gradients(op, inputs, outputs, eps=1e-2, tol=2e-3, **attrs):
    """The gradients of sum_k(w_k * output_k), w_k random, with respect to every input against central
    differences; float32 throughout, so with a wide step and tolerance."""
    m = one_node(op, inputs, outputs, **attrs)
    shapes = planner.load(m).tensors
    weights = {f"w_{o}": rand(*shapes[o].shape) for o in outputs}
    nodes = [m.graph.node[0]]
    for o in outputs:
        nodes += [helper.make_node("Mul", [o, f"w_{o}"], [f"m_{o}"]),
                  helper.make_node("ReduceSum", [f"m_{o}"], [f"s_{o}"], keepdims=0)]
    nodes.append(helper.make_node("Sum", [f"s_{o}" for o in outputs], ["loss"]))
    feeds = {k: v for k, v in inputs.items() if v is not None}
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                          for k, v in {**feeds, **weights}.items()],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    trained, grads = backward(planner.load(m), "loss", wrt=list(feeds))
    got = run(trained, {**feeds, **weights})
    plan = planner.compile(m, schedule="file")

    def loss(moved):
        return float(Executor(plan, backend="numpy").run({**moved, **weights})["loss"])

    for name, value in feeds.items():
        numeric = np.zeros(value.shape)
        for k in np.ndindex(value.shape):
            for sign in (1, -1):
                moved = value.copy()
                moved[k] += sign * eps
                numeric[k] += sign * loss({**feeds, name: moved}) / (2 * eps)
        np.testing.assert_allclose(got[grads[name]], numeric, rtol=tol, atol=tol, err_msg=name)


def attention_inputs(rule, b=1, t=3, hq=2, hk=1, dk=2, dv=3, past=False, per_head=False, beta_heads=None):
    """LinearAttention's inputs for `rule`: decay (log, negative) per head or per key dim, beta in (0, 1)."""
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    return dict(query=rand(b, t, hq * dk), key=rand(b, t, hk * dk) / 2, value=rand(b, t, hk * dv),
                past_state=rand(b, hk, dk, dv) if past else None,
                decay=-np.abs(rand(b, t, hk if per_head else hk * dk)) if gated else None,
                beta=1 / (1 + np.exp(-rand(b, t, beta_heads or hk))) if delta else None)


@pytest.mark.parametrize("rule, shape, attrs", [
    ("linear", {}, {}),
    ("gated", dict(past=True), {}),
    ("gated", dict(per_head=True, hq=2, hk=2), dict(scale=0.5)),
    ("delta", dict(beta_heads=1, b=2), {}),
    ("gated_delta", dict(past=True, per_head=True), {}),
    ("gated_delta", dict(past=True, hq=4, hk=2, t=2), {}),
])
def test_linear_attention_gradients_match_finite_differences(rule, shape, attrs):
    inputs = attention_inputs(rule, **shape)
    heads = dict(q_num_heads=inputs["query"].shape[2] // 2, kv_num_heads=inputs["key"].shape[2] // 2)
    check_gradients("LinearAttention", inputs, ["y", "state"], update_rule=rule, **heads, **attrs)


@pytest.mark.parametrize("activation, bias, past, size", [("none", False, False, 3), ("silu", True, True, 3),
                                                          ("swish", True, False, 1), ("none", False, True, 4)])
def test_causal_conv_gradients_match_finite_differences(activation, bias, past, size):
    inputs = dict(input=rand(2, 3, 2), weight=rand(3, 1, size), bias=rand(3) if bias else None,
                  past_state=rand(2, 3, size - 1) if past else None)
    check_gradients("CausalConvWithState", inputs, ["y", "state"], activation=activation)


@pytest.mark.parametrize("rule, shape", [("gated", dict(per_head=True, hq=6, hk=2, t=5, past=True)),
                                         ("delta", dict(hq=3, hk=3, dk=4, dv=1, b=3)),
                                         ("gated_delta", dict(hq=2, hk=2, beta_heads=1, t=1))])
def test_linear_attention_forms_match_the_reference(rule, shape, backend):
    inputs = attention_inputs(rule, **shape)
    m = one_node("LinearAttention", inputs, ["y", "state"], update_rule=rule, q_num_heads=shape["hq"],
                 kv_num_heads=shape["hk"])
    matches_reference(m, inputs, backend=backend)


@pytest.mark.parametrize("activations, state", [(np.float16, np.float32), (np.float32, np.float16)])
def test_the_state_may_have_another_float_type(activations, state, backend):
    """present_state keeps past_state's dtype, the output the query's."""
    inputs = attention_inputs("gated_delta", hq=2, hk=2, past=True)
    inputs = {k: v.astype(state if k == "past_state" else activations) for k, v in inputs.items()}
    m = one_node("LinearAttention", inputs, ["y", "state"], q_num_heads=2, kv_num_heads=2)
    got = run(m, inputs, backend)
    assert got["y"].dtype == activations and got["state"].dtype == state
    matches_reference(m, inputs, rtol=2e-3, atol=2e-3, backend=backend)


def test_a_prefill_continued_from_its_state_is_one_prefill(backend):
    """Two calls, the second reading the first's present_state, give what one call over both gives."""
    inputs = attention_inputs("gated_delta", t=4, hq=2, hk=2)

    def call(feeds):
        return run(one_node("LinearAttention", feeds, ["y", "state"], q_num_heads=2, kv_num_heads=2), feeds, backend)

    whole = call(inputs)
    halves = [{k: None if v is None else v[:, s] for k, v in inputs.items()} for s in (slice(0, 2), slice(2, 4))]
    first = call(halves[0])
    second = call({**halves[1], "past_state": first["state"]})
    np.testing.assert_allclose(np.concatenate([first["y"], second["y"]], axis=1), whole["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second["state"], whole["state"], rtol=1e-5, atol=1e-6)


def test_causal_conv_present_state_outlives_a_short_input(backend):
    """With fewer steps than k - 1, present_state still holds k - 1 positions: past_state's tail first."""
    inputs = dict(input=rand(1, 2, 1), weight=rand(2, 1, 4), past_state=rand(1, 2, 3))
    m = one_node("CausalConvWithState", dict(input=inputs["input"], weight=inputs["weight"], bias=None,
                                             past_state=inputs["past_state"]), ["y", "state"])
    got = run(m, inputs, backend)
    np.testing.assert_array_equal(got["state"], np.concatenate([inputs["past_state"][:, :, 1:], inputs["input"]], 2))
    matches_reference(m, inputs, backend=backend)


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("LinearAttention", attention_inputs("linear"), dict(q_num_heads=2, kv_num_heads=1, update_rule="fast"),
     "update_rule must be one of"),
    ("LinearAttention", attention_inputs("linear"), dict(q_num_heads=2, kv_num_heads=1, update_rule="gated"),
     "update_rule 'gated' needs decay"),
    ("LinearAttention", attention_inputs("delta"), dict(q_num_heads=2, kv_num_heads=1, update_rule="linear"),
     "update_rule 'linear' takes no beta"),
    ("LinearAttention", attention_inputs("linear"), dict(q_num_heads=3, kv_num_heads=2, update_rule="linear"),
     r"q_num_heads \(3\) must be a positive multiple of kv_num_heads \(2\)"),
    ("LinearAttention", attention_inputs("linear", hk=2), dict(q_num_heads=2, kv_num_heads=1, update_rule="linear"),
     "key's last dim must be 1 heads of the query's head size 2, got 4"),
    ("LinearAttention", {**attention_inputs("linear"), "past_state": rand(1, 1, 3, 2)},
     dict(q_num_heads=2, kv_num_heads=1, update_rule="linear"), r"past_state must be .* = \(1, 1, 2, 3\)"),
    ("LinearAttention", {**attention_inputs("gated_delta"), "decay": rand(1, 3, 3)},
     dict(q_num_heads=2, kv_num_heads=1), "decay must be"),
    ("CausalConvWithState", dict(input=rand(2, 3, 4), weight=rand(3, 2, 2)), {}, r"weight \(C, 1, k\)"),
    ("CausalConvWithState", dict(input=rand(2, 3, 4), weight=rand(3, 1, 2), bias=rand(2)), {}, "bias must be"),
    ("CausalConvWithState", dict(input=rand(2, 3, 4), weight=rand(3, 1, 2), bias=None, past_state=rand(2, 3, 2)), {},
     r"past_state must be \(B, C, k - 1\) = \(2, 3, 1\)"),
    ("CausalConvWithState", dict(input=rand(2, 3, 4), weight=rand(3, 1, 2)), dict(activation="relu"),
     "activation must be"),
])
def test_refusals(op, inputs, attrs, message):
    with pytest.raises(planner.ShapeError, match=message):
        planner.load(one_node(op, inputs, ["y", "state"], **attrs))
