"""What an op is, in one place: the tables other modules keep of ops (autocast's policy, tensor parallelism's rules,
training forms, plan.stats counts, PyTorch forms, the backends' own kernels) are built from the schemas and the
kernel registrations, so that a new op is its schema and its kernel, and a new fusion its pass and its op
(docs/ARCHITECTURE.md: what a new op touches). A toy op and a toy fusion added at run time show it."""
from dataclasses import replace
from importlib import import_module
import pkgutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from executor.kernels import KERNELS, OVERRIDES
from planner import ops, passes, precision, shapes, tensor_split
from planner.ops.base import Schema, same_as_input

DOMAIN = "test.toy"


def test_every_schema_names_what_the_tables_know():
    for (domain, op), versions in ops.SCHEMAS.items():
        for _, s in versions:
            assert s.autocast in (None, *precision.WHERE), (domain, op)
            assert s.split is None or s.split in tensor_split.RULES, (domain, op)
            assert s.stat is None or isinstance(s.stat, str), (domain, op)
            assert isinstance(s.numbers, bool) and isinstance(s.setting_inputs, dict), (domain, op)


def _registered_forms():
    """Import every module that registers a backend's forms (the jit ones where numba imports)."""
    import_module("executor.backends.cupy_kernels")
    pytest.importorskip("numba")
    import executor.jit as jit
    for module in pkgutil.iter_modules(jit.__path__):
        import_module(f"executor.jit.{module.name}")


def test_one_shared_kernel_per_op_and_backend_forms_override_one():
    """An op's shared kernel is its schema's or a @kernel, never both; each backend form (@override) is of a
    registered op that has a shared kernel, which it stands in for."""
    both = [key for key in KERNELS if ops.known(key[1], key[0]) and ops.get(key[1], key[0]).kernel is not None]
    assert not both
    _registered_forms()
    assert OVERRIDES["cupy"] and OVERRIDES["jit"]
    for table in OVERRIDES.values():
        for domain, op in table:
            assert ops.known(op, domain) and ((domain, op) in KERNELS or ops.get(op, domain).kernel is not None)


def test_the_gpu_table_is_made_from_the_registered_forms():
    """Every registered CuPy form is made by the backend (here with a stand-in for cupy: no GPU is needed to see
    the table built from the registrations)."""
    from executor.backends.cupy_kernels import overrides

    class Stand:
        def __getattr__(self, name):
            return lambda *args, **kwargs: name

    table = overrides(Stand())
    assert set(table) == set(OVERRIDES["cupy"]) and all(callable(fn) for fn in table.values())
    assert ("memplan", "ScaledDotProductAttention") in table and ("", "LogSoftmax") in table


class Double(Schema):
    """test.toy.Double: y = 2 x, with every attribute the tables ask of an op, and its kernel (the module holds
    its computation)."""

    op, domain = "Double", DOMAIN
    autocast = "low"
    split = "elementwise"
    stat = "toy_doubled"

    def infer(self, node, ins):
        return same_as_input(node, ins)

    def kernel(self, xp, step, ins, outs, ws):
        xp.multiply(ins[0], 2, out=outs[0])

    def gradient(self, b, node, dys):
        return [b.op("Mul", dys[0], b.const(2, node.inputs[0]))]

    def training_form(self, node, step):
        return replace(node, attrs={**node.attrs, "training": 1})

    def torch_node(self, torch, run, node, ins):
        return ins[0] * 2


@pytest.fixture
def toy():
    """test.toy.Double registered for the length of a test."""
    ops.register(Double())
    yield
    del ops.SCHEMAS[DOMAIN, "Double"]


def _model(nodes, params, shape=(4, 8), out_shape=(4, 8)):
    """A float32 model of x reading `params`, with test.toy imported."""
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, name=outs[0], domain=DOMAIN if op == "Double" else "", **attrs)
         for op, ins, outs, attrs in nodes], "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])


RNG = np.random.default_rng(5)
MLP = [("MatMul", ["x", "w1"], ["h"], {}), ("Double", ["h"], ["d"], {}), ("MatMul", ["d", "w2"], ["y"], {})]
WEIGHTS = {"w1": RNG.standard_normal((8, 16)), "w2": RNG.standard_normal((16, 8))}


def test_a_new_op_is_its_schema_and_its_kernel(toy):
    """The toy op plans, runs, counts in plan.stats, computes where autocast says, lets tensor parallelism through,
    takes its training form and runs in PyTorch, each from its schema alone."""
    m = _model(MLP, WEIGHTS)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    plan = planner.compile(m)
    assert plan.stats["toy_doubled"] == 1 and plan.stats["fused_attention"] == 0
    want = 2 * x @ WEIGHTS["w1"].astype(np.float32) @ WEIGHTS["w2"].astype(np.float32)
    np.testing.assert_allclose(Executor(plan, backend="numpy").run({"x": x})["y"], want, rtol=1e-5)

    softmax = [("Softmax", ["x"], ["s"], {}), ("Double", ["s"], ["y"], {})]
    amp = planner.compile(_model(softmax, {}), precision="amp-fp16")
    step = next(s for s in amp.steps if s.op == "Double")
    assert amp.tensors[step.inputs[0]].dtype == "float16"  # Softmax computes in float32, Double in the low type

    trained = planner.compile(m, training=True, loss="mse", optimizer="sgd")
    assert next(s for s in trained.steps if s.op == "Double").attrs["training"] == 1

    split = planner.compile(m, training=True, loss="mse", optimizer="sgd", parallel=planner.Parallel(tp=2))
    facts = split.training["tensor_parallel"]
    assert (facts["column_layers"], facts["row_layers"]) == (1, 1)
    Double.split = None  # an op naming no rule stops a split: its region stays whole
    try:
        with pytest.raises(planner.MemplanError, match="no linear layers"):
            planner.compile(m, training=True, loss="mse", optimizer="sgd", parallel=planner.Parallel(tp=2))
    finally:
        Double.split = "elementwise"

    torch = pytest.importorskip("torch")
    from executor.torch_module import to_torch
    with torch.no_grad():
        np.testing.assert_allclose(to_torch(m)(x=torch.tensor(x))["y"].numpy(), want, rtol=1e-5)


def _doubling(graph):
    """The toy fusion: Mul(x, 2) as one test.toy.Double; (graph, how many it fused)."""
    two = {name for name, t in graph.tensors.items() if t.kind in ("param", "const") and t.data is not None
           and t.data.size == 1 and float(t.data.reshape(-1)[0]) == 2}
    nodes = [replace(n, op="Double", domain=DOMAIN, inputs=n.inputs[:1]) if n.op == "Mul" and n.inputs[1] in two else n
             for n in graph.nodes]
    count = sum(n.op == "Double" for n in nodes) - sum(n.op == "Double" for n in graph.nodes)
    return (shapes.retype(replace(graph, nodes=tuple(nodes)), graph) if count else graph), count


def test_a_new_fusion_is_its_pass_and_its_op(toy, monkeypatch):
    """A pass in the pipeline and the op it makes: compile counts what it fused from the op's `stat`."""
    pipeline = passes.pipeline

    def with_doubling(options):
        steps = pipeline(options)
        return [*steps[:-1], passes.base.rewrite_pass("doubling", _doubling, "Mul by 2"), steps[-1]]

    monkeypatch.setattr(passes, "pipeline", with_doubling)
    m = _model([("Mul", ["x", "two"], ["y"], {})], {"two": np.array(2.0)})
    plan = planner.compile(m)
    assert [s.op for s in plan.steps] == ["Double"] and plan.stats["toy_doubled"] == 1
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(Executor(plan, backend="numpy").run({"x": x})["y"], 2 * x)
