"""Symbol, its sources (var, param, const), op() that every op function goes through, and how a
symbol DAG becomes a planner Graph (to_graph) or an ONNX model (to_onnx)."""
import contextlib
import contextvars
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from planner import dtypes, ops
from planner.errors import ModelError
from planner.ir import DEFAULT_OPSETS, Annotations, Graph, Node, Tensor

from ..onnx_frontend import MAX_OPSET, META
from .rules import canon, latest_schema, output_dtypes, output_ranks, static_dtype

MIN_EXPORT_OPSET = 13
"""Oldest opset to_onnx writes (before 13, Softmax normalises over all dims from its axis on)."""
IR_VERSION = 10
"""IR version of exported models: the first with node metadata_props."""

_ANNOTATIONS = contextvars.ContextVar("memplan_symbol_annotations", default={})

_NUMBERS = (bool, int, float, np.number, np.bool_, np.ndarray)
"""What a Python operator promotes to a constant."""


@dataclass(eq=False)
class _Op:
    """A node of the symbol DAG, or a source (graph input, parameter, constant); shared by its outputs."""

    kind: str
    op: str = ""
    inputs: tuple = ()
    attrs: dict = field(default_factory=dict)
    name: str | None = None
    meta: dict = field(default_factory=dict)
    dtypes: tuple = ()
    ranks: tuple = (None,)
    shape: tuple | None = None
    data: np.ndarray | None = None


class Symbol:
    """One output of an op, a graph input, a parameter or a constant; or, from `group`, several outputs."""

    __slots__ = ("_outs",)

    def __init__(self, outs):
        self._outs = tuple(outs)

    def _one(self, what):
        if len(self._outs) != 1:
            raise TypeError(f"a group of {len(self._outs)} outputs has no single {what}; index it first")
        return self._outs[0]

    @property
    def dtype(self):
        op, i = self._one("dtype")
        return np.dtype(op.dtypes[i])

    @property
    def ndim(self):
        """The rank when the symbol API could tell it cheaply, else None."""
        op, i = self._one("ndim")
        return op.ranks[i]

    @property
    def name(self):
        """The name given when the symbol was made (None when it is named when a graph is built)."""
        return self._one("name")[0].name

    def __len__(self):
        return len(self._outs)

    def __getitem__(self, i):
        return Symbol((self._outs[i],))

    def __repr__(self):
        parts = [f"{op.name or op.op or op.kind}[{i}]" for op, i in self._outs]
        return f"Symbol({', '.join(parts)})"

    def to_graph(self, opset=17):
        """The planner's Graph in canonical form, dims not bound; once typed, the same as to_onnx(opset)'s."""
        return _build(self, opset)[0]

    def to_onnx(self, opset=17):
        """An onnx.ModelProto: static arguments that the op takes as inputs at `opset` become Constant nodes;
        the outputs' shapes are ONNX's shape inference's (the checker wants one)."""
        if not MIN_EXPORT_OPSET <= opset <= MAX_OPSET:
            raise ModelError(f"to_onnx writes opsets {MIN_EXPORT_OPSET} to {MAX_OPSET}, not {opset}")
        return _export(*_build(self, opset), opset)

    def __add__(self, other):
        return _binary("Add", self, other)

    def __radd__(self, other):
        return _binary("Add", other, self)

    def __sub__(self, other):
        return _binary("Sub", self, other)

    def __rsub__(self, other):
        return _binary("Sub", other, self)

    def __mul__(self, other):
        return _binary("Mul", self, other)

    def __rmul__(self, other):
        return _binary("Mul", other, self)

    def __truediv__(self, other):
        return _binary("Div", self, other)

    def __rtruediv__(self, other):
        return _binary("Div", other, self)

    def __pow__(self, other):
        return _binary("Pow", self, other)

    def __rpow__(self, other):
        return _binary("Pow", other, self)

    def __matmul__(self, other):
        return _binary("MatMul", self, other)

    def __rmatmul__(self, other):
        return _binary("MatMul", other, self)

    def __neg__(self):
        return op("Neg", self)


def var(name, shape, dtype="float32"):
    """A graph input; `shape` may hold dim names ("batch") bound later, or None for unknown dims."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"var: the name must be a non-empty str, got {name!r}")
    if not isinstance(shape, (tuple, list)) or not all(
            d is None or isinstance(d, str) or (isinstance(d, (int, np.integer)) and d >= 0) for d in shape):
        raise TypeError(f"var {name!r}: shape must be a tuple of ints >= 0, dim names or None, got {shape!r}")
    shape = tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in shape)
    return _source("input", name, np.dtype(dtype), len(shape), shape=shape)


def param(name, data):
    """A parameter (trainable weight) holding the NumPy array `data`."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"param: the name must be a non-empty str, got {name!r}")
    data = _array(data, f"param {name!r}")
    return _source("param", name, data.dtype, data.ndim, data=data)


def const(value, name=None, dtype=None):
    """A constant. Python floats become float32 unless `dtype` says otherwise; arrays keep their dtype."""
    data = _array(np.asarray(value, dtype=dtype), "const")
    if dtype is None and not isinstance(value, np.ndarray) and data.dtype == np.float64:
        data = data.astype(np.float32)
    return _source("const", name, data.dtype, data.ndim, data=data)


def _array(data, what):
    data = np.asarray(data)
    if data.dtype.kind not in "biufc":
        raise TypeError(f"{what}: data must be a numeric NumPy array, got dtype {data.dtype}")
    return data


def _source(kind, name, dtype, rank, **fields):
    return Symbol(((_Op(kind, name=name, dtypes=(dtype,), ranks=(rank,), **fields), 0),))


def group(*symbols):
    """One Symbol with several outputs: a model with several graph outputs."""
    return Symbol(out for s in symbols for out in check(s, "group", multi=True)._outs)


@contextlib.contextmanager
def annotate(**meta):
    """Annotate every op made inside, e.g. `with annotate(force_mirroring=True, mirror_stage="s1"):`."""
    token = _ANNOTATIONS.set({**_ANNOTATIONS.get(), **meta})
    try:
        yield
    finally:
        _ANNOTATIONS.reset(token)


def _meta_str(value):
    return str(int(value)) if isinstance(value, bool) else str(value)


def check(x, where, multi=False):
    """`x` as a Symbol, or a TypeError saying what was expected."""
    if not isinstance(x, Symbol):
        hint = "; wrap values with const(...)" if isinstance(x, (int, float, list, tuple, np.ndarray)) else ""
        raise TypeError(f"{where}: expected a Symbol, got {type(x).__name__}{hint}")
    if not multi:
        x._one("input to an op")
    return x


def op(op_type, *inputs, num_outputs=1, name=None, meta=None, **attrs):
    """One ONNX node; every op function goes through here, and any op in planner.ops.SCHEMAS is reachable.

    `inputs` are Symbols (None: an omitted optional input); `attrs` its ONNX attributes, and its
    static inputs (Reshape's shape, Slice's starts, ...) by name. A constant given as a static input
    moves to the attributes. Returns a Symbol, or a tuple of `num_outputs` Symbols.
    """
    schema = ops.get(op_type)
    ins = [None if x is None else check(x, f"{op_type} input {k}") for k, x in enumerate(inputs)]
    attrs = {k: v for k, v in attrs.items() if v is not None}
    static = {attr: i for attr, i, _ in schema.attr_inputs}
    for attr, i in static.items():
        if i < len(ins) and ins[i] is not None:
            source = ins[i]._outs[0][0]
            if source.kind != "const":
                raise ModelError(f"{op_type}: input {i} ({attr}) must be static; pass {attr}=... or a const")
            if attr in attrs:
                raise TypeError(f"{op_type}: {attr} is given both as input {i} and as an attribute")
            attrs[attr], ins[i] = source.data, None
    while ins and ins[-1] is None:
        ins.pop()
    onnx_schema = latest_schema(op_type)
    unknown = sorted(set(attrs) - set(static) - set(onnx_schema.attributes if onnx_schema else attrs))
    if unknown:
        known = sorted({*static, *onnx_schema.attributes})
        raise TypeError(f"{op_type} has no attribute {', '.join(unknown)}; it takes {', '.join(known) or 'none'}")
    like = next((x.dtype for x in ins if x is not None), np.dtype(np.float32))
    attrs = {k: np.asarray(v, static_dtype(op_type, static[k], like)).tolist() if k in static else canon(k, v)
             for k, v in attrs.items()}
    out_dtypes = output_dtypes(op_type, ins, attrs, num_outputs)
    node = _Op("op", op_type, tuple(ins), attrs, name,
               {str(k): _meta_str(v) for k, v in {**_ANNOTATIONS.get(), **(meta or {})}.items()},
               out_dtypes, output_ranks(op_type, ins, attrs, num_outputs))
    outs = tuple(Symbol(((node, k),)) for k in range(num_outputs))
    return outs[0] if num_outputs == 1 else outs


def _binary(op_type, a, b):
    """A binary op; a Python or NumPy scalar (or array) becomes a constant of the other operand's dtype."""
    if not all(isinstance(v, (Symbol, *_NUMBERS)) for v in (a, b)):
        return NotImplemented
    return op(op_type, promote(a, b), promote(b, a))



def promote(value, like):
    """`value` itself when a Symbol, else a constant of `like`'s dtype (a TypeError if that changes it)."""
    if isinstance(value, Symbol):
        return value
    if not isinstance(value, _NUMBERS):
        raise TypeError(f"expected a Symbol or a number, got {type(value).__name__}")
    dtype = check(like, "a number's partner").dtype
    data = np.asarray(value).astype(dtype)
    if dtype.kind in "biu" and not np.array_equal(data, value):
        raise TypeError(f"{value!r} cannot become a {dtype} constant without changing it; cast first")
    return const(data)


# ---- graph building and ONNX export ----

def _build(symbol, opset):
    """(Graph, tensor name -> dtype) of everything `symbol`'s outputs depend on."""
    order = _toposort(op for op, _ in symbol._outs)
    names = _names(order)

    def tensor(op, i):
        return names[op] if len(op.dtypes) == 1 else f"{names[op]}:{i}"

    outputs = tuple(tensor(op, i) for op, i in symbol._outs)
    tensors, nodes, dts = {}, [], {}

    def add(name, *fields):
        if name in tensors:
            raise ModelError(f"two symbols make a tensor named {name!r}; give them distinct names")
        tensors[name] = Tensor(name, *fields)

    for op in order:
        if op.kind == "param":
            add(names[op], op.data.shape, op.data.dtype, "param", op.data)
    for op in order:
        if op.kind == "input":
            add(names[op], op.shape, op.dtypes[0], "input")
    for op in order:
        if op.kind != "op":
            continue
        for x in op.inputs:
            c = x and x._outs[0][0]
            if c and c.kind == "const" and names[c] not in tensors:
                add(names[c], c.data.shape, c.data.dtype, "const", c.data)
        outs = tuple(tensor(op, i) for i in range(len(op.dtypes)))
        for name, dtype in zip(outs, op.dtypes):
            add(name, None, dtype if name in outputs else None, "output" if name in outputs else "activation")
            dts[name] = dtype
        attrs = dict(op.attrs)
        if op.op == "Split" and "split" not in attrs and opset >= 18:
            attrs["num_outputs"] = len(outs)
        nodes.append(Node(op.op, tuple("" if x is None else tensor(*x._outs[0]) for x in op.inputs),
                          outs, attrs, names[op], Annotations.from_metadata(op.meta, f"node {names[op]!r}")))
    for op in order:
        if op.kind == "const" and names[op] not in tensors:
            add(names[op], op.data.shape, op.data.dtype, "const", op.data)
    dts.update((t.name, t.dtype) for t in tensors.values() if t.kind != "activation")
    return Graph(tuple(nodes), tensors, tuple(n for op, n in names.items() if op.kind == "input"),
                 outputs, "symbol", {**DEFAULT_OPSETS, "": opset}), dts


def _toposort(outputs):
    """Depth-first post-order of the ops the outputs depend on, inputs in order."""
    order, seen = [], set()
    stack = [(op, False) for op in reversed(list(outputs))]
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
        elif op not in seen:
            seen.add(op)
            stack.append((op, True))
            stack.extend((x._outs[0][0], False) for x in reversed(op.inputs) if x is not None)
    return order


def _names(order):
    """Op -> name: the given ones (unique), else op type (or "const") and a counter, in build order."""
    given = Counter(op.name for op in order if op.name)
    dup = sorted(n for n, c in given.items() if c > 1)
    if dup:
        raise ModelError(f"names given to more than one symbol: {', '.join(dup)}")
    taken, counters, names = set(given), Counter(), {}
    for op in order:
        if op.name:
            names[op] = op.name
            continue
        prefix = op.op or op.kind
        while (name := f"{prefix}_{counters[prefix]}") in taken:
            counters[prefix] += 1
        taken.add(name)
        names[op] = name
    return names


def _export(graph, dts, opset):
    taken = set(graph.tensors) | {n.name for n in graph.nodes}
    consts = {t.name: t.data for t in graph.tensors.values() if t.kind == "const"}
    protos = []

    def constant(name, value):
        protos.append(helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name)))

    for node in graph.nodes:
        for name in node.inputs:
            if name in consts:
                constant(name, consts.pop(name))
        inputs, attrs = list(node.inputs), dict(node.attrs)
        for attr, i, since in ops.of(node, graph.opsets).attr_inputs:
            if attr in attrs and opset >= since:
                name = _fresh(f"{node.name}.{attr}", taken)
                like = dts[inputs[0]] if inputs and inputs[0] else np.dtype(np.float32)
                constant(name, np.asarray(attrs.pop(attr), static_dtype(node.op, i, like)))
                inputs += [""] * (i + 1 - len(inputs))
                inputs[i] = name
        proto = helper.make_node(node.op, inputs, node.outputs, name=node.name)
        proto.attribute.extend(_attribute(k, v) for k, v in attrs.items())
        for key, value in node.notes.metadata().items():
            proto.metadata_props.add(key=META + key, value=value)
        protos.append(proto)
    for name, value in consts.items():
        constant(name, value)
    g = helper.make_graph(
        protos, graph.name,
        [helper.make_tensor_value_info(n, dtypes.to_onnx(dts[n]), graph.tensors[n].shape) for n in graph.inputs],
        [helper.make_tensor_value_info(n, dtypes.to_onnx(dts[n]), None) for n in graph.outputs],
        [numpy_helper.from_array(t.data, t.name) for t in graph.params()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION,
                              producer_name="memplan")
    inferred = onnx.shape_inference.infer_shapes(model).graph.output
    for out, known in zip(model.graph.output, inferred):
        if known.type.tensor_type.HasField("shape"):
            out.CopyFrom(known)
    return model


def _fresh(base, taken):
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _attribute(key, value):
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if value == []:
        return helper.make_attribute(key, [], attr_type=AttributeProto.INTS)
    return helper.make_attribute(key, value)
