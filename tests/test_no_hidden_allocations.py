"""Kernels allocate nothing the plan does not know, on NumPy: every kernel of a run is measured with
tracemalloc (NumPy's ufunc buffers at their smallest), and the most it holds beyond what was held
before it ran stays under BOUND, room for Python objects and views. The GPU's check is
zoo_cases.assert_program_allocates_nothing. The NumPy kernels are measured (jit=False): the compiled ones'
allocations would be numba's own, which tracemalloc does not see."""
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from node_cases import REFUSED, as_planned, supported_cases
from zoo_cases import CASES, feeds, input_shapes, small_model

BOUND = 64 << 10
"""Bytes one kernel may allocate, never arrays of data: Python objects (whose free lists keep what a kernel
frees, so a step pays for what earlier steps drained), views, NumPy's iterators, and bookkeeping per axis
or group (a weight gradient's Conv walks a kernel as large as the image; a depthwise one, many groups)."""
FUSED_ON_GPU = {("memplan", "SGD"), ("memplan", "Adam"), ("memplan", "Dropout"), ("", "SoftmaxCrossEntropyLoss"),
                ("", "NegativeLogLikelihoodLoss")}
"""Ops whose NumPy form makes temporaries where the GPU runs one fused kernel (backends/cupy_kernels.py):
the optimizers' parameter-sized terms, the dropout hash and the loss's label lookups (one value per
position). Scratch for them would enlarge every training plan, on the GPU too, for the CPU's sake."""
HOST = {("", "Resize"): "its passes' index and weight tables, computed on the host from the static shapes",
        ("", "Dropout"): "the random training form, drawn on the host by the schema",
        ("", "Range"): "computed on the host by the schema",
        ("", "NonMaxSuppression"): "greedy and sequential: computed on the host over a copy of boxes and scores"}
"""Ops whose kernels compute values on the host, by design, and copy them into the arena."""
EXEMPT = FUSED_ON_GPU | set(HOST)
TRAINED = ("mlp", "lenet", "resnet18", "mobilenet_v2", "densenet121", "unet", "resnet_deep")


def allocations(ex, run):
    """([(step, bytes)], bytes): the most each kernel of `ex` allocates while `run()` runs the plan, the
    second time under tracing (the first imports and caches what kernels use), and the most a third
    run allocates in all, the copies of the outputs it returns included."""
    seen, program = [], ex.program

    def measured(fn):
        def call(xp, step, ins, outs, ws):
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            fn(xp, step, ins, outs, ws)
            seen.append((step, tracemalloc.get_traced_memory()[1] - held))
        return call

    ex.program = [bound and (measured(bound[0]), *bound[1:]) for bound in ex.program]
    size = np.getbufsize()
    np.setbufsize(16)
    tracemalloc.start()
    try:
        run()
        seen.clear()
        run()
        ex.program = program
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        run()
        whole = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
        np.setbufsize(size)
    return seen, whole


def assert_bounded(measured, exempt=EXEMPT):
    """Every step but those of `exempt` ops allocated at most BOUND bytes."""
    seen, _ = measured
    over = [f"step {s.name!r} ({s.op}) allocated {n} bytes" for s, n in seen
            if n > BOUND and (s.domain, s.op) not in exempt]
    assert not over, "; ".join(over)


@pytest.mark.parametrize("case", CASES)
def test_zoo_inference(case):
    """Each kernel, and the whole run beyond the copies of the outputs it returns."""
    model = small_model(case)
    plan = planner.compile(model, input_shapes(model, 3))
    ex, data = Executor(plan, backend="numpy", jit=False), feeds(model, 3)
    measured = allocations(ex, lambda: ex.run(data))
    assert_bounded(measured)
    assert measured[1] - sum(plan.tensors[name].nbytes for name in plan.outputs) <= BOUND


@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("case", TRAINED)
def test_zoo_training_step(case, optimizer):
    model = small_model(case)
    plan = planner.compile(model, input_shapes(model, 2), training=True, optimizer=optimizer)
    data, labels = feeds(model, 2), plan.tensors[plan.training["labels"]]
    data[labels.name] = np.zeros(labels.shape, labels.dtype)
    ex = Executor(plan, backend="numpy", jit=False)
    assert_bounded(allocations(ex, lambda: ex.train_step(data)))


def _first_case_of_each_op():
    """The first runnable ONNX node case of each op memplan supports (their inputs are small, so this
    checks the Python side of each kernel more than its arrays)."""
    cases, ops = [], set()
    for case in supported_cases():
        kinds = {n.op_type for n in case.model.graph.node} - {"Constant"}
        if case.name not in REFUSED and "string" not in case.name and not kinds <= ops:
            ops |= kinds
            cases.append(pytest.param(case, id=case.name))
    return cases


@pytest.mark.parametrize("case", _first_case_of_each_op())
def test_node_case(case):
    model, inputs, _ = as_planned(case)
    ex = Executor(planner.compile(model, {k: np.shape(v) for k, v in inputs.items()}, schedule="file"),
                  backend="numpy", jit=False)
    assert_bounded(allocations(ex, lambda: ex.run({k: np.asarray(v) for k, v in inputs.items()})))


SHAPE = (256, 256)  # 256 KiB of float32: any temporary of the data's size shows
ELEMENTWISE = {  # op: (inputs' dtype, number of inputs, attributes)
    **{op: (np.float32, 1, {}) for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs",
                                          "Reciprocal", "HardSwish", "Gelu", "Softmax", "LogSoftmax", "Sin",
                                          "Atan", "Floor", "Round", "Sign", "IsNaN", "IsInf", "Softplus")},
    **{op: (np.float32, 3, {}) for op in ("Max", "Min", "Sum", "Mean")},
    **{op: (np.bool_, 2, {}) for op in ("And", "Xor")}, "BitShift": (np.uint32, 2, {"direction": "LEFT"}),
    "LeakyRelu": (np.float32, 1, {"alpha": 0.1}), "HardSigmoid": (np.float32, 1, {"alpha": 0.3}),
    "Gelu tanh": (np.float32, 1, {"approximate": "tanh"}), "Trilu": (np.float32, 1, {"upper": 0}),
    **{op: (np.float32, 2, {}) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
                                          "LessOrEqual")},
    "Div": (np.int64, 2, {}), "Mod": (np.int64, 2, {}), "Clip": (np.float32, 3, {}), "Where": (np.float32, 3, {}),
}


def one_node(op, dtype, inputs, attrs):
    """An opset-20 model of one `op` node on SHAPE inputs (Clip's bounds and Where's condition as
    initializers)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = [f"x{k}" for k in range(inputs)]
    inits = []
    if op == "Clip":
        inits = [numpy_helper.from_array(np.array(v, dtype), n) for n, v in (("x1", -0.5), ("x2", 0.5))]
    if op == "Where":
        inits = [numpy_helper.from_array(np.arange(SHAPE[1]) % 2 == 0, "x0")]
    fed = [helper.make_tensor_value_info(n, elem, SHAPE) for n in names if n not in {i.name for i in inits}]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], op, fed, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_kernels(name):
    """The elementwise family on inputs large enough to show a temporary."""
    op = name.split()[0]
    dtype, inputs, attrs = ELEMENTWISE[name]
    plan = planner.compile(one_node(op, dtype, inputs, attrs))
    rng = np.random.default_rng(0)
    data = {n: rng.uniform(0.5, 2, SHAPE).astype(dtype) if dtype == np.float32 else
            rng.integers(0, 2, SHAPE).astype(bool) if dtype == np.bool_ else
            rng.integers(1, 9, SHAPE, dtype=dtype) for n in plan.inputs}
    ex = Executor(plan, backend="numpy", jit=False)
    measured = allocations(ex, lambda: ex.run(data))
    assert_bounded(measured, exempt=set())
