"""LSTM, GRU and RNN: gradients through their unrolled parts against finite differences, runs against
PyTorch's nn.LSTM and nn.GRU (packed sequences for sequence_lens), the kernel against the PyTorch form
for every activation, clip and layout, kernels that allocate nothing, and the errors."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor, RunError
from test_autodiff import check, p, weighted
from test_no_hidden_allocations import allocations, assert_bounded
from zoo_cases import run_on

T, B, I, H = 3, 2, 2, 2


def recurrent_model(op, inputs, outputs, feeds, params, opset=22, **attrs):
    """A float32 model of one `op` node; `feeds` ({name: array}) are graph inputs, `params` initializers."""
    node = helper.make_node(op, inputs, outputs, **attrs)
    fed = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    graph = helper.make_graph([node], op, fed, [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                               for o in outputs if o],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(backend, model, feeds):
    plan = planner.compile(model, {k: v.shape for k, v in feeds.items()})
    return run_on(backend, plan, feeds)


def weights(op, hidden=H, inputs=I, directions=1, seed=0):
    """W, R, B (and LSTM's P) of float32 values."""
    rng, gates = np.random.default_rng(seed), {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    out = {"W": rng.uniform(-1, 1, (directions, gates * hidden, inputs)),
           "R": rng.uniform(-1, 1, (directions, gates * hidden, hidden)),
           "B": rng.uniform(-1, 1, (directions, 2 * gates * hidden))}
    if op == "LSTM":
        out["P"] = rng.uniform(-1, 1, (directions, 3 * hidden))
    return {k: v.astype(np.float32) for k, v in out.items()}


def unsqueezed(nodes):
    """Y with Y_h (and Y_c) concatenated after it, so that one output weighs all three."""
    return [*nodes, ("Unsqueeze", ["Y_h", "zero"], ["uh"], {}), ("Unsqueeze", ["Y_c", "zero"], ["uc"], {}),
            ("Concat", ["Y", "uh", "uc"], ["a"], dict(axis=0))]


def test_lstm_gradient_matches_finite_differences(backend):
    """Bidirectional, with biases, initial states and peepholes: x, every weight and both states."""
    w = {k: v.astype(np.float64) for k, v in weights("LSTM", directions=2).items()}
    params = {**w, "h0": p(2, B, H), "c0": p(2, B, H), "zero": np.array([0], np.int64)}
    nodes = [("LSTM", ["x", "W", "R", "B", "", "h0", "c0", "P"], ["Y", "Y_h", "Y_c"],
              dict(hidden_size=H, direction="bidirectional"))]
    check(backend, weighted(unsqueezed(nodes), [T, B, I], params), p(T, B, I))


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_gru_gradient_matches_finite_differences(linear_before_reset, backend):
    """Reverse in time, batch first (layout 1), with biases and an initial state."""
    params = {**{k: v.astype(np.float64) for k, v in weights("GRU").items()}, "h0": p(B, 1, H)}
    nodes = [("GRU", ["x", "W", "R", "B", "", "h0"], ["Y"],
              dict(hidden_size=H, direction="reverse", layout=1, linear_before_reset=linear_before_reset))]
    check(backend, weighted(nodes, [B, T, I], params), p(B, T, I))


def test_rnn_gradient_through_clip_and_an_activation_with_parameters(backend):
    params = {k: v.astype(np.float64) * 0.3 for k, v in weights("RNN").items()}
    nodes = [("RNN", ["x", "W", "R", "B"], ["Y", "Y_h"], dict(hidden_size=H, clip=50.0, activations=["Affine"],
                                                               activation_alpha=[0.7], activation_beta=[0.1])),
             ("Identity", ["Y_h"], ["a"], {})]
    check(backend, weighted(nodes, [T, B, I], params), p(T, B, I))


def test_no_gradient_with_sequence_lens(backend):
    params = {**{k: v.astype(np.float64) for k, v in weights("RNN").items()}, "lens": np.array([3, 2], np.int32)}
    m = weighted([("RNN", ["x", "W", "R", "B", "lens"], ["Y"], dict(hidden_size=H))], [T, B, I], params)
    with pytest.raises(planner.ModelError, match="no gradient with sequence_lens"):
        check(backend, m, p(T, B, I))


def test_training_steps_through_an_lstm():
    """planner.compile(training=True) unrolls the LSTM for its gradients; its weights train."""
    feeds = {"x": np.random.default_rng(0).standard_normal((T, 4, I)).astype(np.float32)}
    w = {k: v for k, v in weights("LSTM").items() if k != "P"}
    plan = planner.compile(recurrent_model("LSTM", ["x", "W", "R", "B"], ["", "Y_h"], feeds, w, hidden_size=H),
                           {"x": feeds["x"].shape}, training=True)
    assert plan.training["params"] == ["W", "R", "B"] and "LSTM" not in {s.op for s in plan.steps}
    labels = plan.tensors[plan.training["labels"]]
    ex = Executor(plan, backend="numpy")
    losses = [float(ex.train_step({**feeds, labels.name: np.zeros(labels.shape, labels.dtype)})) for _ in range(3)]
    assert losses[0] > losses[1] > losses[2]


def torch_reference(op, w, x, lengths=None, bidirectional=False):
    """PyTorch's nn.LSTM or nn.GRU with the ONNX weights `w` copied in (gates reordered), run on x
    (T, B, I), packed by `lengths` if given: (Y as (T, D, B, H), Y_h)."""
    torch = pytest.importorskip("torch")
    d, hidden = (2 if bidirectional else 1), w["R"].shape[-1]
    net = getattr(torch.nn, op)(x.shape[-1], hidden, bidirectional=bidirectional)
    order = [0, 2, 3, 1] if op == "LSTM" else [1, 0, 2]  # PyTorch's i, f, g, o and r, z, n from ONNX's
    with torch.no_grad():
        for k in range(d):
            suffix = "_reverse" if k else ""
            blocks = {name: np.split(w[key][k], len(order)) for name, key in (("ih", "W"), ("hh", "R"))}
            for name in ("ih", "hh"):
                getattr(net, f"weight_{name}_l0{suffix}").copy_(torch.tensor(np.concatenate(
                    [blocks[name][j] for j in order])))
            for j, name in enumerate(("ih", "hh")):
                bias = np.split(np.split(w["B"][k], 2)[j], len(order))
                getattr(net, f"bias_{name}_l0{suffix}").copy_(torch.tensor(np.concatenate([bias[i] for i in order])))
        data = torch.tensor(x)
        if lengths is not None:
            data = torch.nn.utils.rnn.pack_padded_sequence(data, torch.tensor(lengths), enforce_sorted=False)
        y, state = net(data)
        if lengths is not None:
            y = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=x.shape[0])[0]
    y_h = state[0] if op == "LSTM" else state
    return y.numpy().reshape(x.shape[0], x.shape[1], d, hidden).transpose(0, 2, 1, 3), y_h.numpy()


@pytest.mark.torch
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("lengths", [None, [5, 2, 0, 4]])
def test_like_pytorch(op, bidirectional, lengths, backend):
    """Y and Y_h as nn.LSTM's and nn.GRU's (a GRU of PyTorch resets after the recurrent product);
    sequence_lens as packed sequences: zeros after a sequence's end, Y_h its last step's."""
    d = 2 if bidirectional else 1
    w = {k: v for k, v in weights(op, hidden=3, inputs=4, directions=d).items() if k != "P"}
    x = np.random.default_rng(1).standard_normal((5, 4, 4)).astype(np.float32)
    if lengths is not None and 0 in lengths:
        lengths = [n for n in lengths if n]  # PyTorch packs no empty sequence
        x = x[:, :len(lengths)]
    feeds = {"x": x, **({} if lengths is None else {"lens": np.array(lengths, np.int32)})}
    attrs = dict(hidden_size=3, direction="bidirectional" if bidirectional else "forward")
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    inputs = ["x", "W", "R", "B", "" if lengths is None else "lens"]
    got = run(backend, recurrent_model(op, inputs, ["Y", "Y_h"], feeds, w, **attrs), feeds)
    y, y_h = torch_reference(op, w, x, lengths, bidirectional)
    np.testing.assert_allclose(got["Y"], y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["Y_h"], y_h, rtol=1e-5, atol=1e-6)


CUSTOM = {  # op: attributes exercising the activations, their parameters, clip and the op's own flags
    "LSTM": [dict(activations=["HardSigmoid", "Elu", "ScaledTanh"] * 2, activation_alpha=[0.3, 0.8, 1.5, 0.2, 0.9],
                  activation_beta=[0.4, 0.7, 0.6, 0.5], clip=0.9, direction="bidirectional"),
             dict(activations=["Sigmoid", "Softsign", "Softplus"], input_forget=1, layout=1)],
    "GRU": [dict(activations=["LeakyRelu", "ThresholdedRelu"], activation_alpha=[0.2, 0.1], clip=1.2),
            dict(activations=["Sigmoid", "Relu", "HardSigmoid", "Affine"], activation_alpha=[0.3, 0.5],
                 activation_beta=[0.4, 0.1], direction="bidirectional", layout=1)],
    "RNN": [dict(activations=["Softplus"], direction="reverse"), dict(activations=["Relu", "Elu"], clip=0.5,
                                                                        direction="bidirectional", layout=1)],
}


@pytest.mark.torch
@pytest.mark.parametrize("op, attrs", [(op, a) for op, cases in CUSTOM.items() for a in cases])
@pytest.mark.parametrize("lengths", [None, [4, 1, 0]])
def test_kernel_like_its_pytorch_form(op, attrs, lengths, backend):
    """The kernel (in place) and the PyTorch form (functions of torch) of every activation, with
    initial states, peepholes, sequence_lens and both layouts, give the same Y, Y_h and Y_c."""
    pytest.importorskip("torch")
    from executor.torch_module import to_torch
    d, layout = (2 if attrs.get("direction") == "bidirectional" else 1), attrs.get("layout", 0)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5) if layout else (4, 3, 5)).astype(np.float32)
    state = (3, d, 6) if layout else (d, 3, 6)
    feeds = {"x": x, "h0": rng.standard_normal(state).astype(np.float32)}
    if lengths is not None:
        feeds["lens"] = np.array(lengths, np.int32)
    inputs = ["x", "W", "R", "B", "lens" if lengths else "", "h0"]
    outputs = ["Y", "Y_h"]
    if op == "LSTM":
        feeds["c0"] = rng.standard_normal(state).astype(np.float32)
        inputs, outputs = [*inputs, "c0", "P"], [*outputs, "Y_c"]
    model = recurrent_model(op, inputs, outputs, feeds, weights(op, hidden=6, inputs=5, directions=d), hidden_size=6,
                            **attrs)
    got = run(backend, model, feeds)
    want = to_torch(model, {k: v.shape for k, v in feeds.items()})(**feeds)
    for name in outputs:
        np.testing.assert_allclose(got[name], want[name].detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("lengths", [False, True])
def test_kernels_allocate_nothing(op, lengths):
    """At sizes where any temporary of a step's gates would show (64 KiB)."""
    batch, hidden = 64, 128
    w = weights(op, hidden=hidden, inputs=32, directions=2)
    feeds = {"x": np.ones((4, batch, 32), np.float32)}
    if lengths:
        feeds["lens"] = np.arange(batch, dtype=np.int32) % 5
    inputs = ["x", "W", "R", "B", "lens" if lengths else ""]
    outputs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    plan = planner.compile(recurrent_model(op, inputs + (["", "", "P"] if op == "LSTM" else []), outputs, feeds, w,
                                           hidden_size=hidden, direction="bidirectional"),
                           {k: v.shape for k, v in feeds.items()})
    ex = Executor(plan, backend="numpy")
    assert_bounded(allocations(ex, lambda: ex.run(feeds)))


def test_flops_count_the_matmuls():
    feeds = {"x": np.ones((T, B, I), np.float32)}
    plan = planner.compile(recurrent_model("GRU", ["x", "W", "R"], ["Y"], feeds, weights("GRU"), hidden_size=H))
    step = next(s for s in plan.steps if s.op == "GRU")
    assert planner.ops.node_flops(plan, step) == T * B * (2 * 3 * H * (I + H) + 3 * 3 * H + 3 * H)


@pytest.mark.parametrize("attrs, message", [
    (dict(direction="sideways"), "direction must be one of forward, reverse, bidirectional"),
    (dict(activations=["Tanh", "Tanh"]), "forward RNN takes 1 activations"),
    (dict(activations=["Swish"]), "activation 'Swish' is not one of"),
    (dict(clip=-1.0), "clip must be positive"),
    (dict(hidden_size=3), r"W must have shape \(1, 3, 2\)"),
])
def test_bad_attributes_are_named(attrs, message):
    feeds = {"x": np.ones((T, B, I), np.float32)}
    model = recurrent_model("RNN", ["x", "W", "R"], ["Y"], feeds, weights("RNN"), opset=14, **attrs)
    with pytest.raises(planner.ShapeError, match=message):
        planner.compile(model)


def test_sequence_lens_past_the_sequence_is_a_run_error(backend):
    feeds = {"x": np.ones((T, B, I), np.float32), "lens": np.array([1, T + 1], np.int32)}
    model = recurrent_model("RNN", ["x", "W", "R", "", "lens"], ["Y"], feeds, weights("RNN"), hidden_size=H)
    with pytest.raises(RunError, match=r"sequence_lens \[1, 4\] must lie in \[0, 3\]"):
        run(backend, model, feeds)
