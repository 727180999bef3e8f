"""Reverse-mode gradients built as graph nodes, planned and run by the executor, against central
finite differences in float64."""
import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from planner.autodiff import backward
from zoo_cases import run_on

RNG = np.random.default_rng(0)


def model(nodes, x_shape, params, out="y", opset=17):
    """A float64 model reading input x and the given params."""
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, name=outs[0], **attrs) for op, ins, outs, attrs in nodes], "grad",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, x_shape)],
        [helper.make_tensor_value_info(out, TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(graph, x, backend="numpy"):
    return run_on(backend, planner.compile(graph, schedule="file"), {"x": x})


def check(backend, m, x, eps=1e-6):
    """The gradients of sum(y) with respect to x and every float param, computed on `backend`, against
    central differences (on NumPy)."""
    graph = planner.load(m)
    trained, grads = backward(graph, "y", wrt=[*(t.name for t in graph.params() if t.dtype.kind == "f"), "x"])
    got = run(trained, x, backend)
    params = {i.name: numpy_helper.to_array(i).copy() for i in m.graph.initializer}
    for name in grads:  # float params still in the graph (Clip's bounds, say, became attributes)
        np.testing.assert_allclose(got[grads[name]], numeric_gradient(m, x, params, name, eps), rtol=1e-5, atol=1e-7,
                                   err_msg=name)


def numeric_gradient(m, x, params, name, eps):
    """d sum(y) / d `name` (the input x, or one of the `params` initializers) by central differences: the model,
    with `params` as its initializers and `name` made an input beside x, planned once and run for each move."""
    probe = copy.deepcopy(m)
    for init in probe.graph.initializer:
        if init.name in params:
            init.CopyFrom(numpy_helper.from_array(params[init.name], init.name))
    feeds = {"x": x}
    if name != "x":
        [init] = [i for i in probe.graph.initializer if i.name == name]
        probe.graph.initializer.remove(init)
        probe.graph.input.append(helper.make_tensor_value_info(name, init.data_type, params[name].shape))
        feeds[name] = params[name]
    ex = Executor(planner.compile(planner.load(probe), schedule="file"), backend="numpy", poison=True)
    value = feeds[name]
    numeric = np.zeros_like(value)
    for k in np.ndindex(value.shape):
        for sign in (1, -1):
            moved = value.copy()
            moved[k] += sign * eps
            numeric[k] += sign * float(ex.run({**feeds, name: moved})["y"].sum()) / (2 * eps)
    return numeric


def weighted(nodes, x_shape, params, opset=17):
    """`model` of the nodes with the last one's output times a random k of its shape as y."""
    last = nodes[-1][2][0]
    shape = planner.load(model(nodes, x_shape, params, out=last, opset=opset)).tensors[last].shape
    return model([*nodes, ("Mul", [last, "k"], ["y"], {})], x_shape, {**params, "k": p(*shape)}, opset=opset)


def p(*shape):
    return RNG.standard_normal(shape)


def test_mlp_gemm_relu_sigmoid_broadcast_mean(backend):
    m = model([("Gemm", ["x", "w1", "b1"], ["h"], {}), ("Relu", ["h"], ["r"], {}),
               ("Gemm", ["r", "w2", "b2"], ["z"], dict(transB=1, alpha=0.5, beta=2.0)),
               ("Sigmoid", ["z"], ["s"], {}), ("Mul", ["s", "scale"], ["t"], {}),
               ("ReduceMean", ["t"], ["y"], dict(axes=[1]))],
              [4, 5], dict(w1=p(5, 3), b1=p(3), w2=p(2, 3), b2=p(1, 2), scale=p(1, 2)))
    check(backend, m, p(4, 5))


def test_batched_matmul_views_transpose_and_arithmetic(backend):
    m = model([("MatMul", ["x", "w"], ["a"], {}), ("Tanh", ["a"], ["t"], {}),
               ("Transpose", ["t"], ["tt"], dict(perm=[0, 2, 1])), ("Flatten", ["tt"], ["f"], {}),
               ("Sub", ["f", "c"], ["s"], {}), ("Div", ["s", "d"], ["q"], {}), ("Exp", ["q"], ["e"], {}),
               ("Log", ["e"], ["l"], {}), ("Mul", ["l", "l"], ["y"], {})],
              [2, 3, 4], dict(w=p(4, 5), c=p(15), d=np.abs(p(1, 15)) + 1))
    check(backend, m, p(2, 3, 4))


def test_a_linear_weight_under_batched_rows_takes_gemms_over_the_rows(backend):
    """x (batch, seq, K) @ w (K, N): dW is one (K, N) Gemm over the rows, not (batch, K, N) products summed,
    and dX reads w as it is, not a transposed copy (an LM head's would be vocab x hidden)."""
    m = weighted([("MatMul", ["x", "w"], ["a"], {})], [3, 2, 4], dict(w=p(4, 5)))
    graph = planner.load(m)
    trained, grads = backward(graph, "y", wrt=["w", "x"])
    added = [n for n in trained.nodes if n not in graph.nodes]
    assert not any(n.op == "Transpose" for n in added)
    assert all(trained.tensors[o].shape != (3, 4, 5) for n in added for o in n.outputs)
    assert [n.op for n in added if grads["w"] in n.outputs] == ["Gemm"]
    check(backend, m, p(3, 2, 4))


def test_gemm_transposed_inputs_and_unary_ops(backend):
    m = model([("Gemm", ["a", "x"], ["g"], dict(transA=1, transB=1, alpha=1.5)), ("Exp", ["g"], ["e"], {}),
               ("Sqrt", ["e"], ["r"], {}), ("Reciprocal", ["r"], ["i"], {}), ("Neg", ["i"], ["n"], {}),
               ("ReduceSum", ["n"], ["y"], dict(keepdims=0))],
              [3, 4], dict(a=p(4, 2) * 0.3))
    check(backend, m, p(3, 4) * 0.3)


def test_errors():
    m = model([("Abs", ["x"], ["a"], {}), ("Mul", ["a", "w"], ["y"], {})], [2, 2], dict(w=p(2, 2)))
    backward(planner.load(m), "y")  # Abs is not on the path to w's gradient
    m = model([("Mul", ["x", "w"], ["a"], {}), ("Einsum", ["a"], ["y"], dict(equation="ii->i"))], [2, 2],
              dict(w=p(2, 2)))
    with pytest.raises(planner.ModelError, match="Einsum.*no gradient rule"):
        backward(planner.load(m), "y")
    with pytest.raises(planner.ModelError, match="does not depend"):
        backward(planner.load(m), "y", wrt=[])


def test_softmax_logsoftmax_erf_clip_where(backend):
    m = model([("MatMul", ["x", "w"], ["a"], {}), ("Softmax", ["a"], ["s"], dict(axis=1)),
               ("LogSoftmax", ["a"], ["l"], dict(axis=0)), ("Erf", ["a"], ["e"], {}),
               ("Clip", ["e", "lo", "hi"], ["c"], {}), ("Greater", ["a", "zero"], ["g"], {}),
               ("Where", ["g", "s", "l"], ["w2"], {}), ("Add", ["w2", "c"], ["t"], {}),
               ("Mul", ["t", "k"], ["y"], {})],
              [3, 4], dict(w=p(4, 5), lo=np.array(-0.5), hi=np.array(0.6), zero=np.array(0.0), k=p(3, 5)))
    check(backend, m, p(3, 4))


def test_concat_split_slice_expand(backend):
    m = model([("MatMul", ["x", "w"], ["a"], {}), ("Concat", ["a", "v"], ["c"], dict(axis=1)),
               ("Split", ["c"], ["s0", "s1"], dict(axis=1)),
               ("Slice", ["s1", "starts", "ends", "axes"], ["sl"], {}), ("Expand", ["b", "shape"], ["e"], {}),
               ("Mul", ["sl", "e"], ["m"], {}), ("Mul", ["m", "k"], ["y"], {})],
              [3, 4], dict(w=p(4, 3), v=p(3, 5), b=p(1, 2),
                           starts=np.array([1], np.int64), ends=np.array([3], np.int64), axes=np.array([1], np.int64),
                           shape=np.array([3, 2], np.int64), k=p(3, 2)))
    check(backend, m, p(3, 4))


def conv_model(**attrs):
    return model([("Conv", ["x", "w", "bias"], ["c"], attrs), ("Relu", ["c"], ["r"], {}),
                  ("GlobalAveragePool", ["r"], ["g"], {}), ("Mul", ["g", "k"], ["y"], {})],
                 [2, 3, 7, 6], dict(w=p(4, 3, 3, 2), bias=p(4), k=p(1, 4, 1, 1)))


@pytest.mark.parametrize("attrs", [{}, dict(strides=[2, 1], pads=[1, 0, 1, 1]),
                                   dict(dilations=[2, 1], pads=[0, 1, 2, 0], strides=[1, 2])])
def test_conv_and_global_average_pool(attrs, backend):
    check(backend, conv_model(**attrs), p(2, 3, 7, 6))


@pytest.mark.parametrize("a", [-1, 1])
def test_layer_normalization(a, backend):
    # stash_type double: with the default float32 statistics, finite differences would see their rounding
    m = model([("MatMul", ["x", "w"], ["h"], {}),
               ("LayerNormalization", ["h", "scale", "bias"], ["n"], dict(axis=a, epsilon=1e-3, stash_type=11)),
               ("Mul", ["n", "k"], ["y"], {})],
              [2, 3, 4], dict(w=p(4, 5), scale=p(5) if a == -1 else p(3, 5), bias=p(5), k=p(2, 3, 5)))
    check(backend, m, p(2, 3, 4))


@pytest.mark.parametrize("training", [0, 1])
def test_batch_normalization(training, backend):
    m = model([("Conv", ["x", "w"], ["c"], dict(pads=[1, 1, 1, 1])),
               ("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"],
                dict(epsilon=1e-3, training_mode=training)),
               ("Mul", ["n", "k"], ["y"], {})],
              [3, 2, 4, 4], dict(w=p(3, 2, 3, 3), scale=p(3), bias=p(3), mean=p(3), var=np.abs(p(3)) + 0.5,
                                 k=p(3, 3, 4, 4)))
    check(backend, m, p(3, 2, 4, 4))


def test_pad_and_pow(backend):
    m = model([("MatMul", ["x", "w"], ["a"], {}), ("Exp", ["a"], ["e"], {}), ("Pow", ["e", "q"], ["pw"], {}),
               ("Pad", ["pw", "pads"], ["pd"], {}), ("Mul", ["pd", "k"], ["y"], {})],
              [2, 3], dict(w=p(3, 4) * 0.3, q=p(1, 4), pads=np.array([1, 0, 0, 2], np.int64), k=p(3, 6)))
    check(backend, m, p(2, 3))


def test_pow_with_an_integer_exponent(backend):
    m = model([("Mul", ["x", "w"], ["a"], {}), ("Pow", ["a", "n"], ["c"], {}), ("Mul", ["c", "k"], ["y"], {})],
              [2, 3], dict(w=p(2, 3), n=np.array(3, np.int64), k=p(2, 3)))
    check(backend, m, p(2, 3))


@pytest.mark.parametrize("training", [0, 1])
def test_gelu_and_dropout(training, backend):
    m = model([("MatMul", ["x", "w"], ["a"], {}), ("Gelu", ["a"], ["g"], {}),
               ("Dropout", ["g", "ratio", "mode"], ["d", "mask"], dict(seed=3)), ("Mul", ["d", "k"], ["y"], {})],
              [3, 4], dict(w=p(4, 5), ratio=np.array(0.3), mode=np.array(bool(training)), k=p(3, 5)), opset=20)
    check(backend, m, p(3, 4))


def test_losses_values_and_gradients(backend):
    from planner.losses import append_loss
    m = model([("Gemm", ["x", "w", "b"], ["y"], {})], [4, 3], dict(w=p(3, 5), b=p(5)))
    x, labels, targets = p(4, 3), np.array([0, 4, 2, 2]), p(4, 5)
    logits = x @ numpy_helper.to_array(m.graph.initializer[0]) + numpy_helper.to_array(m.graph.initializer[1])
    shifted = logits - logits.max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    expected = {"cross_entropy": -log_p[np.arange(4), labels].mean(), "mse": ((logits - targets) ** 2).mean()}
    for kind, (name, value) in {"cross_entropy": ("labels", labels), "mse": ("targets", targets)}.items():
        graph, added = append_loss(planner.load(m), kind)
        assert added == name and graph.tensors["loss"].shape == ()
        trained, grads = backward(graph, "loss")
        out = run_on(backend, planner.compile(trained, schedule="file"), {"x": x, name: value})
        np.testing.assert_allclose(out["loss"], expected[kind], rtol=1e-10)
        softmax = np.exp(log_p)
        want = (softmax - np.eye(5)[labels]) / 4 if kind == "cross_entropy" else 2 * (logits - targets) / 20
        np.testing.assert_allclose(out[grads["b"]], want.sum(0), rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(out[grads["w"]], x.T @ want, rtol=1e-8, atol=1e-12)
    with pytest.raises(planner.ModelError, match="unknown loss"):
        append_loss(planner.load(m), "hinge")


def test_gather_rows_accumulate(backend):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="e"),
         helper.make_node("Mul", ["e", "k"], ["y"], name="y")], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(p(5, 4), "table"), numpy_helper.from_array(p(2, 3, 4), "k")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ids = np.array([[0, 3, 3], [-1, 0, 2]])
    trained, grads = backward(planner.load(m), "y")
    out = run_on(backend, planner.compile(trained, schedule="file"), {"ids": ids})
    want = np.zeros((5, 4))
    np.add.at(want, ids % 5, numpy_helper.to_array(graph.initializer[1]))
    np.testing.assert_allclose(out[grads["table"]], want, rtol=1e-12)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[2, 3], dilations=[2, 1]),  # overlapping windows
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[0, 1, 1, 0], indices=True),
    dict(kernel_shape=[2, 2], strides=[2, 2], storage_order=1, indices=True),
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")])
def test_max_pool(attrs, backend):
    outs = ["m", "i"] if attrs.pop("indices", False) else ["m"]
    check(backend, weighted([("MaxPool", ["x"], outs, attrs)], [2, 2, 5, 6], {}), p(2, 2, 5, 6))


def test_max_pool_1d_and_ties(backend):
    check(backend, weighted([("MaxPool", ["x"], ["m"], dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1))],
                   [2, 3, 8], {}), p(2, 3, 8))
    # ties go to the first maximum in window order, as in PyTorch
    import torch
    m = weighted([("MaxPool", ["x"], ["m"], dict(kernel_shape=[2, 2], strides=[1, 1]))], [1, 1, 3, 4], {})
    x = RNG.integers(0, 2, (1, 1, 3, 4)).astype(np.float64)
    trained, grads = backward(planner.load(m), "y", wrt=["x"])
    t, k = torch.tensor(x, requires_grad=True), torch.tensor(numpy_helper.to_array(m.graph.initializer[0]))
    (torch.nn.functional.max_pool2d(t, 2, 1) * k).sum().backward()
    np.testing.assert_allclose(run(trained, x)[grads["x"]], t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
    dict(kernel_shape=[2, 3], dilations=[2, 1], strides=[1, 2]),
    dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER")])
def test_average_pool(attrs, backend):
    check(backend, weighted([("AveragePool", ["x"], ["a"], attrs)], [2, 2, 6, 5], {}, opset=19), p(2, 2, 6, 5))


def test_average_pool_1d(backend):
    check(backend, weighted([("AveragePool", ["x"], ["a"], dict(kernel_shape=[3], strides=[2], ceil_mode=1))], [1, 2, 8], {}),
          p(1, 2, 8))


@pytest.mark.parametrize("attrs", [
    dict(group=2), dict(group=4, strides=[2, 1], pads=[1, 1, 0, 1]), dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER", dilations=[1, 2]), dict(auto_pad="VALID", strides=[1, 2])])
def test_conv_groups_and_auto_pad(attrs, backend):
    w = p(4, 4 // attrs.get("group", 1), 3, 2)
    check(backend, weighted([("Conv", ["x", "w", "bias"], ["c"], attrs)], [2, 4, 5, 5], dict(w=w, bias=p(4))), p(2, 4, 5, 5))


@pytest.mark.parametrize("attrs", [
    {}, dict(strides=[2, 1], pads=[1, 0, 0, 1], output_padding=[1, 0]),
    dict(group=2, strides=[2, 2], dilations=[1, 2], output_padding=[1, 1]),
    dict(strides=[2, 2], dilations=[3, 1], output_padding=[2, 0]),  # output_padding past the stride
    dict(strides=[2, 2], auto_pad="SAME_UPPER"), dict(strides=[2, 1], output_shape=[6, 5], group=4)])
def test_conv_transpose(attrs, backend):
    per_group = {2: 2, 4: 1}.get(attrs.get("group"), 3)
    w, bias = p(4, per_group, 3, 2), p(per_group * attrs.get("group", 1))
    check(backend, weighted([("ConvTranspose", ["x", "w", "bias"], ["c"], attrs)], [2, 4, 3, 4], dict(w=w, bias=bias)),
          p(2, 4, 3, 4))


def test_conv_1d_and_3d(backend):
    check(backend, weighted([("Conv", ["x", "w"], ["c"], dict(strides=[2], pads=[1, 2], group=2))], [2, 4, 7],
                   dict(w=p(2, 2, 3))), p(2, 4, 7))
    check(backend, weighted([("ConvTranspose", ["x", "w"], ["c"], dict(strides=[2, 1, 2]))], [1, 2, 2, 3, 2],
                   dict(w=p(2, 1, 2, 2, 2))), p(1, 2, 2, 3, 2))


@pytest.mark.parametrize("a, ids", [(1, [[0, -1, 2], [2, 2, 1]]), (-1, 3), (2, [-4, 0, 0]), (0, [[[1]], [[-2]]])])
def test_gather_any_axis(a, ids, backend):
    check(backend, weighted([("Gather", ["x", "ids"], ["g"], dict(axis=a))], [2, 3, 4], dict(ids=np.array(ids))), p(2, 3, 4))


@pytest.mark.parametrize("a", [0, 1, -1])
def test_gather_elements(a, backend):
    ids = RNG.integers(-3, 3, (3, 2, 3))
    check(backend, weighted([("GatherElements", ["x", "ids"], ["g"], dict(axis=a))], [3, 3, 3], dict(ids=ids)), p(3, 3, 3))


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd(reduction, backend):
    ids = np.array([[0, 1], [-1, 0], [1, 2]] if reduction == "none" else [[0, 1], [-2, 1], [1, 2]])
    check(backend, weighted([("ScatterND", ["x", "ids", "u"], ["s"], dict(reduction=reduction))], [2, 3, 4],
                   dict(ids=ids, u=p(3, 4))), p(2, 3, 4))


@pytest.mark.parametrize("attrs", [
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor", scales=[1, 1, 2, 1.5]),
    dict(mode="nearest", sizes=[1, 2, 3, 7]),
    dict(mode="linear", coordinate_transformation_mode="align_corners", sizes=[1, 2, 7, 9]),  # as zoo's unet
    dict(mode="linear", scales=[1, 1, 0.5, 0.6]),
    dict(mode="cubic", coordinate_transformation_mode="pytorch_half_pixel", scales=[1, 1, 1.5, 1]),
    dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", sizes=[1, 2, 5, 3],
         roi=[0, 0, 0.2, -0.3, 1, 1, 0.9, 1.2], extrapolation_value=1.5)])
def test_resize(attrs, backend):
    inputs = {k: np.array(attrs.pop(k), np.float32 if k != "sizes" else np.int64)
              for k in ("roi", "scales", "sizes") if k in attrs}
    names = ["x", *(k if k in inputs else "" for k in ("roi", "scales", "sizes"))]
    while not names[-1]:
        names.pop()
    check(backend, weighted([("Resize", names, ["r"], attrs)], [1, 2, 4, 6], inputs), p(1, 2, 4, 6))


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_modes(mode, backend):
    check(backend, weighted([("Pad", ["x", "pads"], ["d"], dict(mode=mode))], [2, 3, 4],
                   dict(pads=np.array([0, 2, -1, 1, 1, 3]))), p(2, 3, 4))


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ([4, 0], [0, 9], [1, 2], [-1, 2]), ([-1, 1], [-10, 3], [2, 0], [-3, 1]), ([1], [9], [1], [3])])
def test_slice_steps(starts, ends, axes, steps, backend):
    check(backend, weighted([("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"], {})], [3, 5, 7],
                   {k: np.array(v) for k, v in dict(starts=starts, ends=ends, axes=axes, steps=steps).items()}),
          p(3, 5, 7))


@pytest.mark.parametrize("equation, shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]), ("ij,jk", [(3, 4), (4, 2)]), ("ij,kj->i", [(3, 4), (2, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (1, 4, 2)]), ("i...j,jk->k...i", [(3, 2, 4), (4, 2)]), ("ij->ji", [(3, 4)])])
def test_einsum(equation, shapes, backend):
    check(backend, weighted([("Einsum", ["x", *(f"w{k}" for k in range(1, len(shapes)))], ["e"], dict(equation=equation))],
                   list(shapes[0]), {f"w{k}": p(*s) for k, s in enumerate(shapes[1:], 1)}), p(*shapes[0]))


def test_matmul_vectors(backend):
    check(backend, weighted([("MatMul", ["x", "w"], ["a"], {}), ("MatMul", ["a", "v"], ["b"], {}),
                    ("MatMul", ["u", "t"], ["c"], {}), ("Mul", ["b", "c"], ["d"], {})],
                   [4], dict(w=p(2, 4, 3), v=p(3), u=p(2), t=p(2, 2, 2))), p(4))


def test_elementwise_and_activations(backend):
    m = weighted([("Abs", ["x"], ["a"], {}), ("Mod", ["x", "w"], ["m"], dict(fmod=1)), ("Mod", ["a", "w"], ["n"], {}),
                  ("LeakyRelu", ["x"], ["l"], dict(alpha=0.2)), ("HardSigmoid", ["m"], ["h"], dict(alpha=0.7)),
                  ("HardSwish", ["x"], ["s"], {}), ("Gelu", ["x"], ["g"], dict(approximate="tanh")),
                  ("Add", ["a", "l"], ["al"], {}), ("Add", ["h", "s"], ["hs"], {}), ("Add", ["n", "hs"], ["t"], {}),
                  ("Add", ["al", "t"], ["u"], {}), ("Mul", ["u", "g"], ["e"], {})],
                 [3, 5], dict(w=np.abs(p(1, 5)) + 0.5), opset=28)  # Mod on floats without fmod: opset 28
    check(backend, m, p(3, 5) * 3)


def test_reductions_tile_trilu_views(backend):
    m = weighted([("ReduceMax", ["x"], ["r"], dict(axes=[1], keepdims=0)), ("Tile", ["r", "reps"], ["t"], {}),
                  ("GlobalMaxPool", ["x"], ["g"], {}), ("Squeeze", ["g", "ax"], ["q"], {}),
                  ("Trilu", ["x"], ["u"], dict(upper=0)), ("Flatten", ["u"], ["f"], {}),
                  ("Concat", ["t", "q", "f"], ["c"], dict(axis=1)), ("Unsqueeze", ["c", "ax"], ["z"], {})],
                 [2, 3, 4], dict(reps=np.array([1, 2]), ax=np.array([2])))
    check(backend, m, p(2, 3, 4))


def test_cast_between_floats():
    m = model([("Cast", ["x"], ["c"], dict(to=TensorProto.FLOAT)), ("Cast", ["c"], ["d"], dict(to=TensorProto.DOUBLE)),
               ("Mul", ["d", "k"], ["y"], {})], [2, 3], dict(k=p(2, 3)))
    trained, grads = backward(planner.load(m), "y", wrt=["x"])
    want = numpy_helper.to_array(m.graph.initializer[0]).astype(np.float32)
    np.testing.assert_array_equal(run(trained, p(2, 3))[grads["x"]], want)
