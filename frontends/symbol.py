"""Native symbolic API in the spirit of MXNet Symbol: write a model in Python, then plan it
(`planner.load(symbol, shapes)`) or export it (`symbol.to_onnx()`).

    x = var("data", ("batch", 3, 32, 32))
    w = param("conv0_weight", np.random.randn(8, 3, 3, 3).astype(np.float32))
    y = softmax(flatten(relu(conv2d(x, w, pad=1))))
    graph, model = y.to_graph(), y.to_onnx()

Each op function builds ONNX nodes in canonical form, as planner.shapes leaves them whatever
the opset: static arguments (Reshape's shape, Slice's starts, Clip's min, ...) are plain-Python
attributes, sequences are lists, bools are ints and floats are rounded to float32, as ONNX
stores them. Every op function also takes `name=` (default: op type and a counter, given when
a graph is built) and `meta=`. Symbols know their dtype (and rank where it is cheap), so
Python scalars promote to constants of the other operand's dtype.

Annotations (`meta={...}` or `with annotate(...)`, keys planner.ir.HINTS) become strings (True ->
"1", False -> "0", anything else str(value)) and then Node.notes; ONNX keeps them as node
metadata_props "memplan.KEY", so they read back unchanged.
"""
import contextlib
import contextvars
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from planner import dtypes, ops
from planner.errors import ModelError
from planner.ir import DEFAULT_OPSETS, Annotations, Graph, Node, Tensor

from .onnx_frontend import MAX_OPSET, META

MIN_EXPORT_OPSET = 13
"""Oldest opset to_onnx writes (before 13, Softmax normalises over all dims from its axis on)."""
IR_VERSION = 10
"""IR version of exported models: the first with node metadata_props."""

_ANNOTATIONS = contextvars.ContextVar("memplan_symbol_annotations", default={})

_BOOL_OUT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not",
             "IsNaN", "IsInf"}
_INT64_OUT = {"Shape", "Size", "ArgMax", "ArgMin", "NonZero"}
_LATER_OUT = {"TopK": np.int64, "MaxPool": np.int64, "Dropout": np.bool_}
"""Dtype of outputs after the first, where it is not the first output's."""
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "Max", "Min", "Sum", "Mean", "PRelu",
              *_BOOL_OUT - {"Not", "IsNaN", "IsInf"}}
_KEEP_RANK = {"Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus",
              "Tanh", "Gelu", "Erf", "Sqrt", "Exp", "Log", "Abs", "Neg", "Reciprocal", "Floor", "Ceil",
              "Not", "Clip", "Cast", "Identity", "Dropout", "Softmax", "LogSoftmax", "Conv",
              "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
              "BatchNormalization", "LayerNormalization", "InstanceNormalization", "Transpose",
              "Concat", "Split", "Slice", "Pad", "Resize", "Tile", "CumSum", "TopK"}
_NUMBERS = (bool, int, float, np.number, np.bool_, np.ndarray)
"""What a Python operator promotes to a constant."""
_STATIC_TYPES = (("tensor(int64)", np.int64), ("tensor(float)", np.float32), ("tensor(bool)", np.bool_))
"""Preferred dtypes of an input holding a static argument, when ONNX allows several."""


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
    return Symbol(out for s in symbols for out in _check(s, "group", multi=True)._outs)


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


def _check(x, where, multi=False):
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
    ins = [None if x is None else _check(x, f"{op_type} input {k}") for k, x in enumerate(inputs)]
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
    onnx_schema = _onnx_schema(op_type)
    unknown = sorted(set(attrs) - set(static) - set(onnx_schema.attributes if onnx_schema else attrs))
    if unknown:
        known = sorted({*static, *onnx_schema.attributes})
        raise TypeError(f"{op_type} has no attribute {', '.join(unknown)}; it takes {', '.join(known) or 'none'}")
    like = next((x.dtype for x in ins if x is not None), np.dtype(np.float32))
    attrs = {k: np.asarray(v, _static_dtype(op_type, static[k], like)).tolist() if k in static else _canon(k, v)
             for k, v in attrs.items()}
    out_dtypes = _out_dtypes(op_type, ins, attrs, num_outputs)
    node = _Op("op", op_type, tuple(ins), attrs, name,
               {str(k): _meta_str(v) for k, v in {**_ANNOTATIONS.get(), **(meta or {})}.items()},
               out_dtypes, _ranks(op_type, ins, attrs, num_outputs))
    outs = tuple(Symbol(((node, k),)) for k in range(num_outputs))
    return outs[0] if num_outputs == 1 else outs


def _onnx_schema(op_type):
    try:
        return onnx.defs.get_schema(op_type, MAX_OPSET)
    except onnx.defs.SchemaError:
        return None


def _static_dtype(op_type, index, like):
    """Dtype of the ONNX input at `index` holding a static argument: the data's, or int64/float32/bool."""
    s = _onnx_schema(op_type)
    if s is None:
        return like
    formal = s.inputs[min(index, len(s.inputs) - 1)]
    if index and formal.type_str == s.inputs[0].type_str:
        return like
    allowed = next((c.allowed_type_strs for c in s.type_constraints if c.type_param_str == formal.type_str),
                   [formal.type_str])
    return next((np.dtype(d) for t, d in _STATIC_TYPES if t in allowed), like)


def _canon(key, value):
    """An attribute as the ONNX frontend reads it back."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return [_canon(key, v) for v in value]
    if isinstance(value, (bool, int, np.bool_, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(np.float32(value))
    if isinstance(value, str):
        return value
    raise TypeError(f"attribute {key}: {value!r} is not a number, str, list of them or NumPy array")


def _out_dtypes(op_type, ins, attrs, n):
    like = next((x.dtype for x in ins if x is not None), np.dtype(np.float32))
    if op_type in _BOOL_OUT:
        first = np.bool_
    elif op_type in _INT64_OUT:
        first = np.int64
    elif op_type == "Cast":
        first = dtypes.from_onnx(attrs["to"])
    elif op_type in ("Where", "CastLike"):
        first = ins[1].dtype
    elif "dtype" in attrs:
        first = dtypes.from_onnx(attrs["dtype"])
    elif op_type == "ConstantOfShape":
        first = attrs.get("value", np.zeros(1, np.float32)).dtype
    else:
        first = like
    return (np.dtype(first),) + (np.dtype(_LATER_OUT.get(op_type, first)),) * (n - 1)


def _ranks(op_type, ins, attrs, n):
    """Output ranks where one rule tells them (None: unknown); used to pick Gemm in `dense`."""
    r = [None if x is None else x.ndim for x in ins]
    r0 = r[0] if r else None
    axes = len(attrs["axes"]) if isinstance(attrs.get("axes"), list) else None
    rank = None
    if op_type in _BROADCAST and None not in r:
        rank = max(r)
    elif op_type in ("Gemm", "Flatten"):
        rank = 2
    elif op_type == "Reshape" and "shape" in attrs:
        rank = len(attrs["shape"])
    elif op_type == "MatMul" and None not in r and min(r) >= 2:
        rank = max(r)
    elif r0 is not None and axes is not None and op_type == "Unsqueeze":
        rank = r0 + axes
    elif r0 is not None and axes is not None and (op_type == "Squeeze" or (
            op_type.startswith("Reduce") and not attrs.get("keepdims", 1))):
        rank = r0 - axes
    elif op_type in _KEEP_RANK or (op_type.startswith("Reduce") and attrs.get("keepdims", 1)):
        rank = r0
    return (rank,) * n if op_type in ("Split", "TopK") else (rank,) + (None,) * (n - 1)


def _binary(op_type, a, b):
    """A binary op; a Python or NumPy scalar (or array) becomes a constant of the other operand's dtype."""
    if not all(isinstance(v, (Symbol, *_NUMBERS)) for v in (a, b)):
        return NotImplemented
    return op(op_type, _promote(a, b), _promote(b, a))



def _promote(value, like):
    """`value` itself when a Symbol, else a constant of `like`'s dtype (a TypeError if that changes it)."""
    if isinstance(value, Symbol):
        return value
    if not isinstance(value, _NUMBERS):
        raise TypeError(f"expected a Symbol or a number, got {type(value).__name__}")
    dtype = _check(like, "a number's partner").dtype
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
        for attr, i, since in ops.of(node).attr_inputs:
            if attr in attrs and opset >= since:
                name = _fresh(f"{node.name}.{attr}", taken)
                like = dts[inputs[0]] if inputs and inputs[0] else np.dtype(np.float32)
                constant(name, np.asarray(attrs.pop(attr), _static_dtype(node.op, i, like)))
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


# ---- op functions ----

def _pair(v):
    return [int(v)] * 2 if isinstance(v, (int, np.integer)) else list(v)


def _pads(pad):
    """ONNX pads (begins then ends) from an int, (ph, pw) or (top, left, bottom, right)."""
    pad = _pair(pad)
    return pad * 2 if len(pad) == 2 else pad


def _parts(name, meta):
    """Keywords for the inner nodes of a composite op: named NAME/PART when the op is named."""
    return lambda part: {"name": name and f"{name}/{part}", "meta": meta}


def conv2d(x, weight, bias=None, stride=1, pad=0, dilation=1, groups=1, **kw):
    """2-D convolution (Conv); weight (out, in/groups, kh, kw); pad an int, (ph, pw) or 4 values."""
    return op("Conv", x, weight, bias, strides=_pair(stride), pads=_pads(pad), dilations=_pair(dilation),
              group=groups, **kw)


def conv2d_transpose(x, weight, bias=None, stride=1, pad=0, output_padding=0, dilation=1, groups=1, **kw):
    """2-D transposed convolution (ConvTranspose); weight (in, out/groups, kh, kw)."""
    return op("ConvTranspose", x, weight, bias, strides=_pair(stride), pads=_pads(pad),
              output_padding=_pair(output_padding), dilations=_pair(dilation), group=groups, **kw)


def dense(x, weight, bias=None, name=None, meta=None):
    """Fully connected with weight (out, in): Gemm(transB=1) for 2-D x, else MatMul(x, weight^T) (+ bias)."""
    if _check(x, "dense").ndim == 2:
        return op("Gemm", x, weight, bias, transB=1, name=name, meta=meta)
    part = _parts(name, meta)
    y = op("MatMul", x, transpose(weight, (1, 0), **part("weight_t")),
           **(part("matmul") if bias is not None else {"name": name, "meta": meta}))
    return y if bias is None else op("Add", y, bias, name=name, meta=meta)


def batch_norm(x, gamma, beta, mean, var, eps=1e-5, momentum=0.9, training=False, **kw):
    """BatchNormalization; training=True returns (y, running_mean, running_var)."""
    return op("BatchNormalization", x, gamma, beta, mean, var, epsilon=eps, momentum=momentum,
              training_mode=1 if training else None, num_outputs=3 if training else 1, **kw)


def layer_norm(x, gamma, beta=None, axis=-1, eps=1e-5, **kw):
    """LayerNormalization over the dims from `axis` on."""
    return op("LayerNormalization", x, gamma, beta, axis=axis, epsilon=eps, **kw)


def _unary(op_type):
    def f(x, **kw):
        return op(op_type, x, **kw)
    f.__name__ = f.__qualname__ = "".join("_" + c.lower() if c.isupper() else c for c in op_type).lstrip("_")
    f.__doc__ = f"Elementwise {op_type}."
    return f


relu, sigmoid, tanh, sqrt, exp, log, abs, neg, erf, reciprocal, floor, ceil, identity = map(_unary, (
    "Relu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Log", "Abs", "Neg", "Erf", "Reciprocal", "Floor", "Ceil",
    "Identity"))


def leaky_relu(x, alpha=0.01, **kw):
    return op("LeakyRelu", x, alpha=alpha, **kw)


def gelu(x, name=None, meta=None):
    """Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), from Mul, Erf and Add (ONNX has Gelu from opset 20)."""
    part = _parts(name, meta)
    x = _check(x, "gelu")
    scaled = op("Mul", x, _promote(math.sqrt(0.5), x), **part("scale"))
    cdf = op("Add", op("Erf", scaled, **part("erf")), _promote(1, x), **part("add"))
    return op("Mul", op("Mul", x, cdf, **part("mul")), _promote(0.5, x), name=name, meta=meta)


def clip(x, min=None, max=None, **kw):
    """Clip to [min, max]; either bound may be left out."""
    return op("Clip", x, min=min, max=max, **kw)


def softmax(x, axis=-1, **kw):
    return op("Softmax", x, axis=axis, **kw)


def log_softmax(x, axis=-1, **kw):
    return op("LogSoftmax", x, axis=axis, **kw)


def pooling(x, kind="max", kernel=None, stride=1, pad=0, **kw):
    """Pooling: kind "max" or "avg" with `kernel` (int or pair), or "global_avg"/"global_max"."""
    if kind in ("global_avg", "global_max"):
        return op("GlobalAveragePool" if kind == "global_avg" else "GlobalMaxPool", x, **kw)
    if kind not in ("max", "avg"):
        raise ValueError(f"pooling: kind must be 'max', 'avg', 'global_avg' or 'global_max', not {kind!r}")
    if kernel is None:
        raise TypeError(f"pooling: kind {kind!r} needs a kernel")
    return op("MaxPool" if kind == "max" else "AveragePool", x, kernel_shape=_pair(kernel),
              strides=_pair(stride), pads=_pads(pad), **kw)


def concat(*xs, axis=1, **kw):
    return op("Concat", *xs, axis=axis, **kw)


def split(x, sections, axis=0, **kw):
    """Split into `sections` equal parts (an int) or parts of the given sizes (a list); a tuple of Symbols."""
    sizes = None if isinstance(sections, (int, np.integer)) else list(sections)
    outs = op("Split", x, axis=axis, split=sizes, num_outputs=int(sections) if sizes is None else len(sizes),
              **kw)
    return outs if isinstance(outs, tuple) else (outs,)


def reshape(x, shape, **kw):
    """Reshape to `shape` (0 copies the input's dim, -1 is inferred)."""
    return op("Reshape", x, shape=list(shape), **kw)


def flatten(x, axis=1, **kw):
    return op("Flatten", x, axis=axis, **kw)


def transpose(x, perm=None, **kw):
    return op("Transpose", x, perm=perm, **kw)


def slice(x, starts, ends, axes=None, steps=None, **kw):
    return op("Slice", x, starts=list(starts), ends=list(ends), axes=axes and list(axes),
              steps=steps and list(steps), **kw)


def squeeze(x, axes=None, **kw):
    return op("Squeeze", x, axes=axes and list(axes), **kw)


def unsqueeze(x, axes, **kw):
    return op("Unsqueeze", x, axes=list(axes), **kw)


def expand(x, shape, **kw):
    """Broadcast to `shape` (a static shape)."""
    return op("Expand", x, const(np.array(shape, np.int64)), **kw)


def pad(x, pads, mode="constant", value=0.0, **kw):
    """Pad with ONNX `pads` (all begins, then all ends); `value` fills in "constant" mode."""
    return op("Pad", x, pads=list(pads), mode=mode, constant_value=value if mode == "constant" else None, **kw)


def resize(x, scales=None, sizes=None, mode="nearest", **kw):
    """Resize by per-dim `scales` or to `sizes`."""
    return op("Resize", x, scales=scales and list(scales), sizes=sizes and list(sizes), mode=mode, **kw)


def gather(x, indices, axis=0, **kw):
    return op("Gather", x, indices, axis=axis, **kw)


def where(cond, x, y, **kw):
    """x where cond, else y; a scalar x or y becomes a constant of the other's dtype."""
    return op("Where", cond, _promote(x, y), _promote(y, x), **kw)


def cast(x, dtype, **kw):
    return op("Cast", x, to=dtypes.to_onnx(dtype), **kw)


def matmul(a, b, **kw):
    return op("MatMul", a, b, **kw)


def _reduce(op_type):
    def f(x, axes=None, keepdims=True, **kw):
        return op(op_type, x, axes=axes and list(axes), keepdims=keepdims, **kw)
    f.__name__ = f.__qualname__ = "reduce_" + op_type[len("Reduce"):].lower()
    f.__doc__ = f"{op_type} over `axes` (all when None)."
    return f


reduce_mean, reduce_sum, reduce_max, reduce_min = map(_reduce, ("ReduceMean", "ReduceSum", "ReduceMax",
                                                                  "ReduceMin"))


def dropout(x, ratio=0.5, training=False, mask=False, **kw):
    """Dropout; mask=True returns (y, mask)."""
    return op("Dropout", x, ratio=ratio, training_mode=True if training else None,
              num_outputs=2 if mask else 1, **kw)
