"""The Plan: everything the executor needs to run a graph out of one arena, as plain data; `verify()`
re-checks its invariants from the plan alone (planner/plan_checks.py).

On disk a plan is JSON (`to_json`) with its params' and consts' values beside it, in an .npz of the same
stem. The JSON records a digest of those values, and one of itself: of every field, so of each step's op,
version, tensors, attributes and scratch, each tensor's place, and the values' digest. `from_json` reads at
most MAX_PLAN_BYTES, checks every field and each step's op against its schema, then `verify()`, then that the
plan is the one written (its digest), then the values: each .npz member's header against its tensor before
any value is read, and the values against the digest.
"""
import hashlib
import json
import math
import os
import reprlib
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import dtypes  # noqa: F401  (registers ml_dtypes' names with NumPy)
from . import plan_checks
from .deferred import Absent, absent_name, is_absent
from .errors import PlanError
from .ops.base import Slice
from .parallel import Parallel, shard_size, whole_value
from .plan_checks import ALIGNMENT, check_op, is_int, numpy_dtype  # noqa: F401  (ALIGNMENT: planning's, from here)
from .units import format_bytes

FORMAT = "memplan-plan/7"
PHASES = ("", "backward", "recompute", "optimizer")
MEASURED = ("plan_seconds",)
"""Stats a compile measured rather than decided, left out of the file: a plan is the same bytes wherever and
whenever it was made."""
MAX_PLAN_BYTES = 1 << 28
"""Most bytes of plan JSON `from_json` reads, far more than memplan writes for any model: a larger file, or a
device (a link to /dev/zero), is refused, not read until memory runs out."""


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor's place: `offset` into the arena (the host arena where `host`), `lifetime` (first, last) steps
    inclusive (None for persistent tensors, alive the whole run), and `alias_of`, the tensor whose buffer it shares
    (an in-place write, or a `view` that writes nothing); `role` as in plan_checks.ROLES."""

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
    host: bool = False


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


def trains(training):
    """Whether a plan's training facts are a training step's (it has an optimizer); a tensor-parallel rank's
    inference plan holds its tensor_parallel facts alone."""
    return "optimizer" in (training or {})


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
    the optimizer, its arguments and hyperparameter inputs (see planner.training). A tensor-parallel rank's
    inference plan holds its "tensor_parallel" facts alone (planner/passes/tensor_parallel.py)."""
    opsets: dict = field(default_factory=dict)
    """{domain: version} of the graph the plan was made from, which selects each step's op version."""
    device: str = "any"
    """The device the arena is planned for: "any" for a plan of one device that any backend may run."""
    rank: int = 0
    """Which of several cooperating plans this is (a process's rank); 0 for a plan that runs alone."""
    host_arena_bytes: int = 0
    """Bytes of the second arena, in host memory (pinned on CUDA): what the plan swaps out or offloads."""

    @property
    def trains(self):
        """Whether this is a training step's plan, not inference (`trains`)."""
        return trains(self.training)

    def buffer_spans(self, host=False):
        """{root tensor: (first, last)} of every transient buffer of the device arena (of the host arena, `host`):
        an alias group's root and the union of its members' lifetimes."""
        spans = {}
        for t in self.tensors.values():
            if t.lifetime is not None and t.host == host:
                root = t.alias_of or t.name
                lo, hi = spans.get(root, t.lifetime)
                spans[root] = (min(lo, t.lifetime[0]), max(hi, t.lifetime[1]))
        return {r: span for r, span in spans.items() if self.tensors[r].lifetime is not None}

    def __repr__(self):
        """One line: what was planned and its arena (the tensors and steps are many; `report()` says more)."""
        what = f"training step with {self.training['optimizer']}" if self.trains else "inference"
        return (f"<Plan {self.strategy}, {self.schedule} schedule, {what}: arena {format_bytes(self.arena_bytes)}, "
                f"LOAD {format_bytes(self.lower_bound_bytes)}, {len(self.steps)} steps, {len(self.tensors)} tensors>")

    def report(self):
        """The plan's report as text: what was planned, its arena against LOAD, the breakdown at its fullest step
        and by element type, and for a training step what trains (planner.breakdown.describe)."""
        from .breakdown import describe
        return describe(self)

    @property
    def weights_absent(self):
        """The model's weights it was planned without (a weightless model's: planner.deferred.Absent), sorted:
        such a plan says what the model takes, and no Executor runs it."""
        return sorted({absent_name(value) for value in self.data.values() if is_absent(value)})

    @property
    def fragmentation_bytes(self):
        return self.arena_bytes - self.lower_bound_bytes

    def verify(self):
        """Raise PlanError naming the tensors of the first broken invariant; return self when sound."""
        plan_checks.verify(self)
        return self

    def to_json(self, path):
        """Write the plan as JSON at `path` (not ending in .npz), and the params' and consts' values beside
        it in an .npz of the same stem, whose digest the JSON records so that a stale .npz is refused; and
        the digest of the JSON itself, so that a plan changed after it was written is refused. Absent weights
        (a weightless model's) are recorded by name and shape alone."""
        path = Path(path)
        if path.suffix.lower() == ".npz":
            raise PlanError(f"{path}: the plan's values are written beside it as .npz, so the plan itself "
                            "must not end in .npz; name it .json")
        data = self.check_values().data
        values = {name: value for name, value in data.items() if not is_absent(value)}
        doc = {"format": FORMAT, **{k: getattr(self, k) for k in (
            "strategy", "schedule", "arena_bytes", "lower_bound_bytes", "breakdown", "inputs", "outputs",
            "training", "opsets", "device", "rank", "host_arena_bytes")}, "stats": {k: v for k, v in self.stats.items() if k not in MEASURED},
            "tensors": [asdict(t) for t in self.tensors.values()],
            "steps": [{**asdict(s), "attrs": {k: _encode(v) for k, v in s.attrs.items()}} for s in self.steps],
            "values_digest": _values_digest(values) if values else None,
            "absent": {name: list(np.shape(whole_value(value))) for name, value in data.items() if is_absent(value)}}
        doc = json.loads(json.dumps(doc))  # as from_json will read it
        path.write_text(json.dumps({**doc, "digest": document_digest(doc)}, indent=1))
        if values:
            np.savez(values_path(path), **values)
        return path

    @classmethod
    def from_json(cls, path):
        """Read a plan written by `to_json`, checking every field, each step's op, `verify()`, the digests of the
        plan and of the values beside it; anything amiss is a PlanError naming the file and the field."""
        path = Path(path)
        written = _read_json(path)
        doc = _fields(written, TOP_FIELDS, str(path))
        del doc["format"], doc["digest"]
        tensors = {}
        for k, t in enumerate(doc.pop("tensors")):
            t = _fields(t, TENSOR_FIELDS, f"{path}: tensors[{k}]")
            if t["name"] in tensors:
                raise PlanError(f"{path}: tensors[{k}]: a second tensor named {t['name']!r}")
            lifetime = None if t["lifetime"] is None else tuple(t["lifetime"])
            tensors[t["name"]] = PlannedTensor(**{**t, "shape": tuple(t["shape"]), "lifetime": lifetime})
        steps = tuple(_step(s, f"{path}: steps[{k}]") for k, s in enumerate(doc.pop("steps")))
        digest, absent = doc.pop("values_digest"), doc.pop("absent")
        plan = cls(**{**doc, "inputs": tuple(doc["inputs"]), "outputs": tuple(doc["outputs"])},
                   tensors=tensors, steps=steps)
        try:
            plan.verify()
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None
        if document_digest(written) != written["digest"]:
            raise PlanError(f"{path}: the plan was changed after it was written (its digest differs from the one it "
                            "recorded); plan the model again rather than editing the plan")
        values = {} if digest is None else _read_npz(values_path(path), plan)
        plan.data = {**values, **_absent(absent, plan, str(path), values)}
        plan.check_values(f"{path} (saved without values)" if digest is None else str(values_path(path)))
        if digest is not None and _values_digest(values) != digest:
            raise PlanError(f"{values_path(path)}: these values do not belong to {path} (their digest differs from "
                            "the one the plan recorded): save the plan and its values together again with to_json")
        try:
            plan_checks.check_rules(plan)
        except PlanError as e:
            raise PlanError(f"{path}: {e}") from None
        return plan

    def check_values(self, where="Plan.data"):
        """Raise PlanError unless `data` holds a value of the planned shape and dtype for every param and
        const buffer, and nothing else (`where` names the values in the message); return self."""
        for name, value in self.data.items():
            if value is None:
                raise PlanError(f"{where}: {_valued(self, name, where).kind} {name!r} has no value")
            dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
            _check_value(self, name, np.shape(whole_value(value)), dtype, where)
        missing = [t for t in self.tensors.values() if t.kind in ("param", "const") and t.alias_of is None
                   and t.name not in self.data]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise PlanError(f"{where}: no value for {missing[0].kind} {missing[0].name!r}{more}")
        return self


TYPES = {  # name: (what the field must be, its test)
    "str": ("a string", lambda v: isinstance(v, str)),
    "int": ("an int", is_int),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "names": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "shape": ("a list of ints", lambda v: isinstance(v, list) and all(map(is_int, v))),
    "lifetime": ("null or two ints", lambda v: v is None or (isinstance(v, list) and len(v) == 2
                                                             and all(map(is_int, v)))),
    "name?": ("null or a string", lambda v: v is None or isinstance(v, str)),
    "int?": ("null or an int", lambda v: v is None or is_int(v)),
    "phase": (f"one of {PHASES}", lambda v: v in PHASES),
    "opsets": ("an object of domain: version", lambda v: isinstance(v, dict) and all(map(is_int, v.values()))),
}
TOP_FIELDS = {"format": "str", "strategy": "str", "schedule": "str", "arena_bytes": "int", "lower_bound_bytes": "int",
              "breakdown": "object", "inputs": "names", "outputs": "names", "stats": "object", "training": "object",
              "tensors": "list", "steps": "list", "values_digest": "name?", "opsets": "opsets", "device": "str",
              "rank": "int", "absent": "object", "digest": "str", "host_arena_bytes": "int"}
TENSOR_FIELDS = {"name": "str", "shape": "shape", "dtype": "str", "kind": "str", "nbytes": "int", "offset": "int",
                 "lifetime": "lifetime", "alias_of": "name?", "view": "bool", "role": "str", "host": "bool"}
STEP_FIELDS = {"name": "str", "op": "str", "inputs": "names", "outputs": "names", "attrs": "object",
               "workspace": "name?", "phase": "phase", "domain": "str", "scratch": "list", "version": "int?"}
SLICE_FIELDS = {"name": "str", "offset": "int", "shape": "shape", "dtype": "str"}


def _read_json(path):
    """The JSON document at `path`, of at most MAX_PLAN_BYTES (a larger file is not read), checked to be a
    plan of this FORMAT."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            text = f.read(MAX_PLAN_BYTES + 1) if size <= MAX_PLAN_BYTES else b""
    except OSError as e:
        raise PlanError(f"{path}: cannot read the plan ({e.strerror})") from None
    if max(size, len(text)) > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: not a plan (it holds more than {MAX_PLAN_BYTES:,} bytes, the most a plan may hold: "
                        "planner.plan.MAX_PLAN_BYTES)")
    try:
        doc = json.loads(text.decode("utf-8"))
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
    """The Step a JSON object describes, its array attributes decoded, its scratch made Slices, its op checked
    against its schema."""
    s = _fields(obj, STEP_FIELDS, where)
    scratch = [_fields(c, SLICE_FIELDS, f"{where}: scratch[{k}]") for k, c in enumerate(s["scratch"])]
    step = Step(**{**s, "inputs": tuple(s["inputs"]), "outputs": tuple(s["outputs"]),
                   "attrs": {k: _decode(v, f"{where}: attribute {k!r}") for k, v in s["attrs"].items()},
                   "scratch": tuple(Slice(**{**c, "shape": tuple(c["shape"])}) for c in scratch)})
    check_op(step, where)
    return step


def values_path(path):
    """Where to_json writes the values of the plan written at `path`, and from_json reads them: its .npz."""
    return Path(path).with_suffix(".npz")


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
    """{name: array} stored in `npz`, every member's .npy header checked against its tensor before any value
    is read (`_check_member`); ml_dtypes' arrays (stored as raw bytes) viewed as their planned dtype."""
    if not npz.is_file():
        raise PlanError(f"{npz}: missing; it holds the values of the plan's params and consts (to_json writes "
                        "it beside the plan)")
    try:
        if not zipfile.is_zipfile(npz):
            raise ValueError("not an .npz archive")
        with zipfile.ZipFile(npz) as archive:
            for member in archive.infolist():
                _check_member(archive, member, plan, str(npz))
        with np.load(npz, allow_pickle=False) as loaded:
            return {k: _restore(loaded[k], plan.tensors.get(k)) for k in loaded.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise PlanError(f"{npz}: cannot read the values ({e})") from None
    except MemoryError:
        raise PlanError(f"{npz}: not enough memory to read the values of the plan's params and consts") from None


def _check_member(archive, member, plan, where):
    """Refuse a member of the values' archive that is not the .npy of a param or const of the plan, of its
    planned shape and dtype with as many bytes as they take, reading its header alone."""
    name = member.filename[:-4] if member.filename.endswith(".npy") else member.filename
    _valued(plan, name, where)
    with archive.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{member.filename} is an .npy of version {version}, not 1.0 or 2.0")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        start = f.tell()
    _check_value(plan, name, shape, _stored(dtype, plan.tensors[name]), where)
    if member.file_size - start != math.prod(shape) * dtype.itemsize:
        raise PlanError(f"{where}: {name!r} holds {member.file_size - start:,} bytes of values, where its shape "
                        f"{tuple(shape)} and dtype {dtype} take {math.prod(shape) * dtype.itemsize:,}")


def _absent(absent, plan, where, values):
    """{name: Absent} of the weights a plan file records as absent ({name: whole shape}), each checked as a value
    of that shape would be, and none among the `values` the file gives."""
    found = {}
    for name, shape in absent.items():
        if not TYPES["shape"][1](shape):
            raise PlanError(f"{where}: field 'absent': {name!r} must be a list of ints, got {reprlib.repr(shape)}")
        if name in values:
            raise PlanError(f"{where}: {name!r} is both absent and given a value")
        _check_value(plan, name, shape, numpy_dtype(_valued(plan, name, where)), where)
        found[name] = Absent(name, shape, numpy_dtype(plan.tensors[name]))
    return found


def _valued(plan, name, where):
    """The planned tensor `name` that values are given for: a param or const of the plan."""
    t = plan.tensors.get(name)
    if t is None or t.kind not in ("param", "const"):
        raise PlanError(f"{where}: holds a value for {name!r}, which is not a param or const of the plan")
    return t


def _check_value(plan, name, shape, dtype, where):
    """Refuse a value of `shape` (the whole of a rank's part) and `dtype` for a tensor it does not fit."""
    t = _valued(plan, name, where)
    try:
        part = _rank_shape(plan.training or {}, name, tuple(shape))
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:  # a training dict written by hand
        raise PlanError(f"{where}: the plan's training facts do not say how {name!r} is split or sharded "
                        f"({type(e).__name__}: {e})") from None
    if part != tuple(t.shape) or dtype != numpy_dtype(t):
        raise PlanError(f"{where}: {t.kind} {name!r} is {tuple(shape)} {dtype}, but the plan places it as "
                        f"{tuple(t.shape)} {t.dtype}")


def _stored(dtype, tensor):
    """The dtype of a value .npz stored as `dtype`: its tensor's where .npz stored that as raw bytes of the
    same size (bfloat16 as V2)."""
    planned = numpy_dtype(tensor)
    raw = dtype.kind == "V" and not dtype.fields and planned is not None and planned.kind == "V"
    return planned if raw and planned.itemsize == dtype.itemsize else dtype


def _restore(value, tensor):
    """`value` in its tensor's dtype when .npz stored that dtype as raw bytes (see _stored)."""
    dtype = value.dtype if tensor is None else _stored(value.dtype, tensor)
    return value if dtype == value.dtype else value.view(dtype)


def document_digest(doc):
    """A hash of every field of a plan's JSON document but its `digest`: its steps' ops, versions, tensors,
    attributes and scratch, its tensors' places, and (through `values_digest`) its values."""
    text = json.dumps({k: v for k, v in doc.items() if k != "digest"}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _values_digest(values):
    """A hash of the values' names, shapes, dtypes and bytes: the plan records it to tie its .npz to it."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(values):
        value = np.asarray(values[name])
        h.update(json.dumps([name, list(value.shape), value.dtype.name]).encode())
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    return h.hexdigest()


def _rank_shape(training, name, shape):
    """The shape of one rank's part of a param whose whole value has `shape`, by the plan's facts: its piece
    under tensor parallelism, then its shard under ZeRO-3 (an offloaded optimizer's master weights as their
    param, sharded from ZeRO-1 on)."""
    split = (training.get("tensor_parallel") or {}).get("split", {})
    offload = training.get("offload") or {}
    param = next((p for p, master in offload.get("masters", {}).items() if master == name), name)
    if param in split:
        dim = split[param][0]
        shape = (*shape[:dim], shape[dim] // training["tensor_parallel"]["tp"], *shape[dim + 1:])
    facts = training.get("parallel") or {}
    if name not in (*facts.get("sharded", ()), *offload.get("sharded", ())):
        return tuple(shape)
    rule = Parallel(dp=facts["dp"], zero=facts["zero"], shard=facts.get("shard", "flat"))
    return (shard_size(math.prod(shape), rule.dp, rule.unit(shape)),)
