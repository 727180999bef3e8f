"""The element types an ONNX op accepts, from its schema's type constraints: `Not` on floats or `Add`
of float32 and float16 is a clear error before any rule or kernel meets it."""
from functools import lru_cache

import onnx
from onnx import TensorProto

from .dtypes import is_float, to_onnx
from .errors import ShapeError


@lru_cache(maxsize=None)
def _formals(op, opset):
    """[(type parameter or fixed type, allowed type strings, variadic)] of an ONNX op's inputs at
    `opset` (its newest schema when the op is newer, as for nodes memplan adds); None outside ONNX."""
    try:
        schema = onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        try:
            schema = onnx.defs.get_schema(op)
        except onnx.defs.SchemaError:
            return None
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    return [(f.type_str, allowed.get(f.type_str, frozenset([f.type_str])), f.option == variadic)
            for f in schema.inputs]


def type_string(dtype):
    """'tensor(float)' for float32: how ONNX's type constraints name a tensor of `dtype`."""
    return f"tensor({TensorProto.DataType.Name(to_onnx(dtype)).lower()})"


def _mod_on_floats(node, ins, opset):
    if opset < 28 and not node.attrs.get("fmod", 0) and any(i is not None and is_float(i.dtype) for i in ins):
        return "Mod on floats needs fmod=1 before opset 28 (which brought the floor mod of floats)"
    return None


CONDITIONS = {"Mod": _mod_on_floats}
"""Type rules an op's doc states beside its constraints: op -> check(node, ins, opset) -> why, or None."""


def _declared(schema):
    """The formals of an op outside ONNX from its schema's `types`, in `_formals`' form; None without."""
    if schema.types is None:
        return None
    params, allowed = schema.types
    return [(p, frozenset(allowed[p]), k == len(params) - 1) for k, p in enumerate(params)]


def check_types(node, ins, opset, schema, bfloat16=False):
    """Raise ShapeError unless every present input of `node` (their Info) has a type its ONNX schema
    (or, outside ONNX's default domain, its memplan `schema.types`) allows, and the inputs that share
    a type parameter share a dtype. With `bfloat16` (a graph the precision pass rewrote), bfloat16
    is taken wherever float16 is, as the newer opsets do."""
    why = CONDITIONS[node.op](node, ins, opset) if not node.domain and node.op in CONDITIONS else None
    if why:
        raise ShapeError(why)
    formals = _declared(schema) if node.domain else _formals(node.op, opset)
    if not formals:
        return
    bound = {}
    for k, (name, info) in enumerate(zip(node.inputs, ins)):
        if info is None:
            continue
        if k >= len(formals) and not formals[-1][2]:
            return
        param, allowed, _ = formals[min(k, len(formals) - 1)]
        given = type_string(info.dtype)
        if bfloat16 and given == "tensor(bfloat16)" and "tensor(float16)" in allowed:
            given = "tensor(float16)"
        if given not in allowed:
            raise ShapeError(f"input {name!r} is {info.dtype}, but {node.op} takes {_listed(allowed)} there")
        first = bound.setdefault(param, (name, info.dtype))
        if first[1] != info.dtype and len(allowed) > 1:
            raise ShapeError(f"inputs {first[0]!r} ({first[1]}) and {name!r} ({info.dtype}) must have one dtype")


def _listed(allowed):
    """'float, double or float16' from {'tensor(float)', ...}."""
    names = sorted(s[len("tensor("):-1] for s in allowed if s.startswith("tensor("))
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
