"""ONNX (a file path or a ModelProto) -> Graph, with dims not bound yet."""
import math
import os
import re
from functools import partial

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto, checker, external_data_helper, helper, numpy_helper

from planner import dtypes
from planner.deferred import Absent, Deferred
from planner.errors import ModelError, say
from planner.ir import DEFAULT_OPSETS, Annotations, Graph, Node, Tensor, captured

from .onnx_upgrade import OLDEST, upgrade

META = "memplan."
"""Prefix of the node metadata_props keys that carry the user's annotations (ir.HINTS)."""
TORCH_SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
TORCH_INPUT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
WEIGHT_INPUTS = {"PARAMETER": "param", "BUFFER": "const", "CONSTANT_TENSOR": "const"}
"""The kinds of graph input torch.onnx writes for a module's state when it saves an export without its
initializers (`keep_initializers_as_inputs=True`), and what memplan plans them as: weights without values."""
DEFERRED_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64}
DEFERRED_BYTES = 1 << 16
"""Float initializers of this many bytes or more are read when needed (planner.deferred); smaller ones,
and the rest, when the model is."""
MIN_OPSET = 11
"""The oldest opset read as it is; models of opsets OLDEST to 10 are upgraded to it by onnx's version converter,
whose last step (10 to 11) only moves Clip's and Pad's attributes into inputs, renames Scatter and gives Resize its
roi (onnx_upgrade gives it its coordinates back). A newer target would take more rewrites of the converter's
(Softmax at 13, axes as inputs) for nothing: memplan reads opset 11's forms as it reads the newer ones."""
MAX_OPSET = onnx.defs.onnx_opset_version()
READS = (f"memplan reads opsets {MIN_OPSET} to {MAX_OPSET}, and {OLDEST} to {MIN_OPSET - 1} through onnx's "
         "version converter")


def read(model, weights=True):
    """A path or ModelProto -> Graph. External data is read from beside the model file only, and not at all
    with `weights` False. Weights without values (see _absent_weights) are planned as planner.deferred.Absent."""
    base_dir = None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise ModelError(f"no such model file: {path}")
        try:
            model = onnx.load(path, load_external_data=False)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise ModelError(f"{path} is not a readable ONNX model ({type(e).__name__}: {e})") from None
        base_dir = os.path.dirname(os.path.abspath(path))
    elif not isinstance(model, onnx.ModelProto):
        raise ModelError(f"expected an ONNX file path or onnx.ModelProto, got {type(model).__name__}")
    if not model.HasField("graph") or not model.graph.output:
        raise ModelError("the model has no graph or no graph outputs (not an ONNX model, or a truncated file)")
    version = _default_opset(model)
    if not OLDEST <= version <= MAX_OPSET:
        raise ModelError(f"opset {version} is not supported ({READS})")
    _check_nodes(model, version)
    stored = {t.name: t for t in model.graph.initializer}
    if version < MIN_OPSET:
        model = _upgraded(model, version)
    return _graph(model.graph, _opsets(model), base_dir, stored, weights)


def _upgraded(model, version):
    """The model of an older opset at MIN_OPSET (onnx_upgrade: its initializers are placeholders), its nodes checked
    again there; one line when the converter cannot."""
    try:
        model = upgrade(model, version, MIN_OPSET)
        _check_nodes(model, MIN_OPSET)
    except ModelError as e:
        raise ModelError(f"opset {version} cannot be upgraded to opset {MIN_OPSET} by onnx's version converter: {e} "
                         f"({READS})") from None
    return model


def _check_nodes(model, opset):
    """Every node of the default domain against its ONNX schema at the model's opset (onnx.checker):
    its input and output counts, attribute names and types. Ops ONNX lacks meet ops.check_supported,
    which lists them all."""
    ctx = checker.C.CheckerContext()
    ctx.ir_version = max(model.ir_version, 3)
    ctx.opset_imports = {"": opset}
    scope = checker.C.LexicalScopeContext()
    for i, node in _checked(model.graph.node):
        try:
            checker.check_node(node, ctx, scope)
        except checker.ValidationError as e:
            why = re.sub(r"^Node (with schema\(.*?\) |\(.*?\)'s )", "", str(e).split("\n", 1)[0].strip())
            raise ModelError(f"node {node.name or f'{node.op_type}_{i}'!r} ({node.op_type}) is not valid ONNX at "
                             f"opset {opset}: {why}") from None


def _checked(nodes):
    """(index, node) of the default-domain nodes the checker can take alone: a node holding subgraphs
    reads names of the scope around it, which the checker cannot be given, so its subgraphs' nodes are
    checked instead."""
    for i, node in enumerate(nodes):
        graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
        if graphs:
            yield from (found for g in graphs for found in _checked(g.node))
        elif not _domain(node.domain) and onnx.defs.has(node.op_type):
            yield i, node


def _domain(name):
    """A domain as the IR names it: "" for ONNX's default domain, however the file spells it."""
    return "" if name == "ai.onnx" else name


def _default_opset(model):
    version = next((o.version for o in model.opset_import if not _domain(o.domain)), None)
    if version is None:
        raise ModelError("the model imports no version of the default ONNX domain")
    return version


def _opsets(model):
    """{domain: version} the model imports, with memplan's own domain (for the nodes training adds)."""
    return {**DEFAULT_OPSETS, **{_domain(o.domain): o.version for o in model.opset_import}}


def _graph(g, opsets, base_dir, stored=None, read_weights=True):
    """A GraphProto -> Graph; `stored` by name stand for the graph's initializers of those names (an upgraded
    model's placeholders); with `read_weights` False, external data is not read."""
    tensors = {}
    for init in g.initializer:
        tensors[init.name] = _param((stored or {}).get(init.name, init), base_dir, read_weights)
    if g.sparse_initializer:
        raise ModelError("sparse initializers are not supported")
    declared = {}
    for vi in (*g.input, *g.value_info, *g.output):  # a name declared twice keeps what it first said
        shape, dtype = _value_info(vi)
        first = declared.get(vi.name, (None, None))
        declared[vi.name] = (shape if first[0] is None else first[0], dtype if first[1] is None else first[1])
    tensors.update(_absent_weights(g, tensors, declared))
    inputs = tuple(vi.name for vi in g.input if vi.name not in tensors)
    outputs = tuple(vi.name for vi in g.output)
    for name in inputs:
        tensors[name] = Tensor(name, *declared[name], "input")
    nodes, names = [], set()
    for i, proto in enumerate(g.node):
        if proto.op_type == "Constant":
            name = proto.output[0]
            if name in tensors:
                raise ModelError(f"tensors written more than once: {name}")
            value = _constant_value(proto, base_dir)
            tensors[name] = Tensor(name, value.shape, value.dtype, "const", value)
            continue
        name = proto.name if proto.name and proto.name not in names else f"{proto.op_type}_{i}"
        names.add(name)
        attrs = {a.name: _attribute(a, base_dir, opsets) for a in proto.attribute}
        subgraphs = [v for v in attrs.values() if isinstance(v, Graph)]
        reads = (*proto.input, *captured(*subgraphs)) if subgraphs else tuple(proto.input)
        notes = Annotations.from_metadata({p.key[len(META):]: p.value for p in proto.metadata_props
                                           if p.key.startswith(META)}, f"node {name!r}")
        node = Node(proto.op_type, reads, tuple(proto.output), attrs, name, notes, _domain(proto.domain))
        if not node.domain and node.op in ("Softmax", "LogSoftmax") and opsets[""] < 13:
            nodes.extend(_legacy_softmax(node, tensors))
        else:
            nodes.append(node)
        for out in proto.output:
            if out and out not in tensors:
                kind = "output" if out in outputs else "activation"
                tensors[out] = Tensor(out, *declared.get(out, (None, None)), kind)
    for node in nodes:
        for name in node.inputs:
            if name and name not in tensors:
                tensors[name] = Tensor(name, *declared.get(name, (None, None)), "activation")
    return Graph(tuple(nodes), tensors, inputs, outputs, g.name or "graph", opsets,
                 exported_params=_exported_params(g), buffers=_buffers(g, tensors))


def _exported_params(g):
    """The number of nn.Parameters in the torch.export signature torch.onnx (dynamo) writes into the
    graph's metadata, or None when the file has none."""
    signature = {p.key: p.value for p in g.metadata_props}.get(TORCH_SIGNATURE)
    return None if signature is None else len(re.findall(r": PARAMETER target=", signature))


def _buffers(g, tensors):
    """The names the torch.export signature lists as the module's buffers and constant tensors (rotary
    tables, masks): state that an initializer of that name holds, but that does not train. Where the file marks
    its nn.Parameters as inputs (WEIGHT_INPUTS), every other initializer too: a constant of the module's code
    (a `torch.ones` norm scale) that the exporter's optimizer made one."""
    signature = {p.key: p.value for p in g.metadata_props}.get(TORCH_SIGNATURE) or ""
    named = set(re.findall(r": (?:BUFFER|CONSTANT_TENSOR) target='([^']*)'", signature))
    if any(_input_kind(vi) == "PARAMETER" for vi in g.input):
        named.update(init.name for init in g.initializer)
    return frozenset(named)


def _input_kind(vi):
    """The kind of module state torch.onnx marks a graph input as (PARAMETER, BUFFER, ...), or None."""
    return {p.key: p.value for p in vi.metadata_props}.get(TORCH_INPUT_KIND)


def _legacy_softmax(node, tensors):
    """Softmax before opset 13 normalises over all dims from `axis` on: Flatten, softmax, Reshape back."""
    x, y = node.inputs[0], node.outputs[0]
    flat, soft, shape = (f"{node.name}/{part}" for part in ("flat", "softmax", "shape"))
    for name in (flat, soft, shape):
        tensors[name] = Tensor(name, None, None, "activation")
    return [Node("Flatten", (x,), (flat,), {"axis": node.attrs.get("axis", 1)}, f"{node.name}/flatten", node.notes),
            Node(node.op, (flat,), (soft,), {"axis": -1}, node.name, node.notes),
            Node("Shape", (x,), (shape,), {}, f"{node.name}/shape", node.notes),
            Node("Reshape", (soft, shape), (y,), {}, f"{node.name}/reshape", node.notes)]


def _value_info(vi):
    """(shape, dtype) of a declared value: dims are ints, dim names, or None when unknown."""
    if vi.type.WhichOneof("value") is None:  # a subgraph's value of no declared type
        return None, None
    if vi.type.WhichOneof("value") != "tensor_type":
        raise ModelError(f"value {vi.name!r} is a {vi.type.WhichOneof('value')}, only tensors are supported")
    t = vi.type.tensor_type
    dtype = dtypes.from_onnx(t.elem_type) if t.elem_type else None
    if not t.HasField("shape"):
        return None, dtype
    shape = tuple(_dim(d) for d in t.shape.dim)
    return shape, dtype


def _dim(d):
    """An int, a dim name shared between values, or None (unknown: no value, "?", or a negative value)."""
    if d.HasField("dim_value"):
        return d.dim_value if d.dim_value >= 0 else None
    return d.dim_param if d.dim_param and d.dim_param != "?" else None


def _absent_weights(g, tensors, declared):
    """{name: Tensor} of the graph inputs torch.onnx marks as a module's parameters or buffers (WEIGHT_INPUTS):
    weights whose values the file does not hold, each of the type and shape it declares."""
    found = {}
    for vi in g.input:
        kind = WEIGHT_INPUTS.get(_input_kind(vi))
        if kind is None or vi.name in tensors:
            continue
        shape, dtype = declared[vi.name]
        if dtype is None or shape is None or not all(isinstance(d, int) for d in shape):
            raise ModelError(f"input {vi.name!r} is a weight of the exported module, but declares no static shape "
                             f"and type ({_show(shape)} {dtype}): memplan plans a module's weights as they are")
        found[vi.name] = Tensor(vi.name, shape, dtype, kind, Absent(vi.name, shape, dtype))
    return found


def _show(shape):
    return "no shape" if shape is None else "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _param(init, base_dir, read_weights=True):
    """The param of an initializer: one without values (no data, or float external data not to be read) as an Absent;
    one of DEFERRED_TYPES of DEFERRED_BYTES or more as a Deferred (read when needed); the others read now."""
    dtype, shape = DEFERRED_TYPES.get(init.data_type), tuple(init.dims)
    external = external_data_helper.uses_external_data(init)
    if (external and not read_weights and dtype is not None) or (
            not external and not _holds_values(init) and math.prod(shape) > 0):
        absent = dtypes.from_onnx(init.data_type)
        return Tensor(init.name, shape, absent, "param", Absent(init.name, shape, absent))
    if dtype is not None and math.prod(shape) * np.dtype(dtype).itemsize >= DEFERRED_BYTES:
        data = Deferred(_reader(init, base_dir, shape, np.dtype(dtype)), shape, dtype)
    else:
        data = _array(init, base_dir)
    return Tensor(init.name, data.shape, data.dtype, "param", data)


def _holds_values(init):
    """Whether a TensorProto holds its values in itself (raw bytes or one of its typed fields), asked without
    copying them."""
    return init.HasField("raw_data") or any(len(getattr(init, f)) for f in (
        "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data"))


def _reader(tensor, base_dir, shape, dtype):
    """A function reading `tensor`'s values: from the TensorProto, or from its external data file, checked
    now to hold them."""
    if not external_data_helper.uses_external_data(tensor):
        return partial(_decoded, tensor)
    path, info = _external(tensor, base_dir)
    nbytes = math.prod(shape) * dtype.itemsize
    try:
        offset, length = int(info.get("offset") or 0), int(info.get("length") or nbytes)
        size = os.path.getsize(path)
        if offset < 0:
            raise ValueError("offset must be non-negative")
        if offset > size:
            raise ValueError(f"offset ({offset}) exceeds file size ({size})")
        if offset + length > size:
            raise ValueError(f"length ({length}) exceeds available data ({size - offset} bytes)")
        if length != nbytes:
            raise ValueError(f"it holds {length} bytes, where a {'x'.join(map(str, shape))} {dtype} takes {nbytes}")
    except ValueError as e:
        raise ModelError(f"initializer {tensor.name!r}: external data in {info.get('location')!r} cannot be read "
                         f"({e})") from None
    return partial(_read_file, path, offset, shape, dtype)


def _read_file(path, offset, shape, dtype):
    return np.fromfile(path, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)


def _decoded(tensor):
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as e:
        raise ModelError(f"initializer {tensor.name!r} cannot be read ({e}); the file may be truncated") from None


def _array(tensor, base_dir):
    if external_data_helper.uses_external_data(tensor):
        _load_external(tensor, base_dir)
    return _decoded(tensor)


def _external(tensor, base_dir):
    """The path of a tensor's external data file and its external_data entries, refusing any location
    outside the model's directory."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise ModelError(f"initializer {tensor.name!r} keeps its data in {location!r}; "
                         "load the model from its file path so the data can be found")
    if "\0" in location:
        raise ModelError(f"initializer {tensor.name!r}: external data location {location!r} holds a NUL byte")
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.isabs(location) or os.path.commonpath([root, path]) != root:
        raise ModelError(f"initializer {tensor.name!r}: external data location {location!r} "
                         "points outside the model's directory; refusing to read it")
    if not os.path.isfile(path):
        raise ModelError(f"initializer {tensor.name!r}: external data file {location!r} is missing (to plan the "
                         f"model from its weights' shapes alone, {say('weights=False', '--no-weights')})")
    return path, info


def _load_external(tensor, base_dir):
    """Read a tensor's external data into it (see _external)."""
    _, info = _external(tensor, base_dir)
    try:
        external_data_helper.load_external_data_for_tensor(tensor, os.path.realpath(base_dir))
    except (ValueError, OSError) as e:
        raise ModelError(f"initializer {tensor.name!r}: external data in {info.get('location')!r} cannot be read "
                         f"({e.strerror if isinstance(e, OSError) else e})") from None
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def _constant_value(proto, base_dir):
    attr = proto.attribute[0] if len(proto.attribute) == 1 else None
    if attr is None:
        raise ModelError(f"Constant node {proto.name or proto.output[0]!r} must have exactly one attribute")
    value = _attribute(attr, base_dir)
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
    if attr.name in kinds:
        return np.asarray(value, dtype=kinds[attr.name])
    if attr.name == "value":
        return value
    raise ModelError(f"Constant node {proto.name or proto.output[0]!r}: attribute {attr.name!r} is not supported")


def _attribute(attr, base_dir, opsets=None):
    """An attribute as plain Python: numbers, str, lists of them, a NumPy array for tensors, a Graph for
    a subgraph (the body of an If, Loop or Scan)."""
    if attr.type == AttributeProto.TENSOR:
        return _array(attr.t, base_dir)
    if attr.type == AttributeProto.GRAPH and opsets is not None:
        return _graph(attr.g, opsets, base_dir)
    if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR):
        raise ModelError(f"attribute {attr.name!r}: lists of subgraphs and sparse attributes are not supported")
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value
