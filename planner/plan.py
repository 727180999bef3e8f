"""The Plan: everything the executor needs to run a graph out of one arena, as plain data.

`verify()` re-checks the invariants from the plan alone, independently of the passes that
made it: aligned offsets inside the arena; no two buffers live at one step overlap in bytes;
an in-place write never lands on bytes another tensor still needs (a graph output, a
pending reader, a graph input, a param or a const); every tensor a step reads is live then.
"""
import bisect
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import PlanError

ALIGNMENT = 256
PERSISTENT = ("param", "const", "state", "workspace_slot")
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
    """One node to run: its op, tensors, attributes, the workspace tensor it may use as scratch, and
    its part of a training step: "" (forward), "backward", "recompute" or "optimizer"."""

    name: str
    op: str
    inputs: tuple
    outputs: tuple
    attrs: dict
    workspace: str | None = None
    phase: str = ""


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
        _check_places(self)
        _check_overlaps(self)
        _check_aliases(self)
        _check_reads(self)
        return self

    def to_json(self, path):
        """Write the plan as JSON at `path`, and the params' and consts' values beside it (.npz)."""
        path = Path(path)
        doc = {"format": "memplan-plan/1", **{k: getattr(self, k) for k in (
            "strategy", "schedule", "arena_bytes", "lower_bound_bytes", "breakdown", "inputs", "outputs", "stats",
            "training")},
            "tensors": [asdict(t) for t in self.tensors.values()],
            "steps": [{**asdict(s), "attrs": {k: _encode(v) for k, v in s.attrs.items()}} for s in self.steps]}
        path.write_text(json.dumps(doc, indent=1))
        if self.data:
            np.savez(_data_path(path), **self.data)
        return path

    @classmethod
    def from_json(cls, path):
        path = Path(path)
        doc = json.loads(path.read_text())
        if doc.pop("format", None) != "memplan-plan/1":
            raise PlanError(f"{path} is not a memplan plan (no 'format': 'memplan-plan/1')")
        tensors = {t["name"]: PlannedTensor(**{**t, "shape": tuple(t["shape"]),
                                               "lifetime": None if t["lifetime"] is None else tuple(t["lifetime"])})
                   for t in doc.pop("tensors")}
        steps = tuple(Step(**{**s, "inputs": tuple(s["inputs"]), "outputs": tuple(s["outputs"]),
                              "attrs": {k: _decode(v) for k, v in s["attrs"].items()}}) for s in doc.pop("steps"))
        data = {}
        if _data_path(path).exists():
            with np.load(_data_path(path)) as npz:
                data = {k: npz[k] for k in npz.files}
        return cls(**{**doc, "inputs": tuple(doc["inputs"]), "outputs": tuple(doc["outputs"])},
                   tensors=tensors, steps=steps, data=data)


def _data_path(path):
    return path.with_suffix(".npz")


def _encode(value):
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value):
    if isinstance(value, dict) and "ndarray" in value:
        return np.array(value["ndarray"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
    return value


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
            _, gone = ends.pop(0)
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
        bisect.insort(ends, (last, root))


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
