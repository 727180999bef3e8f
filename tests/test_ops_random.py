"""The random ops (planner/ops/random.py) planned and run: shapes, dtypes, ranges and moments of large
draws, Bernoulli's certain cases, Multinomial's frequencies, seeded runs repeating and unseeded ones
not, never folded nor recomputed, gradients through seeded draws, their kernels' allocations, errors,
and their PyTorch forms. ONNX's node cases of Bernoulli ship values of NumPy's generator, so there they
are compared by shape and dtype only (tests/node_cases.py RANDOM)."""
import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import planner
from executor import Executor
from planner import ops
from planner.errors import ShapeError
from planner.remat.mirror import need_mirror
from test_autodiff import check, p, weighted
from test_no_hidden_allocations import allocations, assert_bounded

SHAPE = (400, 500)  # 200,000 draws: a mean's standard error is 0.2% of the spread


def model(op, attrs, inputs=(), opset=22):
    """One `op` node writing y, reading the given {name: array} as graph inputs."""
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    fed = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in inputs.items()]
    graph = helper.make_graph([node], op, fed, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def runs(op, attrs, inputs=None, times=1, backend="numpy"):
    """y of `times` runs of one plan of the node, as host arrays."""
    inputs = inputs or {}
    ex = Executor(planner.compile(model(op, attrs, inputs)), backend=backend, poison=True)
    got = [ex.run(inputs)["y"] for _ in range(times)]
    return [y if isinstance(y, np.ndarray) else y.get() for y in got]


def draw(op, attrs, inputs=None):
    return runs(op, attrs, inputs)[0]


ONNX = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
        ml_dtypes.bfloat16: TensorProto.BFLOAT16}


@pytest.mark.parametrize("dtype", list(ONNX))
def test_normal_moments(dtype):
    y = draw("RandomNormal", dict(shape=list(SHAPE), mean=1.5, scale=2.0, dtype=ONNX[dtype]))
    assert y.shape == SHAPE and y.dtype == np.dtype(dtype)
    y = y.astype(np.float64)
    assert abs(y.mean() - 1.5) < 0.03 and abs(y.std() - 2.0) < 0.03
    assert abs((((y - 1.5) / 2) ** 4).mean() - 3) < 0.1  # a normal's kurtosis


@pytest.mark.parametrize("dtype", list(ONNX))
def test_uniform_range_and_moments(dtype):
    y = draw("RandomUniform", dict(shape=list(SHAPE), low=-2.0, high=3.0, dtype=ONNX[dtype]))
    assert y.shape == SHAPE and y.dtype == np.dtype(dtype)
    y = y.astype(np.float64)
    assert y.min() >= -2 and y.max() < 3
    assert abs(y.mean() - 0.5) < 0.03 and abs(y.std() - 5 / np.sqrt(12)) < 0.03


def test_uniform_never_reaches_high_in_narrow_floats():
    """Some float32 draws in [0, 1) round to 1 in float16 (about 1 in 4000): they stay below it."""
    y = draw("RandomUniform", dict(shape=[1000, 1000], dtype=TensorProto.FLOAT16))
    assert y.max() == np.nextafter(np.float16(1), np.float16(0))


def test_like_forms_take_the_input_shape_and_its_dtype_or_their_own():
    x = np.zeros((30, 40, 50), np.float16)
    y = draw("RandomUniformLike", dict(low=5.0, high=6.0), {"x": x})
    assert y.shape == x.shape and y.dtype == np.float16 and 5 <= y.min() and y.max() < 6
    y = draw("RandomNormalLike", dict(dtype=TensorProto.DOUBLE, mean=-1.0, scale=0.5),
             {"x": np.zeros((200, 300), np.int64)})
    assert y.shape == (200, 300) and y.dtype == np.float64
    assert abs(y.mean() + 1) < 0.01 and abs(y.std() - 0.5) < 0.01
    with pytest.raises(ShapeError, match="the output dtype .* is int64, but the op draws"):
        planner.compile(model("RandomNormalLike", {}, {"x": np.zeros(3, np.int64)}))


@pytest.mark.parametrize("dtype, want", [(None, np.float32), (TensorProto.BOOL, np.bool_),
                                         (TensorProto.INT64, np.int64), (TensorProto.DOUBLE, np.float64),
                                         (TensorProto.UINT8, np.uint8)])
def test_bernoulli_is_exact_at_0_and_1(dtype, want):
    probs = np.repeat(np.array([[0], [1], [0.3], [0.9]], np.float32), 100_000, axis=1)
    y = draw("Bernoulli", {} if dtype is None else dict(dtype=dtype), {"p": probs})
    assert y.shape == probs.shape and y.dtype == want
    assert set(np.unique(y)) <= {0, 1}
    rates = y.astype(np.float64).mean(axis=1)
    assert rates[0] == 0 and rates[1] == 1
    np.testing.assert_allclose(rates[2:], [0.3, 0.9], atol=0.01)


def test_bernoulli_of_doubles_and_halves():
    for dtype in (np.float64, np.float16):
        probs = np.full((1000, 100), 0.25, dtype)
        y = draw("Bernoulli", {}, {"p": probs})
        assert y.dtype == dtype and abs(y.astype(np.float64).mean() - 0.25) < 0.01


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_multinomial_follows_the_log_probabilities(dtype):
    """Unnormalised log-probabilities (shifted by 3, one -inf), a row of one likely class, one of one class."""
    probs = np.array([[0.1, 0.2, 0.3, 0.4, 0.0], [1e-9, 1e-9, 1.0, 1e-9, 1e-9]])
    with np.errstate(divide="ignore"):
        logits = (np.log(probs) + 3).astype(dtype)
    y = draw("Multinomial", dict(sample_size=200_000, dtype=TensorProto.INT64), {"x": logits})
    assert y.shape == (2, 200_000) and y.dtype == np.int64
    counts = np.stack([np.bincount(row, minlength=5) for row in y]) / y.shape[1]
    np.testing.assert_allclose(counts, probs, atol=0.005)
    assert counts[0, 4] == 0
    one = draw("Multinomial", dict(sample_size=7), {"x": np.zeros((3, 1), dtype)})
    assert one.dtype == np.int32 and one.shape == (3, 7) and not one.any()


def test_multinomial_with_many_classes():
    """A vocabulary's worth of classes, every other one impossible: the binary search finds the rest."""
    classes = 5001
    logits = np.where(np.arange(classes) % 2 == 0, 0.0, -np.inf).astype(np.float32)[None].repeat(4, 0)
    y = draw("Multinomial", dict(sample_size=100_000), {"x": logits})
    assert (y % 2 == 0).all() and y.min() >= 0 and y.max() < classes
    counts = np.bincount(y.ravel(), minlength=classes)[::2]
    assert abs(counts.mean() - y.size / 2501) < 1e-9 and counts.std() < 3 * np.sqrt(counts.mean())


CASES = {  # op: (attributes, inputs), each drawing enough values that two draws never coincide
    "RandomNormal": (dict(shape=[64, 64]), {}),
    "RandomUniform": (dict(shape=[64, 64], dtype=TensorProto.FLOAT16), {}),
    "RandomNormalLike": ({}, {"x": np.zeros((64, 64), np.float32)}),
    "RandomUniformLike": ({}, {"x": np.zeros((64, 64), np.float64)}),
    "Bernoulli": ({}, {"p": np.full((64, 64), 0.5, np.float32)}),
    "Multinomial": (dict(sample_size=4096), {"x": np.zeros((2, 10), np.float32)}),
}


@pytest.mark.parametrize("op", CASES)
def test_seeded_runs_repeat_and_seeds_differ(op):
    attrs, inputs = CASES[op]
    first, again = runs(op, {**attrs, "seed": 3.0}, inputs, times=2)
    assert np.array_equal(first, again)
    assert np.array_equal(first, draw(op, {**attrs, "seed": 3.0}, inputs))  # another plan, the same values
    assert not np.array_equal(first, draw(op, {**attrs, "seed": 3.5}, inputs))


@pytest.mark.parametrize("op", CASES)
def test_unseeded_runs_differ(op):
    attrs, inputs = CASES[op]
    first, second = runs(op, attrs, inputs, times=2)
    assert first.shape == second.shape and not np.array_equal(first, second)


def test_draws_are_never_folded_nor_mirrored():
    """A RandomNormal small enough to fold stays a step of the plan, drawn on each run."""
    nodes = [helper.make_node("RandomNormal", [], ["r"], shape=[2, 3]), helper.make_node("Add", ["r", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = planner.load(m)
    assert [n.op for n in loaded.nodes] == ["RandomNormal", "Add"] and loaded.tensors["r"].kind == "activation"
    assert not need_mirror(loaded.nodes[0], loaded.opsets)
    ex = Executor(planner.compile(m), backend="numpy")
    assert not np.array_equal(ex.run({})["y"], ex.run({})["y"])
    assert all(ops.get(op).random and ops.get(op).evaluate is None for op in CASES)


def test_rematerialisation_keeps_the_draws():
    """Recomputed in backward, an unseeded draw would differ from the one the forward pass used: the
    sublinear search recomputes the products around it, never the draw."""
    rng, nodes, inits, prev = np.random.default_rng(0), [], [], "x"
    for k in range(4):
        inits.append(helper.make_tensor(f"w{k}", TensorProto.FLOAT, [64, 64], rng.standard_normal(64 * 64) * 0.1))
        nodes += [helper.make_node("MatMul", [prev, f"w{k}"], [f"h{k}"]),
                  helper.make_node("RandomNormalLike", [f"h{k}"], [f"e{k}"]),
                  helper.make_node("Mul", [f"h{k}", f"e{k}"], [f"z{k}"]),
                  helper.make_node("Tanh", [f"z{k}"], [f"t{k}"])]
        prev = f"t{k}"
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [64, 64])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    plan = planner.compile(m, training=True, loss="mse", remat="sublinear")
    recomputed = plan.training["remat"]["recomputed"]
    assert recomputed and not any(name.startswith("e") for name in recomputed)
    assert [s.op for s in plan.steps].count("RandomNormalLike") == 4


def test_gradients_through_seeded_draws():
    """x * noise and x * Bernoulli(sigmoid(x)): the draws pass no gradient, and with a seed every run of
    the finite differences draws the same ones (on NumPy: CuPy's generator draws other numbers)."""
    check("numpy", weighted([("RandomNormalLike", ["x"], ["e"], dict(seed=2.0)), ("Mul", ["x", "e"], ["a"], {})],
                            [3, 4], {}), p(3, 4))
    check("numpy", weighted([("Sigmoid", ["x"], ["s"], {}), ("Bernoulli", ["s"], ["b"], dict(seed=5.0)),
                             ("Mul", ["x", "b"], ["a"], {})], [3, 4], {}), p(3, 4))


@pytest.mark.parametrize("op, attrs, inputs", [
    ("RandomNormal", dict(shape=[256, 256], dtype=TensorProto.FLOAT16), {}),
    ("RandomUniform", dict(shape=[256, 256], dtype=TensorProto.DOUBLE), {}),
    ("RandomNormalLike", {}, {"x": np.zeros((256, 256), np.float32)}),
    ("RandomUniformLike", {"dtype": TensorProto.BFLOAT16}, {"x": np.zeros((256, 256), np.float32)}),
    ("Bernoulli", dict(dtype=TensorProto.INT64), {"p": np.full((256, 256), 0.5, np.float16)}),
    ("Multinomial", dict(sample_size=1024), {"x": np.zeros((64, 1000), np.float32)}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_kernels_allocate_nothing(op, attrs, inputs):
    """Drawn into the output or the workspace, large enough that any temporary of their size shows."""
    ex = Executor(planner.compile(model(op, attrs, inputs)), backend="numpy")
    assert_bounded(allocations(ex, lambda: ex.run(inputs)), exempt=set())


@pytest.mark.parametrize("op, attrs, inputs, message", [
    ("RandomNormal", dict(shape=[2, -1]), {}, "shape \\(2, -1\\) has a negative dimension"),
    ("RandomNormal", dict(shape=[2], dtype=TensorProto.INT32), {}, "dtype is int32, but the op draws"),
    ("RandomUniform", dict(shape=[2], low=1.0, high=0.0), {}, "low 1.0 must not be above high 0.0"),
    ("Multinomial", {}, {"x": np.zeros(4, np.float32)}, "input has shape \\(4,\\), Multinomial needs"),
    ("Multinomial", {}, {"x": np.zeros((2, 0), np.float32)}, "classes >= 1"),
    ("Multinomial", dict(dtype=TensorProto.FLOAT), {"x": np.zeros((2, 3), np.float32)},
     "dtype float32 must be int32 or int64"),
    ("Bernoulli", dict(dtype=TensorProto.STRING), {"p": np.zeros(3, np.float32)}, "is not a number or bool type"),
])
def test_bad_attributes_are_shape_errors(op, attrs, inputs, message):
    with pytest.raises(ShapeError, match=message):
        planner.compile(model(op, attrs, inputs))


@pytest.mark.torch
def test_pytorch_forms():
    """The ops with an input (which places PyTorch's draws) run in to_torch: shapes, dtypes, moments and seeds."""
    pytest.importorskip("torch")
    from executor.torch_module import to_torch

    def torch_runs(op, attrs, inputs, times=1):
        module = to_torch(model(op, attrs, inputs))
        return [module(**inputs)["y"].numpy() for _ in range(times)]

    x = np.zeros(SHAPE, np.float32)
    y = torch_runs("RandomNormalLike", dict(mean=1.0, scale=3.0, dtype=TensorProto.DOUBLE), {"x": x})[0]
    assert y.dtype == np.float64 and abs(y.mean() - 1) < 0.05 and abs(y.std() - 3) < 0.05
    y = torch_runs("RandomUniformLike", dict(low=-1.0, high=1.0), {"x": x})[0]
    assert y.dtype == np.float32 and -1 <= y.min() and y.max() < 1 and abs(y.mean()) < 0.01
    y = torch_runs("Bernoulli", dict(dtype=TensorProto.INT32), {"p": np.full(SHAPE, 0.2, np.float32)})[0]
    assert y.dtype == np.int32 and abs(y.mean() - 0.2) < 0.01
    logits = np.log(np.array([[0.5, 0.25, 0.25]], np.float32))
    y = torch_runs("Multinomial", dict(sample_size=100_000, dtype=TensorProto.INT64), {"x": logits})[0]
    assert y.shape == (1, 100_000) and y.dtype == np.int64
    np.testing.assert_allclose(np.bincount(y[0]) / y.size, [0.5, 0.25, 0.25], atol=0.01)
    first, again = torch_runs("RandomNormalLike", dict(seed=4.0), {"x": x}, times=2)
    assert np.array_equal(first, again)
    first, second = torch_runs("RandomNormalLike", {}, {"x": x}, times=2)
    assert not np.array_equal(first, second)


@pytest.mark.gpu
@pytest.mark.parametrize("op", CASES)
def test_on_gpu(op):
    """Each op drawn by CuPy's generator: the shape and dtype NumPy's gives, seeded runs repeating,
    unseeded ones not."""
    from executor import backends
    try:
        backends.get("cupy")
    except planner.MemplanError:
        pytest.skip("needs CuPy and a CUDA GPU")
    attrs, inputs = CASES[op]
    first, again = runs(op, {**attrs, "seed": 1.0}, inputs, times=2, backend="cupy")
    want = draw(op, attrs, inputs)
    assert first.shape == want.shape and first.dtype == want.dtype and np.array_equal(first, again)
    assert not np.array_equal(*runs(op, attrs, inputs, times=2, backend="cupy"))


@pytest.mark.gpu
def test_moments_on_gpu():
    from executor import backends
    try:
        backends.get("cupy")
    except planner.MemplanError:
        pytest.skip("needs CuPy and a CUDA GPU")
    y = runs("RandomUniform", dict(shape=[1000, 1000], low=-2.0, high=3.0, dtype=TensorProto.FLOAT16),
             backend="cupy")[0]
    assert y.min() >= -2 and y.max() < 3 and abs(y.astype(np.float64).mean() - 0.5) < 0.03
    y = runs("RandomNormal", dict(shape=list(SHAPE), mean=1.5, scale=2.0), backend="cupy")[0]
    assert abs(y.mean() - 1.5) < 0.03 and abs(y.std() - 2) < 0.03
    probs = np.repeat(np.array([[0], [1], [0.3]], np.float32), 100_000, axis=1)
    rates = runs("Bernoulli", {}, {"p": probs}, backend="cupy")[0].mean(axis=1)
    assert rates[0] == 0 and rates[1] == 1 and abs(rates[2] - 0.3) < 0.01
    logits = np.log(np.array([[0.1, 0.2, 0.3, 0.4]], np.float32))
    y = runs("Multinomial", dict(sample_size=100_000), {"x": logits}, backend="cupy")[0]
    np.testing.assert_allclose(np.bincount(y[0], minlength=4) / y.size, [0.1, 0.2, 0.3, 0.4], atol=0.01)
