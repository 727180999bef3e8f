"""The harness of the rewrite passes' property tests (test_pass_properties.py, test_attention_properties.py):
float32 ONNX models from nodes, feeds holding NaN, inf, huge and tiny values, onnxruntime's outputs with its
own graph rewrites off (so that it computes the model as written), a NaN-aware comparison, and `check`, which
plans a model with a pass and without it and holds both plans' outputs, on the NumPy kernels and the
compiled ones, to onnxruntime's.

    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, ["y"])
    fired = check(m, {"x": values(rng, (2, 3))}, "fuse_activation")

A hypothesis strategy returns a `Case`, whose repr is what it drew, so that a falsifying example reads as the
choices rather than as arrays.
"""
from typing import NamedTuple

import numpy as np
from hypothesis import HealthCheck, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import planner
from executor import Executor
from executor import jit as compiled

SPECIALS = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 1e-30, -1e-30, 1e-40, -1e-40, 0.0, -0.0], np.float32)
"""The values a feed is salted with: NaN, both infinities, huge values (whose squares and cubes overflow
float32, while sums of a few products of them with weights near 1 do not), tiny ones, subnormals, and both
zeros."""
SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
"""hypothesis's settings for these tests: a fixed, small search, so that the suite stays fast and the same."""
JITS = (False, True) if compiled.available() else (False,)
"""The kernels a plan runs on: NumPy's, and the compiled ones where numba is installed."""


class Case(NamedTuple):
    """One drawn example: the model, its feeds, whether the pass must change the plan (None: either), more
    compile options, and `label`, what was drawn (the repr)."""

    model: object
    feeds: dict
    fires: bool | None
    label: str
    options: dict | None = None

    def __repr__(self):
        return self.label

    def check(self, option, **keywords):
        """`check` of this case with the pass CompileOptions.<option>."""
        return check(self.model, self.feeds, option, self.fires, **(self.options or {}), **keywords)


def model(nodes, inputs, outputs, initializers=None, opset=17, domains=()):
    """A float32 ONNX model of `nodes` (onnx NodeProtos) reading `inputs` ({name: shape}) and those of
    `initializers` ({name: array}, cast to float32 unless an integer array) a node reads and no input names,
    writing `outputs` (names); `domains` ({domain: version}) imported beside ONNX's default at `opset`."""
    read = {i for n in nodes for i in n.input} - set(inputs)
    inits = [numpy_helper.from_array(np.asarray(v) if np.asarray(v).dtype.kind in "iub" else np.asarray(v, np.float32),
                                     k) for k, v in (initializers or {}).items() if k in read]
    graph = helper.make_graph(list(nodes), "case",
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in inputs.items()],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, None) for k in outputs], inits)
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in dict(domains).items())]
    return helper.make_model(graph, opset_imports=imports)


def values(rng, shape, rate=0.1, specials=SPECIALS):
    """A float32 array of `shape`: standard normal values, a `rate` of them replaced by `specials`."""
    x = rng.standard_normal(shape).astype(np.float32)
    salted = rng.random(shape) < rate
    x[salted] = rng.choice(np.asarray(specials, np.float32), int(salted.sum()))
    return x


@st.composite
def seeds(draw):
    """A NumPy Generator from a drawn seed: the arrays of one example."""
    return np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))


def onnxruntime(m, feeds):
    """onnxruntime's outputs {name: array} of model `m`, its graph optimisations off (its own fusions would
    rewrite the model the test holds memplan's to)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in m.graph.output], session.run(None, feeds)))


def assert_same(got, want, rtol=1e-4, atol=1e-5, what="", scaled=False):
    """`got` equals `want` as IEEE results: NaN where it has NaN, the same infinity where it has one, and
    finite values within `rtol` of want's plus `atol`, which `scaled` makes relative to want's largest finite
    magnitude (at least 1): for sums of products, whose rounding a huge term sets for every output it reaches."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} {got.dtype} against " \
                                                                f"{want.shape} {want.dtype}"
    for name, mask in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        wrong = mask(got) != mask(want)
        assert not wrong.any(), f"{what}: {name} differs at {np.argwhere(wrong)[:5].tolist()}: got " \
                                f"{got[wrong][:5]}, want {want[wrong][:5]}"
    finite = np.isfinite(want)
    g, w = got[finite].astype(np.float64), want[finite].astype(np.float64)
    atol *= max(1.0, float(np.abs(w).max(initial=0))) if scaled else 1.0
    wrong = np.abs(g - w) > atol + rtol * np.abs(w)
    assert not wrong.any(), f"{what}: {int(wrong.sum())} finite values differ, e.g. got {g[wrong][:5]}, " \
                            f"want {w[wrong][:5]}"


def steps(plan):
    """A plan's steps as (op, inputs), in order: what a rewrite changes (pretranspose changes inputs alone)."""
    return [(s.op, tuple(s.inputs)) for s in plan.steps]


def check(m, feeds, option, fires=None, rtol=1e-4, atol=1e-5, scaled=False, **options):
    """Plan `m` with the pass CompileOptions.<option> on and off (and `options`), run both on every kernel
    table of JITS, and assert each output equals onnxruntime's (assert_same with rtol, atol, scaled); where
    `fires` is True or False, assert the pass did or did not change the plan's steps. Returns whether it did."""
    shapes = {k: v.shape for k, v in feeds.items()}
    plans = {on: planner.compile(m, shapes, **{option: on}, **options) for on in (True, False)}
    fired = steps(plans[True]) != steps(plans[False])
    assert fires is None or fired == fires, f"{option} {'did not fire' if fires else 'fired'}: " \
                                            f"{[s.op for s in plans[True].steps]}"
    want = onnxruntime(m, feeds)
    for on, plan in plans.items():
        for jit in JITS:
            got = Executor(plan, backend="numpy", poison=True, jit=jit).run(feeds)
            for name in want:
                assert_same(got[name], want[name], rtol, atol, f"{option}={on}, jit={jit}, output {name!r}", scaled)
    return fired
