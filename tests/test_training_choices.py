"""What a training step trains and what its loss reads, on small hand-built models: the numbers of a
model's code stay constants, trainable= and frozen= override, cross_entropy's class axis and
ignore_index (the loss against PyTorch's F.cross_entropy), optimizer_args checked when compiling, and
the report's lines saying all of this."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from graphs import node
from planner.errors import ConfigError, ModelError
from planner.report import report

VOCAB, BATCH, SEQ = 11, 2, 6
NUMBER = "one element read by"


def build(nodes, inputs, params):
    """An opset-17 model of `nodes` with `inputs` {name: (elem type, shape)}, one output "logits" and
    `params` {name: array} as its initializers, in that order."""
    g = helper.make_graph(nodes, "choices", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in params.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def numbers_model():
    """(4, 8) -> MatMul -> x ** 2 + eps, * scale, - shift, / temperature, clamp -> Gemm with a one-element
    bias: what torch.onnx writes for a module's arithmetic with Python numbers."""
    rng = np.random.default_rng(0)
    f = np.float32
    params = {"w": rng.standard_normal((8, 8), f), "p": f(2.0), "eps": f(1e-6), "scale": f(0.125), "shift": f(0.5),
              "temperature": f(2.0), "lo": f(-3.0), "hi": f(3.0), "head": rng.standard_normal((8, 5), f),
              "bias": np.full((1,), 0.1, f)}
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Pow", ["h", "p"], ["sq"]), node("Add", ["sq", "eps"], ["e"]),
             node("Mul", ["e", "scale"], ["s"]), node("Sub", ["s", "shift"], ["d"]),
             node("Div", ["d", "temperature"], ["t"]), node("Clip", ["t", "lo", "hi"], ["c"]),
             node("Gemm", ["c", "head", "bias"], ["logits"])]
    return build(nodes, {"x": (TensorProto.FLOAT, [4, 8])}, params)


def compiled(model, shapes=None, **options):
    return planner.compile(model, shapes, training=True, **options)


def test_numbers_of_the_code_stay_constants_with_their_reason():
    plan = compiled(numbers_model())
    assert plan.training["params"] == ["w", "head", "bias"]
    constants = plan.training["constants"]
    assert list(constants) == ["p", "eps", "scale", "shift", "temperature"]
    assert constants["p"] == "the exponent of a Pow"
    for name, op in (("eps", "Add"), ("scale", "Mul"), ("shift", "Sub"), ("temperature", "Div")):
        assert constants[name].startswith(f"{NUMBER} {op}: a number of the model's code"), name
    clip = next(s for s in plan.steps if s.op == "Clip")
    assert "lo" not in plan.tensors and "hi" not in plan.tensors, "Clip's bounds become its attributes"
    assert (clip.attrs["min"], clip.attrs["max"]) == (-3.0, 3.0)


def test_a_one_element_weight_read_by_another_op_trains():
    """Gemm's one-element bias (nn.Linear(8, 1)'s) is a weight, not a number of the code."""
    ex = Executor(compiled(numbers_model(), loss="mse"), backend="numpy", poison=True)
    before = ex.parameters()["bias"].copy()
    ex.train_step({"x": np.ones((4, 8), np.float32), "targets": np.ones((4, 5), np.float32)})
    assert ex.parameters()["bias"] != before


def test_trainable_forces_a_number_to_train_and_frozen_keeps_a_weight():
    plan = compiled(numbers_model(), trainable=("scale",), frozen=("w",))
    assert plan.training["params"] == ["scale", "head", "bias"]
    assert plan.training["constants"]["w"] == "frozen" and "scale" not in plan.training["constants"]
    ex = Executor(plan, backend="numpy", poison=True)
    ex.train_step({"x": np.ones((4, 8), np.float32), "labels": np.arange(4)})
    assert ex.parameters()["scale"] != np.float32(0.125)
    assert np.array_equal(np.asarray(ex.arena.view("w")), plan.data["w"])


def test_a_name_both_trainable_and_frozen_is_a_config_error():
    with pytest.raises(ConfigError, match="'scale' named both trainable and frozen"):
        compiled(numbers_model(), trainable=("scale",), frozen=("scale",))


@pytest.mark.parametrize("what", ["trainable", "frozen"])
def test_unknown_names_are_model_errors(what):
    with pytest.raises(ModelError, match=f"{what} names 'nope', which are not params"):
        compiled(numbers_model(), **{what: ("nope",)})


def test_a_trainable_name_that_cannot_train_is_a_model_error():
    model = build([node("Gather", ["table", "rows"], ["g"]), node("Add", ["x", "g"], ["logits"])],
                  {"x": (TensorProto.FLOAT, [2, 4])}, {"table": np.ones((5, 4), np.float32), "rows": np.array([0, 3])})
    assert compiled(model).training["constants"] == {"rows": "int64 values, not floats"}
    with pytest.raises(ModelError, match="trainable name 'rows' cannot train: int64 values, not floats"):
        compiled(model, trainable=("rows",))


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="shapes.infer folds Exp of a one-element param into "
                   "a const, so the log-temperature never trains")
def test_a_one_element_log_temperature_through_exp_trains():
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Exp", ["log_t"], ["t"]), node("Mul", ["h", "t"], ["logits"])]
    model = build(nodes, {"x": (TensorProto.FLOAT, [4, 8])},
                  {"w": np.ones((8, 5), np.float32), "log_t": np.zeros(1, np.float32)})
    assert "log_t" in compiled(model).training["params"]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="a one-element bias added after a MatMul "
                   "(nn.Linear(k, 1) on 3-D input, as torch.onnx writes it) reads as a number of the code")
def test_a_one_element_bias_after_matmul_trains():
    model = build([node("MatMul", ["x", "w"], ["h"]), node("Add", ["h", "b"], ["logits"])],
                  {"x": (TensorProto.FLOAT, [2, 3, 8])},
                  {"w": np.ones((8, 1), np.float32), "b": np.zeros(1, np.float32)})
    assert "b" in compiled(model, loss="mse").training["params"]


def language_model():
    """int64 ids (BATCH, SEQ) -> Gather from an embedding -> MatMul: (BATCH, SEQ, VOCAB) logits; and its weights."""
    rng = np.random.default_rng(1)
    weights = {"embedding": rng.standard_normal((VOCAB, 8), np.float32),
               "unembedding": rng.standard_normal((8, VOCAB), np.float32)}
    nodes = [node("Gather", ["embedding", "input_ids"], ["h"]), node("MatMul", ["h", "unembedding"], ["logits"])]
    return build(nodes, {"input_ids": (TensorProto.INT64, ["batch", "seq"])}, weights), weights


def tokens(seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (BATCH, SEQ)), rng.integers(0, VOCAB, (BATCH, SEQ))


def test_ids_reshaped_on_the_way_to_the_embedding_still_make_a_language_model():
    """torch.onnx's dynamo export views the ids (a Reshape) before the embedding Gather (GPT-2's)."""
    model, _ = language_model()
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [BATCH, SEQ])
    model.graph.initializer.append(shape)
    model.graph.node.insert(0, node("Reshape", ["input_ids", "shape"], ["view"]))
    model.graph.node[1].input[1] = "view"
    criterion = compiled(model, {"input_ids": (BATCH, SEQ)}).training["criterion"]
    assert criterion["class_axis"] == 2 and criterion["rule"].startswith("a language model")


@pytest.mark.torch
@pytest.mark.parametrize("ignore_index", [-100, 0, None])
def test_a_language_model_takes_classes_on_the_last_dim(ignore_index):
    torch = pytest.importorskip("torch")
    model, weights = language_model()
    plan = compiled(model, {"input_ids": (BATCH, SEQ)}, ignore_index=ignore_index)
    criterion = plan.training["criterion"]
    assert criterion["class_axis"] == 2 and criterion["ignore_index"] == ignore_index
    assert criterion["rule"].startswith("a language model (token ids input_ids feed an embedding Gather)")
    assert tuple(plan.tensors["labels"].shape) == (BATCH, SEQ)
    ids, labels = tokens()
    if ignore_index is not None:
        labels[0, :3] = labels[1, -1] = ignore_index
    loss = Executor(plan, backend="numpy", poison=True).train_step({"input_ids": ids, "labels": labels})
    logits = torch.from_numpy(weights["embedding"])[torch.from_numpy(ids)] @ torch.from_numpy(weights["unembedding"])
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), torch.from_numpy(labels).reshape(-1),
                                             ignore_index=-100 if ignore_index is None else ignore_index)
    assert loss == pytest.approx(want.item(), rel=1e-5)


def scores_model():
    """float (2, 3, 4, 8) -> MatMul: (2, 3, 4, 5) logits, with no token ids to say where the classes are."""
    weights = {"w": np.random.default_rng(2).standard_normal((8, 5), np.float32)}
    return build([node("MatMul", ["x", "w"], ["logits"])], {"x": (TensorProto.FLOAT, [2, 3, 4, 8])}, weights), weights


@pytest.mark.torch
@pytest.mark.parametrize("axis", [None, 1, 2, -1])
def test_class_axis_given_reads_the_classes_on_that_dim(axis):
    torch = pytest.importorskip("torch")
    model, weights = scores_model()
    plan = compiled(model, class_axis=axis)
    dim = 1 if axis is None else axis % 4
    assert plan.training["criterion"]["class_axis"] == dim
    assert plan.training["criterion"]["rule"].startswith("(N, C, d1, ...)" if axis is None else "given as class_axis")
    shape = (2, 3, 4, 5)
    labels = np.random.default_rng(3).integers(0, shape[dim], shape[:dim] + shape[dim + 1:])
    labels.flat[::4] = -100
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 8), np.float32)
    loss = Executor(plan, backend="numpy", poison=True).train_step({"x": x, "labels": labels})
    logits = torch.from_numpy(x) @ torch.from_numpy(weights["w"])
    want = torch.nn.functional.cross_entropy(logits.movedim(dim, 1), torch.from_numpy(labels))
    assert loss == pytest.approx(want.item(), rel=1e-5)


@pytest.mark.parametrize("axis", [4, -5, 1.5, True])
def test_a_class_axis_outside_the_logits_is_a_config_error(axis):
    with pytest.raises(ConfigError, match=rf"class_axis {axis!r} is not a dim of the logits 'logits'"):
        compiled(scores_model()[0], class_axis=axis)


@pytest.mark.parametrize("options", [{"ignore_index": 0}, {"class_axis": 1}])
def test_cross_entropy_options_on_mse_are_config_errors(options):
    with pytest.raises(ConfigError, match="apply to loss='cross_entropy', not 'mse'"):
        compiled(numbers_model(), loss="mse", **options)


@pytest.mark.parametrize("optimizer, args, message", [
    ("sgd", {"lr": "abc"}, "lr='abc' is invalid; lr takes a finite number >= 0"),
    ("adam", {"betas": (0.9, 1.5)}, r"betas=\(0.9, 1.5\) is invalid; betas takes two numbers in \[0, 1\)"),
    ("sgd", {"momentum": 0.9}, "got unknown momentum"),
    ("momentum", {"nesterov": True, "momentum": 0}, "nesterov=True needs a momentum > 0"),
])
def test_bad_optimizer_args_fail_when_compiling(optimizer, args, message):
    with pytest.raises(ConfigError, match=message):
        compiled(numbers_model(), optimizer=optimizer, optimizer_args=args)


def test_the_report_says_what_trains_and_what_the_loss_reads():
    graph = planner.load(numbers_model())
    result = report(graph, strategies=("bestfit",), training=True, frozen=("w",))
    lines = result.table().splitlines()
    assert ("trains 2 params (41 values); 6 initializers stay constants: 4 one-element numbers of the model's code "
            "(eps, scale, shift, ...), 1 frozen (w), 1 Pow exponent (p)") in lines
    assert "loss: cross_entropy over dim 1 of 'logits' ((batch, classes) logits: dim 1), ignore_index -100" in lines
    doc = result.as_dict()
    assert (doc["trained_params"], doc["trained_values"]) == (2, 41)
    assert doc["constants"]["w"] == "frozen" and doc["criterion"]["class_axis"] == 1
    model, _ = language_model()
    lines = report(planner.load(model, {"input_ids": (BATCH, SEQ)}), strategies=("bestfit",), training=True,
                   ignore_index=None).table().splitlines()
    assert "trains 2 params (176 values)" in lines
    assert ("loss: cross_entropy over dim 2 of 'logits' (a language model (token ids input_ids feed an embedding "
            "Gather): (batch, seq, vocab) logits, classes on the last dim), no ignore_index") in lines
