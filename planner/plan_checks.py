"""The invariants of a Plan, checked from the plan alone (`verify`), independently of the passes that made it:
aligned offsets inside the arena; no two buffers live at one step overlap in bytes; an in-place write never
lands on bytes another tensor still needs (a graph output, a pending reader, a graph input, a param or a
const); every tensor a step reads is live then; each tensor's dtype, shape and bytes agree and every name
it uses has a place. And, for a plan read from a file, that each step's op is one memplan has a schema for
and the step fits it (`check_op`), and that its op's shape rule gives the outputs the plan places
(`check_rules`), so that a kernel never meets a step it cannot read."""
import bisect
import heapq
import math
import reprlib
from functools import lru_cache

import numpy as np
import onnx

from . import ops
from .dtypes import is_float
from .errors import PlanError, UnsupportedOpError
from .ir import KINDS as GRAPH_KINDS, op_name

ALIGNMENT = 256
PERSISTENT = ("param", "const", "state", "workspace_slot")
KINDS = (*GRAPH_KINDS, "workspace", "workspace_slot")
ROLES = ("", "saved", "gradient", "update", "recomputed", "cache")
"""A transient tensor's part in a training step: a forward value that backward reads ("saved"), a
parameter's gradient, the new value of a param or state written over it ("update"), or a forward
value computed again for backward ("recomputed")."""


def verify(plan):
    """Raise PlanError naming the tensors of the first broken invariant of `plan`."""
    _check_tensors(plan)
    _check_training(plan)
    _check_names(plan)
    _check_places(plan)
    _check_overlaps(plan)
    _check_aliases(plan)
    _check_reads(plan)


def check_op(step, where):
    """Raise PlanError (after `where`) unless the step's op has a schema at its version, the step's attributes
    hold each one the op has a default for (planning fills every one in), and it has the inputs and outputs
    the op takes: by ONNX's schema where the op is ONNX's (inputs planning moved into attributes may be left
    out), else by the op's own arity."""
    name = op_name(step.domain, step.op)
    try:
        schema = ops.get(step.op, step.domain, step.version)
    except UnsupportedOpError:
        at = "" if step.version is None else f" at version {step.version}"
        raise PlanError(f"{where}: op {name}{at} is not one memplan has a schema for") from None
    missing = [k for k in schema.defaults if k not in step.attrs]
    why = f"needs attribute {missing[0]!r}, which the step lacks" if missing else _arity(schema, step)
    if why:
        raise PlanError(f"{where}: {name} {why}")


def _arity(schema, step):
    """Why the step's inputs or outputs do not fit its op (see check_op), or None."""
    formals = _formals(step.op, step.domain, step.version)
    if formals is None:
        fits = schema.arity is None or len(step.inputs) == schema.arity
        return None if fits else f"takes {schema.arity} input(s), the step gives {len(step.inputs)}"
    moved = {k for _, k, _ in schema.attr_inputs}
    bounded = int(getattr(schema, "bounded", False))  # planned at its bound, with one more output: the length
    for kind, given, formal, extra, optional in (("input", step.inputs, formals[0], 0, moved),
                                                 ("output", step.outputs, formals[1], bounded, ())):
        if not (formal and formal[-1][1] == VARIADIC) and len(given) > len(formal) + extra:
            return f"takes at most {len(formal)} {kind}(s), the step gives {len(given)}"
        for k, (what, option, least) in enumerate(formal):
            if option == SINGLE and k not in optional and not (k < len(given) and given[k]):
                return f"needs {kind} {k} ({what}), which the step leaves out"
            if option == VARIADIC and sum(1 for x in given[k:] if x) < least:
                return f"needs at least {least} {kind}(s) from {kind} {k} ({what}) on, the step gives fewer"
    return None


def check_rules(plan):
    """Raise PlanError unless each step's op, given the planned shapes and dtypes of its inputs (and the values
    of the params and consts that planning knew), gives by its shape rule the outputs the plan places: what
    planning made them."""
    for k, step in enumerate(plan.steps):
        ins = [_info(plan, name) if name else None for name in step.inputs]
        try:
            got = [(tuple(int(d) for d in shape), np.dtype(dtype)) for shape, dtype in ops.of(step).infer(step, ins)]
        except Exception as e:  # noqa: BLE001  (a hand-written step may break its op's rule in any way)
            raise PlanError(f"step {k} ({step.name!r}): {op_name(step.domain, step.op)} does not take these inputs "
                            f"({type(e).__name__}: {e})") from None
        for j, name in enumerate(step.outputs):
            t = plan.tensors[name] if name else None
            if t is not None and (j >= len(got) or got[j] != (tuple(t.shape), numpy_dtype(t))):
                made = f"gives {got[j][0]} {got[j][1]}" if j < len(got) else "gives no such output"
                raise PlanError(f"step {k} ({step.name!r}): {op_name(step.domain, step.op)} {made} for output {j} "
                                f"{name!r}, which the plan places as {tuple(t.shape)} {t.dtype}")


def _info(plan, name):
    """What a shape rule knew of tensor `name` when planning: its shape and dtype, and the value of a param or
    const other than a float weight of more than one element."""
    t, value = plan.tensors[name], plan.data.get(name)
    known = isinstance(value, np.ndarray) and value.shape == tuple(t.shape) and t.kind in ("param", "const")
    weight = t.kind == "param" and is_float(numpy_dtype(t)) and math.prod(t.shape) > 1
    return ops.Info(tuple(t.shape), numpy_dtype(t), value if known and not weight else None)


SINGLE, VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Single, onnx.defs.OpSchema.FormalParameterOption.Variadic


@lru_cache(maxsize=None)
def _formals(op, domain, version):
    """([(name, option, least)] of the inputs, the same of the outputs) of an ONNX op at `version` (its newest
    schema where the op is newer, as for the nodes memplan adds), or None where ONNX has no such op."""
    try:
        schema = onnx.defs.get_schema(op, version or onnx.defs.onnx_opset_version(), domain)
    except onnx.defs.SchemaError:
        try:
            schema = onnx.defs.get_schema(op, domain=domain)
        except onnx.defs.SchemaError:
            return None
    return tuple([(f.name, f.option, f.min_arity) for f in formal] for formal in (schema.inputs, schema.outputs))


def is_int(value):
    """Whether a JSON value is an int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def numpy_dtype(t):
    """The NumPy dtype of a tensor, or None when its dtype names no numeric or bool dtype."""
    try:
        dtype = np.dtype(t.dtype)
    except TypeError:
        return None
    return None if dtype.kind in "OSU" or dtype.fields or dtype.subdtype else dtype


def _check_tensors(plan):
    """Each tensor is filed under its name, has a known kind, role and dtype, no negative dimension or
    size, and exactly the bytes its shape and dtype make."""
    itemsizes = {}
    for name, t in plan.tensors.items():
        if t.name != name:
            raise PlanError(f"tensor {t.name!r} is filed under the name {name!r}")
        if t.kind not in KINDS or t.role not in ROLES:
            bad, choices = ("kind", KINDS) if t.kind not in KINDS else ("role", ROLES)
            raise PlanError(f"tensor {name!r}: {bad} {getattr(t, bad)!r} is not one of {choices}")
        if t.dtype not in itemsizes:
            dtype = numpy_dtype(t)
            if dtype is None:
                raise PlanError(f"tensor {name!r}: dtype {t.dtype!r} is not a numeric or bool NumPy dtype")
            itemsizes[t.dtype] = dtype.itemsize
        if any(d < 0 for d in t.shape) or t.nbytes < 0:
            raise PlanError(f"tensor {name!r}: shape {tuple(t.shape)} and nbytes {t.nbytes} must not be negative")
        if t.nbytes != math.prod(t.shape) * itemsizes[t.dtype]:
            raise PlanError(f"tensor {name!r}: nbytes {t.nbytes} differs from its shape {tuple(t.shape)} of "
                            f"{t.dtype} ({math.prod(t.shape) * itemsizes[t.dtype]} bytes)")


def _check_names(plan):
    """The graph's inputs and outputs, and the tensors a training step names, all have a place."""
    info = plan.training
    named = [("graph input", n) for n in plan.inputs] + [("graph output", n) for n in plan.outputs]
    if plan.trains:
        keys = ("loss", "lr", "step") if info.get("loss") is not None else ("lr", "step")  # (an early pipeline stage)
        named += [(f"training {key}", info.get(key)) for key in keys]
        named += [("trained param", n) for n in info.get("params", ())]
    for what, name in named:
        if not isinstance(name, str) or name not in plan.tensors:
            raise PlanError(f"{what} {reprlib.repr(name)} has no place in the plan")


def _check_training(plan):
    """A training step's info holds what the executor reads: a list of params and a numeric 'lr' argument."""
    info = plan.training
    if not plan.trains:
        return
    if not isinstance(info.get("params", ()), (list, tuple)):
        raise PlanError(f"training params must be a list of names, got {reprlib.repr(info['params'])}")
    if not (isinstance(info.get("args"), dict) and isinstance(info["args"].get("lr"), (int, float))):
        raise PlanError(f"training args {reprlib.repr(info.get('args'))} must give the learning rate 'lr' as a number")


def _span(plan, t):
    """The steps a tensor occupies its bytes: its lifetime, or every step and the return when persistent."""
    return t.lifetime if t.lifetime is not None else (0, len(plan.steps))


def _check_places(plan):
    if not is_int(plan.host_arena_bytes) or plan.host_arena_bytes < 0:
        raise PlanError(f"host_arena_bytes {plan.host_arena_bytes!r} must be an int >= 0")
    for t in plan.tensors.values():
        if t.offset % ALIGNMENT:
            raise PlanError(f"tensor {t.name!r}: offset {t.offset} is not a multiple of {ALIGNMENT}")
        size, arena = (plan.host_arena_bytes, "host arena") if t.host else (plan.arena_bytes, "arena")
        if t.offset < 0 or t.offset + t.nbytes > size:
            raise PlanError(f"tensor {t.name!r}: bytes [{t.offset}, {t.offset + t.nbytes}) fall outside the "
                            f"{arena} of {size} bytes")
        if (t.lifetime is None) != (t.kind in PERSISTENT):
            raise PlanError(f"tensor {t.name!r} ({t.kind}) has lifetime {t.lifetime}")
        if t.lifetime is not None and not 0 <= t.lifetime[0] <= t.lifetime[1] <= len(plan.steps):
            raise PlanError(f"tensor {t.name!r}: lifetime {tuple(t.lifetime)} is not within steps 0 to "
                            f"{len(plan.steps)}")
    base = plan.stats.get("persistent_bytes", 0)
    if not is_int(base) or not 0 <= base <= plan.arena_bytes:
        raise PlanError(f"stats.persistent_bytes {base!r} must be an int within the arena of {plan.arena_bytes} bytes")


def _groups(plan):
    """Root tensor -> its alias group (the root first), checking every alias points at a root."""
    groups = {}
    for t in plan.tensors.values():
        root = plan.tensors.get(t.alias_of) if t.alias_of else t
        if root is None or root.alias_of:
            raise PlanError(f"tensor {t.name!r} is an alias of {t.alias_of!r}, which is not a planned root tensor")
        if t is not root and (t.offset != root.offset or t.nbytes > root.nbytes or t.host != root.host):
            raise PlanError(f"tensor {t.name!r} lies outside the buffer of {root.name!r} that it aliases")
        groups.setdefault(root.name, []).append(t)
    return groups


def _check_overlaps(plan):
    """Sweep the steps of each arena, the device's and the host's; at each buffer's first step, compare its bytes
    with the buffers live then."""
    groups = _groups(plan)
    for host in (False, True):
        _sweep(plan, {root: members for root, members in groups.items() if plan.tensors[root].host == host})


def _sweep(plan, groups):
    buffers = []
    for root, members in groups.items():
        spans = [_span(plan, t) for t in members]
        buffers.append((min(s for s, _ in spans), max(e for _, e in spans), root))
    buffers.sort()
    live, ends = [], []
    for first, last, root in buffers:
        while ends and ends[0][0] < first:
            _, gone = heapq.heappop(ends)
            live.pop(bisect.bisect_left(live, (plan.tensors[gone].offset, gone)))
        t = plan.tensors[root]
        if not t.nbytes:
            continue
        k = bisect.bisect_left(live, (t.offset, root))
        for other in (live[k - 1:k] + live[k:k + 1]):
            o = plan.tensors[other[1]]
            if t.offset < o.offset + o.nbytes and o.offset < t.offset + t.nbytes:
                raise PlanError(f"tensors {root!r} and {o.name!r} are live at the same step and overlap in the arena "
                                f"([{t.offset}, {t.offset + t.nbytes}) and [{o.offset}, {o.offset + o.nbytes}))")
        live.insert(k, (t.offset, root))
        heapq.heappush(ends, (last, root))


def _check_aliases(plan):
    """A member written in place must find every earlier member of its buffer dead, a graph input or
    const buffer never written, and a param or state only by its update, after its last reader."""
    reads = {}
    for k, step in enumerate(plan.steps):
        for name in step.inputs:
            t = plan.tensors.get(name)
            reads[name] = k
            if t is not None and t.view and t.alias_of:
                reads[t.alias_of] = k
    for root, members in _groups(plan).items():
        kind = plan.tensors[root].kind
        longest = None
        for m in sorted(members, key=lambda t: _span(plan, t)):
            first = _span(plan, m)[0]
            if m.name != root and not m.view:
                if m.role == "update" and kind in ("param", "state"):
                    if reads.get(root, -1) > first:
                        raise PlanError(f"update {m.name!r} overwrites {kind} {root!r} at step {first}, before its "
                                        f"reader at step {reads[root]}")
                    continue
                if kind in ("input", "param", "const", "state"):
                    raise PlanError(f"tensor {m.name!r} is written in place into {kind} {root!r}")
                if longest is not None and _span(plan, longest)[0] < first < _span(plan, longest)[1]:
                    what = "graph output" if longest.name in plan.outputs else "tensor"
                    raise PlanError(f"tensor {m.name!r} is written in place at step {first} over {what} "
                                    f"{longest.name!r}, which is still needed until step {_span(plan, longest)[1]}")
            if longest is None or _span(plan, m)[1] > _span(plan, longest)[1]:
                longest = m


def _check_reads(plan):
    for step_no, step in enumerate(plan.steps):
        names = [*step.inputs, *step.outputs, *([step.workspace] if step.workspace else [])]
        for name in filter(None, names):
            t = plan.tensors.get(name)
            if t is None:
                raise PlanError(f"step {step_no} ({step.name!r}) uses {name!r}, which the plan does not place")
            first, last = _span(plan, t)
            if not first <= step_no <= last:
                raise PlanError(f"step {step_no} ({step.name!r}) uses {name!r} outside its lifetime {t.lifetime}")
        room = plan.tensors[step.workspace].nbytes if step.workspace else 0
        for c in step.scratch:
            if numpy_dtype(c) is None or min(c.shape, default=0) < 0 or c.offset < 0 or c.offset + c.nbytes > room:
                raise PlanError(f"step {step_no} ({step.name!r}): scratch {c.name!r} ({c.dtype}, bytes {c.offset} to "
                                f"{c.offset + c.nbytes}) does not lie in its workspace of {room} bytes")
