"""Static-shape inference: bind the inputs, give every tensor a concrete shape and dtype,
fold the shape arithmetic exporters emit (Shape -> Gather -> Concat -> Reshape) into
constants, and drop what no output needs.
"""
import math
from collections import deque
from dataclasses import replace

import numpy as np

from . import ops, reference
from .deferred import Absent
from .dtypes import is_float
from .errors import ModelError, ShapeError, UnsupportedOpError, say
from .ir import Tensor, check_size, op_name, validate
from .onnx_types import check_types
from .ops import Info
from .ops.control_flow import check_unrolled
from .ops.detection import LENGTH

FOLD_LIMIT = 1 << 16
"""Largest number of elements a folded constant may have; bigger results are computed when run."""


def infer(graph, input_shapes=None, pruned=True):
    """Return a new Graph where every tensor has a concrete shape and dtype (and, unless `pruned` is
    False, without what no output needs: see `prune`)."""
    typed = _infer(graph, input_shapes or {})
    return prune(typed) if pruned else typed


def retype(graph, typed):
    """`graph`, a rewrite of the typed graph `typed`, typed exactly as `infer` types it, inferring only
    what the rewrite changed: a node of `typed` (or one of its name, op, attrs and outputs reading other
    tensors of the same types) whose inputs kept their types, not all of them known values, keeps its
    outputs' types; new and changed nodes, and the nodes reading what changed type, are inferred.
    Constants fold and what no output needs is pruned, as in `infer`."""
    return prune(_infer(graph, {}, typed))


def _infer(graph, input_shapes, previous=None):
    """infer, reusing the typed outputs of the nodes of the typed graph `previous` (see retype). Control
    flow is inlined as it is met; an op with no schema folds through ONNX's reference evaluator when its
    inputs are constants, and is refused (all of them listed) when it would remain in the plan."""
    graph = validate(graph)
    infos, dims = _bind_inputs(graph, input_shapes)
    tensors = dict(graph.tensors)
    nodes, folded, changed, missing, unread, lengths = [], {}, set(), [], [], []
    unrolled = 0  # nodes control flow added so far
    kept = {*graph.outputs, *(new for new, _ in graph.updates)}
    earlier = {}
    if previous is not None:  # its nodes by name; params and state the rewrite retyped (ZeRO-3's shards)
        earlier = {node.name: node for node in previous.nodes}
        changed.update(name for name, info in infos.items() if name in previous.tensors and
                       (info.shape, info.dtype) != (previous.tensors[name].shape, previous.tensors[name].dtype))
    todo = deque(graph.nodes)
    while todo:
        node = todo.popleft()
        old = earlier.get(node.name)
        if old is not None and _reusable(node, graph, infos, old, previous, changed):
            infos.update((out, Info(graph.tensors[out].shape, graph.tensors[out].dtype)) for out in node.outputs if out)
            nodes.append(node)
            continue
        schema = _schema(node, graph.opsets)
        if schema is None or any(i and i not in infos for i in node.inputs):
            values = _reference(node, infos, graph.opsets, kept)
            if values is None:
                (missing if schema is None else unread).append(node)
                continue
            outs = [(v.shape, v.dtype) if v is not None else None for v in values]
        else:
            if getattr(schema, "expand", None):
                inlined, made = _expanded(schema, node, infos, graph.opsets, unrolled)
                unrolled += len(inlined)
                tensors.update(made)
                infos.update((t.name, _source_info(t)) for t in made.values() if t.kind in ("param", "const"))
                todo.extendleft(reversed(inlined))
                continue
            if getattr(schema, "bounded", False) and len(node.outputs) == 1:
                node = _with_length(node, graph, tensors, lengths)
            node, outs, values = _typed(schema, node, graph, tensors, infos)
        for k, out in enumerate(node.outputs):
            if out:
                value = None if values is None else np.asarray(values[k], dtype=outs[k][1]).reshape(outs[k][0])
                infos[out] = Info(*outs[k], value)
                before = previous.tensors.get(out) if previous is not None else None
                if before and (before.shape, before.dtype) != outs[k]:
                    changed.add(out)
        if values is not None and not set(node.outputs) & kept:
            folded.update((out, infos[out].value) for out in node.outputs if out)
        else:
            nodes.append(node)
    if missing:
        raise UnsupportedOpError([op_name(n.domain, n.op) for n in missing], ops.REASONS)
    if unread:
        node = unread[0]
        raise ModelError(f"node {node.name!r} ({op_name(node.domain, node.op)}) reads "
                         f"{', '.join(repr(i) for i in node.inputs if i and i not in infos)} before any node computes it")
    typed = {}
    for name, t in tensors.items():
        if name in folded:
            typed[name] = Tensor(name, infos[name].shape, infos[name].dtype, "const", folded[name])
        elif name in infos and (t.shape, t.dtype) == (infos[name].shape, infos[name].dtype):  # as declared
            typed[name] = t
        elif name in infos:
            bounded = t.shape and name + LENGTH in lengths  # declared with its real length, planned at the bound
            _check_declared(replace(t, shape=(None, *t.shape[1:])) if bounded else t, infos[name], dims)
            typed[name] = replace(t, shape=infos[name].shape, dtype=infos[name].dtype)
    return replace(graph, nodes=tuple(nodes), tensors=typed, outputs=(*graph.outputs, *lengths))


def _with_length(node, graph, tensors, lengths):
    """A node whose output is planned at its bound (NonMaxSuppression), given a second output holding
    the rows that are real, which becomes a graph output. Only a graph output may be bounded so: a
    reader would take the padding rows for data."""
    out = node.outputs[0]
    readers = [n.name for n in graph.nodes if out in n.inputs]
    if readers:
        raise ShapeError(f"node {node.name!r} ({node.op}): its output {out!r} has a length that depends on the "
                         f"data, read by node {readers[0]!r}; memplan plans it at its bound (the rows past the "
                         "real ones -1) only where it is a graph output")
    length = out + LENGTH
    tensors[length] = Tensor(length, None, None, "output")
    lengths.append(length)
    return replace(node, outputs=(out, length))


def _typed(schema, node, graph, tensors, infos):
    """(node with its static inputs moved into attrs, its outputs' (shape, dtype), their values when
    they fold or None), the shape rule's errors named by the node."""
    try:
        check_types(node, [infos[i] if i else None for i in node.inputs], graph.opset, schema, graph.bfloat16)
        node = _static_attrs(schema, node, tensors, infos)
        ins = [infos[i] if i else None for i in node.inputs]
        outs = [(tuple(int(d) for d in shape), np.dtype(dtype)) for shape, dtype in schema.infer(node, ins)]
        for out, (shape, dtype) in zip(node.outputs, outs):
            check_size(f"output {out!r}", shape, dtype)
    except ShapeError as e:
        raise ShapeError(f"node {node.name!r} ({op_name(node.domain, node.op)}): {e}") from None
    if len(outs) < len(node.outputs):
        raise ShapeError(f"node {node.name!r} ({op_name(node.domain, node.op)}) has {len(node.outputs)} outputs, "
                         f"the op makes {len(outs)}")
    values = None
    if all(math.prod(shape) <= FOLD_LIMIT for shape, _ in outs):
        with np.errstate(all="ignore"):  # IEEE results (log 0 = -inf) are ONNX's too
            values = schema.fold(node, ins)
    return node, outs, values


def _expanded(schema, node, infos, opsets, unrolled):
    """The nodes and new tensors that replace a control-flow node, its errors named by the node; refused when
    they would take the nodes control flow added (`unrolled` before it) past the bound."""
    try:
        nodes, made = schema.expand(node, [infos[i] if i else None for i in node.inputs], opsets)
        check_unrolled(unrolled + len(nodes))
        return nodes, made
    except ShapeError as e:
        raise ShapeError(f"node {node.name!r} ({op_name(node.domain, node.op)}): {e}") from None


def _schema(node, opsets):
    """The schema of the node's op at the graph's opsets, or None where memplan has none."""
    try:
        return ops.of(node, opsets)
    except UnsupportedOpError:
        return None


def _reference(node, infos, opsets, kept):
    """The values of a node memplan has no schema for, when every input is a constant, no graph output
    is among its outputs and the reference computes it within FOLD_LIMIT; else None."""
    if set(node.outputs) & kept or any(i and (i not in infos or infos[i].value is None) for i in node.inputs):
        return None
    values = reference.evaluate(node, [infos[i].value if i else None for i in node.inputs], opsets)
    if values is None or any(v is not None and np.asarray(v).size > FOLD_LIMIT for v in values):
        return None
    return [None if v is None else np.asarray(v) for v in values]


def _reusable(node, graph, infos, old, typed, changed):
    """Whether `node` keeps its typed outputs, those of `old`, the node of its name in the typed graph
    `typed` (see retype). Inference may fold a node all of whose inputs are known values, so such a
    node is inferred again; an input renamed must hold no value, as the one it replaces did not."""
    if old is not node:
        if node.attrs is not old.attrs or (node.op, node.domain, node.outputs, len(node.inputs)) != \
                (old.op, old.domain, old.outputs, len(old.inputs)):
            return False
        if any(now != was and not _stands_for(now, was, infos, typed) for now, was in zip(node.inputs, old.inputs)):
            return False
    known = [infos.get(i) for i in node.inputs if i]
    return (all(info is not None for info in known) and not changed.intersection(node.inputs)
            and any(info.value is None for info in known)
            and all(graph.tensors[o].is_static for o in node.outputs if o))


def _stands_for(now, was, infos, typed):
    """Whether tensor `now`, read where the typed graph `typed` read `was`, has its type and, as it, no value."""
    if not (now and was and now in infos and infos[now].value is None and _valueless(typed.tensors[was])):
        return False
    return (infos[now].shape, infos[now].dtype) == (typed.tensors[was].shape, typed.tensors[was].dtype)


def _valueless(tensor):
    """Whether inference knew no value of a typed graph's tensor (see _source_info)."""
    return tensor.kind in ("activation", "input", "state") or (tensor.kind == "param" and
                                                                 _source_info(tensor).value is None)


def _bind_inputs(graph, input_shapes):
    """Infos of graph inputs (shapes bound from `input_shapes`, dim names shared across inputs), params and
    consts (see _source_info); and the dim names bound."""
    unknown = sorted(set(input_shapes) - set(graph.inputs))
    if unknown:
        raise ShapeError(f"input_shapes names {', '.join(map(repr, unknown))}, but the model's inputs are "
                         f"{', '.join(map(repr, graph.inputs))}")
    dims = {}
    for name, given in input_shapes.items():
        declared = graph.tensors[name].shape
        given = tuple(given)
        if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in given):
            raise ShapeError(f"input {name!r}: shape {given} must be non-negative integers")
        if declared is not None and len(declared) != len(given):
            raise ShapeError(f"input {name!r} has rank {len(declared)} (shape {_show(declared)}), "
                             f"but input_shapes gives {len(given)} dims {given}")
        for d, g in zip(declared or (), given):
            if isinstance(d, int) and d != g:
                raise ShapeError(f"input {name!r}: dimension of size {d} (shape {_show(declared)}) cannot be bound to {g}")
            if isinstance(d, str) and dims.setdefault(d, int(g)) != g:
                raise ShapeError(f"dimension {d!r} is bound to both {dims[d]} and {g} (input {name!r})")
    infos = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        if name in input_shapes:
            shape = tuple(int(g) for g in input_shapes[name])
        elif t.shape is None:
            raise ShapeError(f"input {name!r} has no declared shape; bind it with {_binding(name, (8, 3, 224, 224))}")
        else:
            shape = tuple(dims.get(d, d) if isinstance(d, str) else d for d in t.shape)
            unbound = [k for k, d in enumerate(shape) if not isinstance(d, int)]
            if unbound:
                raise ShapeError(f"input {name!r} has {_unbound(shape, unbound)} (shape {_show(t.shape)}); bind "
                                 f"{'it' if len(unbound) == 1 else 'them'} with {_binding(name, shape, unbound)}")
        if t.dtype is None:
            raise ModelError(f"input {name!r} declares no element type")
        check_size(f"input {name!r}", shape, t.dtype)
        infos[name] = Info(shape, t.dtype)
    for t in graph.tensors.values():
        if t.kind in ("param", "const"):
            infos[t.name] = _source_info(t)
        elif t.kind == "state":
            infos[t.name] = Info(t.shape, t.dtype)
    return infos, dims


def _source_info(t):
    """The Info of a param or const. Weights (float params of more than one element) carry no value, so
    what is computed from them stays in the graph, where training can update them; nor do absent ones."""
    weight = (t.kind == "param" and is_float(t.dtype) and t.data.size > 1) or isinstance(t.data, Absent)
    return Info(tuple(t.data.shape), t.data.dtype, None if weight else t.data)


def _unbound(shape, axes):
    """'unbound dimension 'batch'', 'unbound dimensions 'batch' and 'seq'', 'an unknown dimension at axis 0'."""
    names = [repr(shape[k]) for k in axes if shape[k] is not None]
    unknown = [str(k) for k in axes if shape[k] is None]
    parts = [f"unbound dimension{'s' * (len(names) > 1)} {' and '.join(names)}"] if names else []
    if len(unknown) == 1:
        parts.append(f"an unknown dimension at axis {unknown[0]}")
    elif unknown:
        parts.append(f"unknown dimensions at axes {', '.join(unknown[:-1])} and {unknown[-1]}")
    return " and ".join(parts)


def _binding(name, shape, unbound=()):
    """How to bind an input, with example sizes of its own rank (8 for a batch dim, 128 for the others):
    `--input x:8x128` on the command line, `input_shapes={'x': (8, 128)}` in Python."""
    example = [(8 if k == 0 else 128) if k in unbound else d for k, d in enumerate(shape)]
    batch = " (or --batch 8 for the first dim of every input)" if tuple(unbound) == (0,) else ""
    return say(f"input_shapes={{{name!r}: {tuple(example)}}}", f"--input {name}:{'x'.join(map(str, example))}{batch}")


def _static_attrs(schema, node, tensors, infos):
    """Move inputs that ONNX passes as tensors but planning needs as constants (axes, pads, sizes) into attrs,
    and drop trailing omitted inputs."""
    present = [(attr, i) for attr, i, _ in schema.attr_inputs if i < len(node.inputs) and node.inputs[i]]
    if not present and node.inputs[-1:] != ("",):
        return node
    attrs, inputs = dict(node.attrs), list(node.inputs)
    for attr, i in present:
        name = inputs[i]
        value = infos[name].value if infos[name].value is not None else tensors[name].data
        if value is None:
            raise ShapeError(f"input {name!r} ({attr}) must be computable from the model's constants and input "
                             "shapes, but it depends on input data")
        attrs[attr] = value.tolist()
        inputs[i] = ""
    while inputs and not inputs[-1]:
        inputs.pop()
    return replace(node, inputs=tuple(inputs), attrs=attrs)


def _check_declared(tensor, info, dims):
    """A shape or dtype the model declares must agree with the inferred one: its ints, and its dim names
    that the inputs bound."""
    if tensor.dtype is not None and tensor.dtype != info.dtype:
        raise ShapeError(f"tensor {tensor.name!r} is declared {tensor.dtype} but computes to {info.dtype}")
    if tensor.shape is None:
        return
    declared = tuple(dims.get(d, d) if isinstance(d, str) else d for d in tensor.shape)
    if len(declared) != len(info.shape) or any(isinstance(d, int) and d != s for d, s in zip(declared, info.shape)):
        raise ShapeError(f"tensor {tensor.name!r} is declared with shape {_show(tensor.shape)} "
                         f"but computes to {info.shape}")


def prune(graph):
    """Drop nodes no graph output depends on (but those whose op has an effect, memplan.Send), and tensors
    nothing reads or writes."""
    needed = set(graph.outputs) | {new for new, _ in graph.updates}
    keep = []
    for node in reversed(graph.nodes):
        if needed.intersection(node.outputs) or (node.domain == "memplan" and ops.of(node, graph.opsets).effect):
            keep.append(node)
            needed.update(i for i in node.inputs if i)
    nodes = tuple(reversed(keep))
    used = set(graph.inputs) | set(graph.outputs) | {t for pair in graph.updates for t in pair}
    used.update(x for n in nodes for x in (*n.inputs, *n.outputs) if x)
    return replace(graph, nodes=nodes, tensors={k: t for k, t in graph.tensors.items() if k in used})


def _show(shape):
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
