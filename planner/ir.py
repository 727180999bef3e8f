"""The graph every pass reads and writes: tensors (name, shape, dtype, kind) and nodes in ONNX op terms.

Nodes and tensors are treated as immutable; a pass that changes them builds new ones
(`dataclasses.replace`) and a new Graph.
"""
import heapq
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property

import numpy as np

from .errors import ModelError, ShapeError

MAX_TENSOR_BYTES = 1 << 48
"""The most bytes one tensor may hold (256 TiB). x86-64 and ARM64 address at most 2**48 bytes of
virtual memory, so no device (host or GPU) can hold a larger buffer; and below it, sizes and sums
of many sizes stay exact in the int64 the allocators compute with (2**63 is 32768 such tensors)."""

DEFAULT_OPSETS = {"": 17, "memplan": 1}
"""The opsets of a graph built in code: ONNX 17 and memplan's own domain."""

KINDS = ("input", "param", "const", "state", "activation", "output")
"""`state`: persistent values that start at zero and that the graph itself updates (optimizer moments)."""


@dataclass(frozen=True, eq=False)
class Tensor:
    """A value in the graph. `shape` holds ints once bound, and may hold dim names (str) or None before.
    `data`, a param's or const's values: an array, or a planner.deferred.Deferred read when needed. `host`: held in
    host memory (the plan's host arena), not the device's: a swapped-out copy, an offloaded optimizer's state."""

    name: str
    shape: tuple | None
    dtype: np.dtype | None
    kind: str
    data: np.ndarray | None = field(default=None, repr=False)
    host: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"tensor {self.name!r}: kind {self.kind!r} is not one of {KINDS}")

    @property
    def is_static(self):
        """True when every dimension and the dtype are known."""
        return self.dtype is not None and self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.size * np.dtype(self.dtype).itemsize


def check_size(what, shape, dtype):
    """Raise ShapeError when `what` (a phrase naming the tensor) of `shape` and `dtype` would hold more
    than MAX_TENSOR_BYTES; computed on Python ints, so no size overflows."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeError(f"{what} of shape {tuple(shape)} {np.dtype(dtype)} would hold {nbytes:,} bytes; "
                         f"a tensor may hold at most 2**48 bytes (256 TiB)")


class Phase(Enum):
    """Which part of a training step a node belongs to; a model's own nodes and the loss are forward."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


HINTS = ("force_mirroring", "mirror_stage")
"""The annotations a user gives a node (kept in ONNX as node metadata_props "memplan.KEY")."""


@dataclass(frozen=True)
class Annotations:
    """memplan's annotations of a node. The passes set `phase`, `recompute` (a clone that computes a
    forward value again in backward), `assign` (the copy of a new param over the old, at the end) and
    `of` (see below);
    the user's hints are `force_mirroring` (recompute it under every strategy but optimal) and
    `mirror_stage` (recompute or keep the stage's nodes together), kept in ONNX as metadata_props."""

    phase: Phase = Phase.FORWARD
    recompute: bool = False
    assign: bool = False
    force_mirroring: bool = False
    mirror_stage: str | None = None
    of: str | None = None
    """The forward node whose gradient rule made this backward node (planner.autodiff)."""

    @property
    def forward(self):
        return self.phase is Phase.FORWARD

    @classmethod
    def from_metadata(cls, hints, node="a node"):
        """The annotations of the user's hints as text {key: value} (HINTS; a true force_mirroring is
        "1", "true" or "yes" in any case), as ONNX metadata and the symbolic API carry them."""
        unknown = sorted(set(hints) - set(HINTS))
        if unknown:
            raise ModelError(f"{node} has annotations {', '.join(map(repr, unknown))}; memplan reads "
                             f"{' and '.join(HINTS)}")
        return cls(force_mirroring=hints.get("force_mirroring", "").lower() in ("1", "true", "yes"),
                   mirror_stage=hints.get("mirror_stage"))

    def metadata(self):
        """The user's hints as text {key: value}, which `from_metadata` reads back."""
        hints = {"force_mirroring": "1"} if self.force_mirroring else {}
        if self.mirror_stage is not None:
            hints["mirror_stage"] = self.mirror_stage
        return hints


@dataclass(frozen=True, eq=False)
class Node:
    """One op application. An empty string in `inputs` marks an omitted optional input.

    `op` is the op type within `domain` ("" is ONNX's default domain, "memplan" memplan's own ops);
    the version of the op is the one the graph's opset for that domain selects (Graph.opsets).
    `attrs` are the op's ONNX attributes; `notes` memplan's annotations of the node (Annotations).
    """

    op: str
    inputs: tuple
    outputs: tuple
    attrs: dict = field(default_factory=dict)
    name: str = ""
    notes: Annotations = Annotations()
    domain: str = ""

    def __repr__(self):
        return f"Node({self.name}: {op_name(self.domain, self.op)}({', '.join(self.inputs)}) -> {', '.join(self.outputs)})"


def op_name(domain, op):
    """How messages name an op: "Relu" in the default domain, "memplan.SGD" elsewhere."""
    return f"{domain}.{op}" if domain else op


@dataclass(frozen=True, eq=False)
class Graph:
    """Nodes in a topological order, the tensors they read and write, and the graph's inputs and outputs.

    `updates` pairs (new value, persistent tensor): after a run the persistent tensor (a param or
    state) holds the new value, written into its bytes once every other reader of it has run, as a
    training step updates its weights in place. `exported_params`: how many nn.Parameters the
    torch.export signature a file carries lists (None without one), to check what a training step trains;
    `buffers`: the initializers it says are not nn.Parameters (the module's buffers), which do not train.
    `opsets`: {domain: version} the model imports ("" the default ONNX domain), which selects the
    version of each node's op. `bfloat16`: the graph was rewritten to compute in bfloat16 (the
    precision pass), which memplan's kernels take wherever ONNX's type constraints take float16.
    """

    nodes: tuple
    tensors: dict
    inputs: tuple
    outputs: tuple
    name: str = "graph"
    opsets: dict = field(default_factory=lambda: dict(DEFAULT_OPSETS))
    updates: tuple = ()
    exported_params: int | None = None
    buffers: frozenset = frozenset()
    bfloat16: bool = False

    @property
    def opset(self):
        """The version of the default ONNX domain."""
        return self.opsets[""]

    @cached_property
    def producers(self):
        """Tensor name -> the node that writes it (graph inputs, params and consts have none)."""
        return {out: node for node in self.nodes for out in node.outputs if out}

    @cached_property
    def consumers(self):
        """Tensor name -> the nodes that read it, in schedule order (a node reading twice appears once)."""
        users = {name: [] for name in self.tensors}
        for node in self.nodes:
            for name in dict.fromkeys(i for i in node.inputs if i):
                users[name].append(node)
        return users

    def producer(self, name):
        return self.producers.get(name)

    def params(self):
        return [t for t in self.tensors.values() if t.kind == "param"]

    def summary(self):
        counts = Counter(op_name(node.domain, node.op) for node in self.nodes)
        return f"{self.name}: {len(self.nodes)} nodes, {len(self.tensors)} tensors, ops " + \
            ", ".join(f"{op} x{n}" for op, n in counts.most_common())


def captured(*graphs):
    """The outer names the subgraphs (of an If, Loop or Scan) read without defining them, sorted: the
    frontend appends them to the node's inputs, so that ordering and pruning see what the node reads."""
    names = set()
    for g in graphs:
        defined = {*g.inputs, *(t.name for t in g.tensors.values() if t.kind in ("param", "const"))}
        defined.update(o for n in g.nodes for o in n.outputs if o)
        names.update(x for x in (*(i for n in g.nodes for i in n.inputs), *g.outputs) if x and x not in defined)
    return sorted(names)


def validate(graph):
    """Check names and edges, and return the graph with its nodes in a topological order.

    The file's order is kept wherever it is already valid. Raises ModelError naming the
    duplicate, dangling or cyclic part.
    """
    names = Counter(n.name for n in graph.nodes)
    dup_nodes = sorted(n for n, c in names.items() if c > 1)
    if dup_nodes:
        raise ModelError(f"duplicate node names: {', '.join(dup_nodes[:10])}")
    writers = Counter(o for n in graph.nodes for o in n.outputs if o)
    sources = {t.name for t in graph.tensors.values() if t.kind in ("input", "param", "const", "state")}
    dup = sorted(o for o, c in writers.items() if c > 1 or o in sources)
    if dup:
        raise ModelError(f"tensors written more than once (or both an input/initializer and a node output): {', '.join(dup[:10])}")
    dup_inputs = sorted(n for n, c in Counter(graph.inputs).items() if c > 1)
    if dup_inputs:
        raise ModelError(f"duplicate graph inputs: {', '.join(dup_inputs)}")
    missing_decl = sorted({x for n in graph.nodes for x in (*n.inputs, *n.outputs) if x and x not in graph.tensors})
    if missing_decl:
        raise ModelError(f"tensors used but not declared: {', '.join(missing_decl[:10])}")
    for node in graph.nodes:
        dangling = [i for i in node.inputs if i and i not in writers and i not in sources]
        if dangling:
            raise ModelError(f"node {node.name!r} ({node.op}) reads {', '.join(map(repr, dangling))}, "
                             "which no node, graph input or initializer provides")
    unmade = [o for o in graph.outputs if o not in writers and o not in sources]
    if unmade:
        raise ModelError(f"graph outputs not produced by any node: {', '.join(unmade)}")
    return replace(graph, nodes=_toposort(graph.nodes, sources))


def _toposort(nodes, sources):
    """Kahn's algorithm, taking nodes in file order whenever several are ready."""
    writer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    waiting = [0] * len(nodes)
    readers = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        deps = {writer[x] for x in node.inputs if x and x not in sources}
        waiting[i] = len(deps)
        for d in deps:
            readers[d].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) < len(nodes):
        stuck = [nodes[i].name or nodes[i].op for i, w in enumerate(waiting) if w > 0]
        raise ModelError(f"the graph has a cycle through nodes: {', '.join(stuck[:10])}")
    return tuple(nodes[i] for i in order)

