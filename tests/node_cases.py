"""The ONNX backend node tests (built in memory by onnx, no downloads) for the ops memplan supports."""
from functools import lru_cache

import numpy as np
import onnx
from onnx import defs
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

import pytest

from frontends.onnx_frontend import MIN_OPSET
from frontends.onnx_upgrade import LOSSY, OLDEST, upgrade
from planner import ops
from planner.ops.detection import LENGTH
from planner.errors import ModelError, ShapeError

REFUSED = {
    # name: (error, reason); each case must fail with exactly that error
    "test_identity_sequence": (ModelError, "sequence types are not planned, only tensors"),
    "test_identity_opt": (ModelError, "optional types are not planned, only tensors"),
    "test_if_seq": (ModelError, "sequence types are not planned, only tensors"),
    "test_if_opt": (ModelError, "optional types are not planned, only tensors"),
    "test_loop13_seq": (ModelError, "sequence types are not planned, only tensors"),
    "test_loop16_seq_none": (ModelError, "optional types are not planned, only tensors"),
    "test_scan_sum": (ModelError, LOSSY[("Scan", 8)]),
    **{f"test_affine_grid_{case}_expanded": (ShapeError, "the grid's size is an input fed when running, and its "
                                             "values (through If branches) give the output's shape")
       for case in ("2d", "2d_align_corners", "3d", "3d_align_corners")},
}

RANDOM = {f"test_bernoulli{kind}{form}" for kind in ("", "_double", "_seed") for form in ("", "_expanded")}
"""Cases whose outputs are random draws: onnx made their values with NumPy's global generator, which no
other one reproduces, so only their shapes and dtypes are compared (assert_outputs' `values`);
tests/test_ops_random.py checks the draws' statistics."""

NO_CASES = {"RandomNormal": "tests/test_ops_random.py", "RandomUniform": "tests/test_ops_random.py",
            "RandomNormalLike": "tests/test_ops_random.py", "Multinomial": "tests/test_ops_random.py",
            "GlobalLpPool": "tests/test_ops_spatial.py", "MaxRoiPool": "tests/test_ops_more.py"}
"""Ops onnx ships no backend node test for: where they are checked instead."""


def params(cases, refused=REFUSED):
    """pytest params of the cases, those in `refused` marked to fail with their error."""
    out = []
    for case in cases:
        marks = ()
        if case.name in refused:
            error, reason = refused[case.name]
            marks = pytest.mark.xfail(raises=error, reason=reason, strict=True)
        out.append(pytest.param(case, id=case.name, marks=marks))
    return out


def _opset(model):
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


@lru_cache(maxsize=None)
def supported_cases():
    """Node test cases whose every node is an op memplan has a schema for, in opsets it reads."""
    keep = []
    for case in all_cases():
        nodes = read_nodes(case.model)
        if not case.data_sets or not all(n.domain in ("", "ai.onnx") and
                                         (ops.known(n.op_type) or n.op_type == "Constant") for n in nodes):
            continue
        if _opset(case.model) >= OLDEST or _unchanged_since(nodes, _opset(case.model)):
            keep.append(case)
    return keep


def read_nodes(model):
    """The nodes memplan reads of a model: of an opset from OLDEST to MIN_OPSET - 1, those onnx's version
    converter makes of them (Upsample becomes Resize); the file's own where it refuses."""
    opset = _opset(model)
    if OLDEST <= opset < MIN_OPSET:
        try:
            return upgrade(model, opset, MIN_OPSET).graph.node
        except ModelError:
            pass
    return model.graph.node


def _unchanged_since(nodes, opset):
    """Whether every op means at MIN_OPSET what it meant at `opset`, older than OLDEST (Not has had one version
    since opset 1): such cases are read as MIN_OPSET's."""
    return all(defs.get_schema(n.op_type, MIN_OPSET).since_version <= opset for n in nodes)


def as_planned(case):
    """The case's model with the inputs that planning needs as constants (Reshape's shape, Slice's
    starts, ...) turned into initializers, as exporters write them; and the remaining inputs."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < OLDEST:
            o.version = MIN_OPSET
    inputs, expected = feeds(case)
    nodes = read_nodes(model)
    static = {n.input[i] for n in nodes if ops.known(n.op_type)
              for _, i, _ in ops.get(n.op_type).attr_inputs if i < len(n.input)}
    static.update(i for n in nodes if n.op_type == "Range" for i in n.input)  # its length
    static.update(i for n in nodes if n.op_type == "Loop" for i in n.input[:2] if i)  # its iterations
    static |= _sources_of(nodes, static)
    for name in [k for k in inputs if k in static]:
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(inputs.pop(name)), name))
    keep = [vi for vi in model.graph.input if vi.name not in static]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return model, inputs, expected


def _sources_of(nodes, names):
    """The tensors the values of `names` are computed from (through any op but Shape and Size, which
    read only their input's shape)."""
    producer = {o: n for n in nodes for o in n.output}
    found, todo = set(), list(names)
    while todo:
        node = producer.get(todo.pop())
        if node is not None and node.op_type not in ("Shape", "Size"):
            new = [i for i in node.input if i and i not in found]
            found.update(new)
            todo.extend(new)
    return found


def feeds(case):
    """(inputs, expected outputs) of a case's first data set, as name -> array."""
    graph = case.model.graph
    inits = {i.name for i in graph.initializer}
    names = [vi.name for vi in graph.input if vi.name not in inits]
    inputs, outputs = ([_array(x) for x in xs] for xs in case.data_sets[0])
    return dict(zip(names, inputs)), dict(zip([vi.name for vi in graph.output], outputs))


def _array(x):
    """Cases keep values numpy cannot hold natively (float8, int4, ...) as TensorProtos."""
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


NARROW_RTOL = {"bfloat16": 2.0 ** -6, "float16": 2.0 ** -9}
"""Relative tolerance of 16-bit float outputs: two units in the last place. memplan's reductions, softmax
and normalisations accumulate 16-bit inputs in float32 (as PyTorch and cuDNN do), where ONNX's reference
sums in the 16-bit type itself, so results may differ by a rounding step or two of the type (measured: two
bfloat16 steps on 3 of 192 values of the bfloat16 Attention cases)."""


def assert_outputs(got, expected, rtol, atol, values=True):
    """Each output (host arrays) has the expected shape and dtype; with `values` (not for the RANDOM
    cases), floats are within the tolerances, the rest exactly equal."""
    for name, want in expected.items():
        value, want = got[name], np.asarray(want)
        if name + LENGTH in got:  # planned at its bound: the real rows, then -1 rows
            assert (value[int(got[name + LENGTH]):] == -1).all(), name
            value = value[:int(got[name + LENGTH])]
        assert value.shape == want.shape and value.dtype == want.dtype, name
        if not values:
            continue
        if want.dtype.kind in "fc" or want.dtype.name == "bfloat16" or "float8" in want.dtype.name:
            np.testing.assert_allclose(value.astype(np.float64), want.astype(np.float64), err_msg=name, atol=atol,
                                       rtol=max(rtol, NARROW_RTOL.get(want.dtype.name, 0)))
        else:
            np.testing.assert_array_equal(value, want, err_msg=name)


def why_not_run(case):
    """Why a backend node case is not among supported_cases(), or None when nothing says why."""
    nodes = read_nodes(case.model)
    if not case.data_sets:
        return "the case ships no data"
    domains = {n.domain for n in nodes} - {"", "ai.onnx"}
    if domains:
        return f"outside ONNX's default domain ({', '.join(sorted(domains))})"
    unknown = {n.op_type for n in nodes if not ops.known(n.op_type) and n.op_type != "Constant"}
    if unknown and unknown <= set(ops.REASONS):
        return "; ".join(f"{op}: {ops.REASONS[op]}" for op in sorted(unknown))
    if not unknown and _opset(case.model) < OLDEST:
        return f"opset {_opset(case.model)}, older than opset {OLDEST}, the oldest memplan reads"
    return None


@lru_cache(maxsize=None)
def all_cases():
    """Every backend node case onnx ships, built in memory."""
    with np.errstate(all="ignore"):
        return load_model_tests(kind="node")
