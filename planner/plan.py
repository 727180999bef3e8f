"""The Plan: everything the executor needs to run a graph out of one arena, as plain data.

`verify()` re-checks the invariants from the plan alone, independently of the passes that
made it: aligned offsets inside the arena; no two buffers live at one step overlap in bytes;
an in-place write never lands on bytes another tensor still needs (a graph output, a
pending reader, a graph input, a param or a const); every tensor a step reads is live then. It
also checks that each tensor's dtype, shape and bytes agree and that every name it uses has a place.

On disk a plan is JSON (`to_json`) with its params' and consts' values beside it, in an .npz of the same
stem; the JSON records a digest of those values. `from_json` checks every field, then `verify()`, then
that the values are complete, of the planned shapes and dtypes, and the very ones the digest names.
"""
import bisect
import hashlib
import heapq
import json
import math
import reprlib
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import dtypes  # noqa: F401  (registers ml_dtypes' names with NumPy)
from .errors import PlanError
from .ir import KINDS as GRAPH_KINDS
from .ops.base import Slice
from .parallel import Parallel, Whole, shard_size

ALIGNMENT = 256
FORMAT = "memplan-plan/4"
PERSISTENT = ("param", "const", "state", "workspace_slot")
KINDS = (*GRAPH_KINDS, "workspace", "workspace_slot")
PHASES = ("", "backward", "recompute", "optimizer")
ROLES = ("", "saved", "gradient", "update", "recomputed")
"""A transient tensor's part in a training step: a forward value that backward reads ("saved"), a
parameter's gradient, the new value of a param or state written over it ("update"), or a forward
value computed again for backward ("recomputed")."""


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor's place: `offset` into the arena, `lifetime` (first, last) steps inclusive (None
    for persistent tensors, alive the whole run), and `alias_of`, the tensor whose buffer it shares
    (an in-place write, or a `view` that writes nothing); `role` as in ROLES."""

    name: str
    shape: tuple
    dtype: str
    kind: str
    nbytes: int
    offset: int
    lifetime: tuple | None
    alias_of: str | None = None
    view: bool = False
    role: str = ""


@dataclass(frozen=True)
class Step:
    """One node to run: its op (of `domain`, as Node's), tensors, every attribute (defaults filled in,
    see Schema.normalize), the workspace tensor it may use as scratch and the `scratch` Slices the
    kernel gets cut from it (the op's workspace Layout), and its part of a training step: ""
    (forward), "backward", "recompute" or "optimizer". `version` is the opset of its domain the
    graph imported, which selects the op's schema (None: the newest)."""

    name: str
    op: str
    inputs: tuple
    outputs: tuple
    attrs: dict
    workspace: str | None = None
    phase: str = ""
    domain: str = ""
    scratch: tuple = ()
    version: int | None = None


@dataclass
class Plan:
    """A memory plan: the arena size, its lower bound and breakdown, every tensor's place, the steps."""

    strategy: str
    schedule: str
    arena_bytes: int
    lower_bound_bytes: int
    breakdown: dict
    tensors: dict
    steps: tuple
    inputs: tuple
    outputs: tuple
    stats: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict, repr=False)
    """Values of params and consts, copied into the arena once before the first run."""
    training: dict = field(default_factory=dict)
    """For a training step: the loss output, the labels input, the trained params and their gradients,
    the optimizer, its arguments and hyperparameter inputs (see planner.training)."""
    opsets: dict = field(default_factory=dict)
    """{domain: version} of the graph the plan was made from, which selects each step's op version."""
    device: str = "any"
    """The device the arena is planned for: "any" for a plan of one device that any backend may run."""
    rank: int = 0
    """Which of several cooperating plans this is (a process's rank); 0 for a plan that runs alone."""

    def buffer_spans(self):
        """{root tensor: (first, last)} of every transient buffer: an alias group's root and the union
        of its members' lifetimes."""
        spans = {}
        for t in self.tensors.values():
            if t.lifetime is not None:
                root = t.alias_of or t.name
                lo, hi = spans.get(root, t.lifetime)
                spans[root] = (min(lo, t.lifetime[0]), max(hi, t.lifetime[1]))
        return {r: span for r, span in spans.items() if self.tensors[r].lifetime is not None}

    @property
    def fragmentation_bytes(self):
        return self.arena_bytes - self.lower_bound_bytes

    def verify(self):
        """Raise PlanError naming the tensors of the first broken invariant; return self when sound."""
        _check_tensors(self)
        _check_training(self)
        _check_names(self)
        _check_places(self)
        _check_overlaps(self)
        _check_aliases(self)
        _check_reads(self)
        return self

    def to_json(self, path):
        """Write the plan as JSON at `path` (not ending in .npz), and the params' and consts' values beside
        it in an .npz of the same stem, whose digest the JSON records so that a stale .npz is refused."""
        path = Path(path)
        if path.suffix.lower() == ".npz":
            raise PlanError(f"{path}: the plan's values are written beside it as .npz, so the plan itself "
                            "must not end in .npz; name it .json")
        values = self.check_values().data
        doc = {"format": FORMAT, **{k: getattr(self, k) for k in (
            "strategy", "schedule", "arena_bytes", "lower_bound_bytes", "breakdown", "inputs", "outputs", "stats",
            "training", "opsets", "device", "rank")},
            "tensors": [asdict(t) for t in self.tensors.values()],
            "steps": [{**asdict(s), "attrs": {k: _encode(v) for k, v in s.attrs.items()}} for s in self.steps],
            "values_digest": _digest(values) if values else None}
        path.write_text(json.dumps(doc, indent=1))
        if values:
            np.savez(_data_path(path), **values)
        return path

    @classmethod
    def from_json(cls, path):
        """Read a plan written by `to_json`, checking every field, the values beside it and `verify()`;
        anything amiss is a PlanError naming the file and the field."""
        path = Path(path)
        doc = _fields(_read_json(path), TOP_FIELDS, str(path))
        del doc["format"]
        tensors = {}
        for k, t in enumerate(doc.pop("tensors")):
            t = _fields(t, TENSOR_FIELDS, f"{path}: tensors[{k}]")
            if t["name"] in tensors:
                raise PlanError(f"{path}: tensors[{k}]: a second tensor named {t['name']!r}")
            lifetime = None if t["lifetime"] is None else tuple(t["lifetime"])
            tensors[t["name"]] = PlannedTensor(**{**t, "shape": tuple(t["shape"]), "lifetime": lifetime})
        steps = tuple(_step(s, f"{path}: steps[{k}]") for k, s in enumerate(doc.pop("steps")))
        digest = doc.pop("values_digest")
        plan = cls(**{**doc, "inputs": tuple(doc["inputs"]), "outputs": tuple(doc["outputs"])},
                   tensors=tensors, steps=steps)
        try:
            plan.verify()
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None
        plan.data = {} if digest is None else _read_npz(_data_path(path), plan)
        plan.check_values(f"{path} (saved without values)" if digest is None else str(_data_path(path)))
        if digest is not None and _digest(plan.data) != digest:
            raise PlanError(f"{_data_path(path)}: these values do not belong to {path} (their digest differs from "
                            "the one the plan recorded): save the plan and its values together again with to_json")
        return plan

    def check_values(self, where="Plan.data"):
        """Raise PlanError unless `data` holds a value of the planned shape and dtype for every param and
        const buffer, and nothing else (`where` names the values in the message); return self."""
        for name, value in self.data.items():
            t = self.tensors.get(name)
            if t is None or t.kind not in ("param", "const"):
                raise PlanError(f"{where}: holds a value for {name!r}, which is not a param or const of the plan")
            if value is None:
                raise PlanError(f"{where}: {t.kind} {name!r} has no value")
            dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
            shape = _rank_shape(self.training or {}, name, np.shape(_whole(value)))
            if tuple(shape) != tuple(t.shape) or dtype != _dtype(t):
                raise PlanError(f"{where}: {t.kind} {name!r} is {np.shape(value)} {dtype}, but "
                                f"the plan places it as {tuple(t.shape)} {t.dtype}")
        missing = [t for t in self.tensors.values() if t.kind in ("param", "const") and t.alias_of is None
                   and t.name not in self.data]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise PlanError(f"{where}: no value for {missing[0].kind} {missing[0].name!r}{more}")
        return self


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


TYPES = {  # name: (what the field must be, its test)
    "str": ("a string", lambda v: isinstance(v, str)),
    "int": ("an int", _is_int),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "names": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "shape": ("a list of ints", lambda v: isinstance(v, list) and all(map(_is_int, v))),
    "lifetime": ("null or two ints", lambda v: v is None or (isinstance(v, list) and len(v) == 2
                                                             and all(map(_is_int, v)))),
    "name?": ("null or a string", lambda v: v is None or isinstance(v, str)),
    "int?": ("null or an int", lambda v: v is None or _is_int(v)),
    "phase": (f"one of {PHASES}", lambda v: v in PHASES),
    "opsets": ("an object of domain: version", lambda v: isinstance(v, dict) and all(map(_is_int, v.values()))),
}
TOP_FIELDS = {"format": "str", "strategy": "str", "schedule": "str", "arena_bytes": "int", "lower_bound_bytes": "int",
              "breakdown": "object", "inputs": "names", "outputs": "names", "stats": "object", "training": "object",
              "tensors": "list", "steps": "list", "values_digest": "name?", "opsets": "opsets", "device": "str",
              "rank": "int"}
TENSOR_FIELDS = {"name": "str", "shape": "shape", "dtype": "str", "kind": "str", "nbytes": "int", "offset": "int",
                 "lifetime": "lifetime", "alias_of": "name?", "view": "bool", "role": "str"}
STEP_FIELDS = {"name": "str", "op": "str", "inputs": "names", "outputs": "names", "attrs": "object",
               "workspace": "name?", "phase": "phase", "domain": "str", "scratch": "list", "version": "int?"}
SLICE_FIELDS = {"name": "str", "offset": "int", "shape": "shape", "dtype": "str"}


def _read_json(path):
    """The JSON document at `path`, checked to be a plan of this FORMAT."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise PlanError(f"{path}: cannot read the plan ({e.strerror})") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a plan (the file is not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: not a plan (invalid JSON: {e.msg} at line {e.lineno} column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise PlanError(f"{path}: not a plan (invalid JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise PlanError(f"{path}: not a memplan plan of format {FORMAT!r} (found {reprlib.repr(found)})")
    return doc


def _fields(obj, spec, where):
    """`obj` as a dict holding exactly the fields of `spec` ({field: TYPES key}), each of its type."""
    if not isinstance(obj, dict):
        raise PlanError(f"{where} must be an object, got {reprlib.repr(obj)}")
    for key, kind in spec.items():
        what, test = TYPES[kind]
        if key not in obj:
            raise PlanError(f"{where}: field {key!r} is missing")
        if not test(obj[key]):
            raise PlanError(f"{where}: field {key!r} must be {what}, got {reprlib.repr(obj[key])}")
    unknown = sorted(set(obj) - set(spec))
    if unknown:
        raise PlanError(f"{where}: unknown field {unknown[0]!r}")
    return dict(obj)


def _step(obj, where):
    """The Step a JSON object describes, its array attributes decoded and its scratch made Slices."""
    s = _fields(obj, STEP_FIELDS, where)
    scratch = [_fields(c, SLICE_FIELDS, f"{where}: scratch[{k}]") for k, c in enumerate(s["scratch"])]
    return Step(**{**s, "inputs": tuple(s["inputs"]), "outputs": tuple(s["outputs"]),
                   "attrs": {k: _decode(v, f"{where}: attribute {k!r}") for k, v in s["attrs"].items()},
                   "scratch": tuple(Slice(**{**c, "shape": tuple(c["shape"])}) for c in scratch)})


def _data_path(path):
    return path.with_suffix(".npz")


def _encode(value):
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value, where):
    if not (isinstance(value, dict) and "ndarray" in value):
        return value
    try:
        return np.array(value["ndarray"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise PlanError(f"{where} is not an encoded array ({type(e).__name__}: {e})") from None


def _read_npz(npz, plan):
    """{name: array} stored in `npz`, ml_dtypes' arrays (stored as raw bytes) viewed as their planned dtype."""
    if not npz.is_file():
        raise PlanError(f"{npz}: missing; it holds the values of the plan's params and consts (to_json writes "
                        "it beside the plan)")
    try:
        loaded = np.load(npz, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with loaded:
            return {k: _restore(loaded[k], plan.tensors.get(k)) for k in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise PlanError(f"{npz}: cannot read the values ({e})") from None


def _restore(value, tensor):
    """`value` in its tensor's dtype when .npz stored that dtype as raw bytes of the same size (bfloat16 as V2)."""
    if tensor is None or value.dtype.kind != "V" or value.dtype.fields:
        return value
    dtype = _dtype(tensor)
    return value.view(dtype) if dtype is not None and dtype.kind == "V" and dtype.itemsize == value.itemsize \
        else value


def _digest(values):
    """A hash of the values' names, shapes, dtypes and bytes: the plan records it to tie its .npz to it."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(values):
        value = np.asarray(values[name])
        h.update(json.dumps([name, list(value.shape), value.dtype.name]).encode())
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _whole(value):
    """The whole value a rank's part stands for (parallel.Whole, perhaps of a Whole), or `value` itself."""
    while isinstance(value, Whole):
        value = value.value
    return value


def _rank_shape(training, name, shape):
    """The shape of one rank's part of a param whose whole value has `shape`, by the plan's facts: its piece
    under tensor parallelism, then its shard under ZeRO-3."""
    split = (training.get("tensor_parallel") or {}).get("split", {})
    if name in split:
        dim = split[name][0]
        shape = (*shape[:dim], shape[dim] // training["tensor_parallel"]["tp"], *shape[dim + 1:])
    facts = training.get("parallel") or {}
    if name not in facts.get("sharded", ()):
        return tuple(shape)
    rule = Parallel(dp=facts["dp"], zero=facts["zero"], shard=facts.get("shard", "flat"))
    return (shard_size(math.prod(shape), rule.dp, rule.unit(shape)),)


def _dtype(t):
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
            dtype = _dtype(t)
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
    if info:
        keys = ("loss", "lr", "step") if info.get("loss") is not None else ("lr", "step")  # (an early pipeline stage)
        named += [(f"training {key}", info.get(key)) for key in keys]
        named += [("trained param", n) for n in info.get("params", ())]
    for what, name in named:
        if not isinstance(name, str) or name not in plan.tensors:
            raise PlanError(f"{what} {reprlib.repr(name)} has no place in the plan")


def _check_training(plan):
    """A training step's info holds what the executor reads: a list of params and a numeric 'lr' argument."""
    info = plan.training
    if info and not isinstance(info.get("params", ()), (list, tuple)):
        raise PlanError(f"training params must be a list of names, got {reprlib.repr(info['params'])}")
    if info and not (isinstance(info.get("args"), dict) and isinstance(info["args"].get("lr"), (int, float))):
        raise PlanError(f"training args {reprlib.repr(info.get('args'))} must give the learning rate 'lr' as a number")


def _span(plan, t):
    """The steps a tensor occupies its bytes: its lifetime, or every step and the return when persistent."""
    return t.lifetime if t.lifetime is not None else (0, len(plan.steps))


def _check_places(plan):
    for t in plan.tensors.values():
        if t.offset % ALIGNMENT:
            raise PlanError(f"tensor {t.name!r}: offset {t.offset} is not a multiple of {ALIGNMENT}")
        if t.offset < 0 or t.offset + t.nbytes > plan.arena_bytes:
            raise PlanError(f"tensor {t.name!r}: bytes [{t.offset}, {t.offset + t.nbytes}) fall outside the "
                            f"arena of {plan.arena_bytes} bytes")
        if (t.lifetime is None) != (t.kind in PERSISTENT):
            raise PlanError(f"tensor {t.name!r} ({t.kind}) has lifetime {t.lifetime}")
        if t.lifetime is not None and not 0 <= t.lifetime[0] <= t.lifetime[1] <= len(plan.steps):
            raise PlanError(f"tensor {t.name!r}: lifetime {tuple(t.lifetime)} is not within steps 0 to "
                            f"{len(plan.steps)}")
    base = plan.stats.get("persistent_bytes", 0)
    if not _is_int(base) or not 0 <= base <= plan.arena_bytes:
        raise PlanError(f"stats.persistent_bytes {base!r} must be an int within the arena of {plan.arena_bytes} bytes")


def _groups(plan):
    """Root tensor -> its alias group (the root first), checking every alias points at a root."""
    groups = {}
    for t in plan.tensors.values():
        root = plan.tensors.get(t.alias_of) if t.alias_of else t
        if root is None or root.alias_of:
            raise PlanError(f"tensor {t.name!r} is an alias of {t.alias_of!r}, which is not a planned root tensor")
        if t is not root and (t.offset != root.offset or t.nbytes > root.nbytes):
            raise PlanError(f"tensor {t.name!r} lies outside the buffer of {root.name!r} that it aliases")
        groups.setdefault(root.name, []).append(t)
    return groups


def _check_overlaps(plan):
    """Sweep the steps; at each buffer's first step, compare its bytes with the buffers live then."""
    buffers = []
    for root, members in _groups(plan).items():
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
            if _dtype(c) is None or min(c.shape, default=0) < 0 or c.offset < 0 or c.offset + c.nbytes > room:
                raise PlanError(f"step {step_no} ({step.name!r}): scratch {c.name!r} ({c.dtype}, bytes {c.offset} to "
                                f"{c.offset + c.nbytes}) does not lie in its workspace of {room} bytes")
