"""Planning one typed graph, one step per line:

    schedule -> lifetimes -> in-place aliases -> workspaces -> buffers (LOAD) -> allocator offsets -> Plan

A search that only compares arenas (recomputation's candidates, the schedule orders of "auto") measures
its candidates as far as their buffers (`measure`) and allocates them by rising LOAD, only while one can
beat the best arena so far: no placement uses less than LOAD, so the others cannot win. A candidate is
planned in each schedule order, with its scratch pooled or as one-step tensors (workspace mode "auto":
both, ties pooled); searches place the buffers of the "auto" strategy by best fit (SEARCHED_BY), and a plan
is the smallest so placed, placed again by the strategy's allocator, whose exact search can only lower it.
"""
import copy
import math

from . import allocators, ops, workspace
from .breakdown import breakdown
from .errors import AboveLimitError
from .inplace import aliases
from .ir import Phase
from .liveness import lifetimes
from .options import STRATEGIES
from .plan import ALIGNMENT, Plan, PlannedTensor, Step, trains
from .schedule import schedule as make_schedule


SEARCHED_BY = {"auto": "bestfit"}
"""{allocator: the allocator searches place its candidates with}, where that differs: "auto"'s exact search
runs once, on the plan it makes."""
MODES = ("pool", "tensor")
"""The workspace modes "auto" plans, preferred in this order on a tie."""


def plan_graph(graph, strategy, order, config, fetch=(), training=None):
    """One Plan of a typed graph for one strategy and one schedule order."""
    return measure(graph, strategy, (order,), config, fetch, training).plan()


def smallest_plan(graph, strategy, orders, config, fetch=(), training=None, limit=None):
    """The Plan of the smallest arena among the schedule `orders` (ties: the first order's); AboveLimitError,
    before any offset is placed, where even its LOAD is above `limit` bytes."""
    measured = measure(graph, strategy, orders, config, fetch, training)
    if limit is not None and measured.load > limit:
        raise AboveLimitError(limit, measured.load)
    return measured.plan()


def smallest(loads, arena, below=math.inf):
    """(arena, index) of the candidate of the least (arena, index), or None where no arena is below `below`.
    Candidates are allocated (`arena(k, bound)`: the k-th's arena, or None where it is not below `bound`) by
    rising (LOAD, index), and only while one can still beat the best: no arena is below its LOAD."""
    best = (below, -1)
    for k in sorted(range(len(loads)), key=lambda k: (loads[k], k)):
        if (loads[k], k) < best:
            found = arena(k, best[0] + (k < best[1]))
            if found is not None and (found, k) < best:
                best = (found, k)
    return best if best[1] >= 0 else None


def measure(graph, strategy, orders, config, fetch=(), training=None):
    """The graph's plans in the schedule `orders`, each in the Config's workspace modes, as far as their buffers
    (Measured)."""
    scratch = _scratch(graph, config)
    orders = ("file",) if timed(graph) else orders  # its copies were placed by time in this order
    modes = MODES if config.workspace_mode == "auto" and scratch else (_mode(config),)
    found = []
    for order in orders:
        first = Buffers(graph, strategy, order, config, fetch, training, scratch, modes[0])
        found += [first, *(first.in_mode(mode) for mode in modes[1:])]
    return Measured(found)


def timed(graph):
    """Whether the graph holds copies placed by time (Schema.timed ops in the forward pass: the swap planner's), so
    that it runs in its own order: another would move the copies off the times they were placed by. An offloaded
    optimizer's copies (of gradients, in the backward pass, and of updated params) follow what they copy alone."""
    return any(node.notes.forward and ops.of(node, graph.opsets).timed for node in graph.nodes)


class Measured:
    """A candidate's plans, one per schedule order and workspace mode, before offsets: `load`, the least LOAD
    among them (no arena of the candidate is smaller); `arena(below)` allocates them as `smallest` does, as
    searches place them; `plan()` is the smallest so placed, placed by the strategy's allocator (SEARCHED_BY)."""

    def __init__(self, buffers):
        self.buffers = buffers
        self.load = min(b.load for b in buffers)
        self._chosen = None

    def arena(self, below=math.inf):
        """The smallest arena as searches place them, or None where none is below `below` bytes."""
        best = _searched(self.buffers, below)
        return None if best is None else best[0]

    def fitting(self, budget):
        """The arena as searches place it, or the plan's where only the plan's can fit `budget` bytes (its exact
        placement can be smaller than the searches')."""
        arena = self.arena()
        return self.final_arena() if arena > budget >= self.load else arena

    def final_arena(self):
        """The arena of `plan()`, without making the Plan."""
        return self.chosen().arena()

    def plan(self):
        """The Plan of the smallest arena (ties: the first order's, pooled)."""
        return self.chosen().plan()

    def chosen(self):
        """The Buffers `plan()` places."""
        if self._chosen is None:
            self._chosen = self.buffers[_searched(self.buffers)[1]]
        return self._chosen


def _searched(buffers, below=math.inf):
    """`smallest` of `buffers` as searches place them."""
    return smallest([b.load for b in buffers], lambda k, _: buffers[k].arena(final=False), below)


class Buffers:
    """A typed graph's tensors under one schedule order, strategy and workspace mode ("pool" or "tensor"),
    before offsets: the steps, which tensors share a buffer, each buffer's span of steps, the persistent bytes
    below the buffers (params, state, pooled workspace slots) and `load`, the least arena any placement of them
    can have. `scratch` is the nodes' workspaces (_scratch), the same in every order."""

    def __init__(self, graph, strategy, order, config, fetch, training, scratch, mode="pool"):
        self.graph, self.config, self.training = graph, config, training
        self.allocator, inplace_allowed = STRATEGIES[strategy]
        self.strategy, self.order = strategy, order
        held = (*graph.outputs, *fetch)
        last = {n.name for n in graph.nodes if n.notes.assign}
        if (training or {}).get("update") == "after_backward":
            last |= {n.name for n in graph.nodes if n.notes.phase is Phase.OPTIMIZER}
        self.steps = make_schedule(graph, order, held, last)
        self.life = lifetimes(graph, self.steps, held)
        self.root_of, self.views = aliases(graph, self.steps, held, writes=inplace_allowed and config.enable_inplace)
        self.root_of.update(graph.updates)
        self.scratch = scratch
        self._arrange(mode)

    def in_mode(self, mode):
        """The same buffers with the scratch in workspace `mode`."""
        other = copy.copy(self)
        other._arrange(mode)
        return other

    def _arrange(self, mode):
        """The buffers, their spans and LOAD with the scratch in workspace `mode`."""
        graph, config = self.graph, self.config
        self.mode, self.slots, self.slot_of, self._placed = mode, [], {}, {}
        if mode == "pool" and self.scratch:
            self.slots, self.slot_of = workspace.pool(
                self.steps, {name: layout.nbytes for name, layout in self.scratch.items()}, config.temp_slots)
        self.spans = {}
        for name, (first, last) in self.life.items():
            key = self.root_of.get(name) or name
            lo, hi = self.spans.get(key, (first, last))
            self.spans[key] = (min(lo, first), max(hi, last))
        tensors = graph.tensors
        own = [n for n in tensors if n not in self.root_of]
        self.persistent = [(n, tensors[n].nbytes) for n in own if n not in self.life and not tensors[n].host]
        self.persistent += [(_slot(k), size) for k, size in enumerate(self.slots)]
        self.roots = [(n, tensors[n].nbytes) for n in own if n in self.life and not tensors[n].host]
        self.host = Host([(n, tensors[n].nbytes) for n in own if n not in self.life and tensors[n].host],
                         [(n, tensors[n].nbytes, self.spans[n]) for n in own if n in self.life and tensors[n].host])
        if mode != "pool":
            for step, node in enumerate(self.steps):
                if node.name in self.scratch:
                    used = _own_workspace(node)
                    self.roots.append((used, self.scratch[node.name].nbytes))
                    self.spans[used] = (step, step)
        self.base = sum(allocators.align(size, ALIGNMENT) for _, size in self.persistent)
        self.intervals = ([size for _, size in self.roots], [self.spans[n][0] for n, _ in self.roots],
                          [self.spans[n][1] for n, _ in self.roots])
        self.load = self.base + allocators.lower_bound(*self.intervals, ALIGNMENT)

    def arena(self, final=True):
        """The arena's bytes once the buffers are placed: by the strategy's allocator, or (not `final`) as
        searches place them (SEARCHED_BY)."""
        return self.base + self._offsets(final)[0][1]

    def _offsets(self, final=True):
        """((offsets of the buffers, bytes they span), the allocator's options), each allocator's placed once."""
        name = self.allocator if final else SEARCHED_BY.get(self.allocator, self.allocator)
        if name not in self._placed:
            options = _allocator_options(name, self.config, self.steps, *self.intervals[1:])
            if name in SEARCHED_BY and SEARCHED_BY[name] in self._placed:
                options["initial"] = self._placed[SEARCHED_BY[name]][0]
            self._placed[name] = allocators.allocate(name, *self.intervals, ALIGNMENT, **options), options
        return self._placed[name]

    def plan(self):
        """The Plan: every tensor's place, and the steps with their workspaces."""
        graph, config = self.graph, self.config
        (offsets, total), options = self._offsets()
        where, base = {}, 0
        for name, size in self.persistent:
            where[name], base = base, base + allocators.align(size, ALIGNMENT)
        where.update((name, self.base + offset) for (name, _), offset in zip(self.roots, offsets))
        host, host_bytes = self.host.place(self.allocator if self.allocator in HOST_ALLOCATORS else "bestfit")
        where.update(host)
        names, roles, places = {}, _roles(graph, self.training), {}  # names: {dtype: str(dtype)}, as str is slow
        for t in graph.tensors.values():
            root = self.root_of.get(t.name)
            dtype = names.get(t.dtype) or names.setdefault(t.dtype, str(t.dtype))
            places[t.name] = PlannedTensor(t.name, t.shape, dtype, t.kind, t.nbytes, where[root or t.name],
                                           self.life.get(t.name), root, t.name in self.views, roles.get(t.name, ""),
                                           t.host)
        for k, size in enumerate(self.slots):
            name = _slot(k)
            places[name] = PlannedTensor(name, (size,), "uint8", "workspace_slot", size, where[name], None)
        asked = [layout.nbytes for layout in self.scratch.values()]
        ws = {"mode": self.mode, "limit": config.workspace_limit, "requests": len(asked),
              "largest": max(asked, default=0), "total_requested": sum(asked),
              **({"slots": list(self.slots)} if self.mode == "pool" and self.scratch else {})}
        steps = []
        for step, node in enumerate(self.steps):
            used, layout = None, self.scratch.get(node.name)
            if layout is not None:
                if self.mode == "pool":
                    used = _slot(self.slot_of[node.name])
                else:
                    used = _own_workspace(node)
                    places[used] = PlannedTensor(used, (layout.nbytes,), "uint8", "workspace", layout.nbytes,
                                                 where[used], (step, step))
            phase = "recompute" if node.notes.recompute else "" if node.notes.forward else node.notes.phase.value
            steps.append(Step(node.name, node.op, node.inputs, node.outputs, ops.of(node, graph.opsets).normalize(node),
                              used, phase, node.domain, layout.slices if layout else (), graph.opsets.get(node.domain)))
        parts, fullest = breakdown(places, len(steps), self.base + total, trains(self.training))
        return Plan(self.strategy, self.order, self.base + total, self.load, parts, places, tuple(steps),
                    tuple(graph.inputs), tuple(graph.outputs),
                    stats={"allocator": self.allocator, "steps": len(steps), "buffers": len(self.roots),
                           "persistent_bytes": self.base,
                           "inplace": sum(1 for n in self.root_of if n not in self.views),
                           "views": len(self.views), "workspace": ws, "fullest_step": fullest,
                           **({"allocator_proof": options["report"]} if "report" in options else {})},
                    data={t.name: t.data for t in graph.tensors.values() if t.kind in ("param", "const")},
                    opsets=dict(graph.opsets), host_arena_bytes=host_bytes)


HOST_ALLOCATORS = ("naive", "share", "bestfit")
"""The allocators that place the host arena as they place the device's; the others' exact searches place it by
best fit, as the device arena's searches do (SEARCHED_BY)."""


class Host:
    """The host arena's tensors: `persistent` [(name, bytes)] first (an offloaded optimizer's state), then the
    transient buffers [(name, bytes, (first, last))] (swapped-out copies), placed by an allocator as the device's
    are."""

    def __init__(self, persistent, transient):
        self.persistent, self.transient = persistent, transient

    def place(self, allocator):
        """({name: offset in the host arena}, the host arena's bytes), the transient buffers placed by `allocator`."""
        where, base = {}, 0
        for name, size in self.persistent:
            where[name], base = base, base + allocators.align(size, ALIGNMENT)
        if self.transient:
            names, sizes, spans = zip(*self.transient)
            offsets, total = allocators.allocate(allocator, list(sizes), [s for s, _ in spans], [e for _, e in spans],
                                                 ALIGNMENT)
            where.update((name, base + offset) for name, offset in zip(names, offsets))
            base += total
        return where, base


def _scratch(graph, config):
    """{node name: workspace Layout} of the graph's nodes that need scratch."""
    return workspace.layouts(graph, graph.nodes, config.workspace_limit)


def _mode(config):
    """The workspace mode a plan of `config` takes where it has no choice to make: pooled, unless "tensor"."""
    return "tensor" if config.workspace_mode == "tensor" else "pool"


def _slot(k):
    """The name of the k-th pooled workspace slot."""
    return f"workspace:slot{k}"


def _own_workspace(node):
    """The name of the one-step workspace of `node` (workspace_mode "tensor")."""
    return f"{node.name}:workspace"


def _allocator_options(name, config, steps, starts, ends):
    """Settings each allocator takes from the Config; `share` colours nodes when several temp slots
    allow concurrent workers (MXNet's GetExecNumMatchColor)."""
    if name == "share":
        options = {"match_range": config.match_range, "auto_search": config.auto_search_match_range}
        if config.temp_slots > 1 and steps:
            color = workspace.color_nodes(steps, config.temp_slots, {node.name: 1 for node in steps})
            last = len(steps) - 1  # held tensors end after the last step; their blocks are never reused
            options["colors"] = ([color[steps[s].name] for s in starts],
                                 [color[steps[min(e, last)].name] for e in ends])
        return options
    if name == "optimal":  # `report` comes back filled with what the search proved
        return {"time_limit": config.time_limit, "report": {}}
    if name == "auto":
        return {"report": {}}
    return {}


def _roles(graph, training):
    """{tensor: role} of a training graph (see plan.ROLES): gradients, updates, and activations of the
    forward pass that a backward node reads."""
    if not trains(training):  # a generation step's cache, written in place by its update
        return {**{new: "update" for new, _ in graph.updates},
                **{state: "cache" for state, _ in (training or {}).get("kv_cache", {}).get("caches", ())}}
    roles = {g: "gradient" for g in training["grads"].values() if graph.tensors[g].kind == "activation"}
    roles.update((new, "update") for new, _ in graph.updates)
    roles.update((o, "recomputed") for n in graph.nodes if n.notes.recompute for o in n.outputs if o)
    forward = {o for n in graph.nodes if n.notes.forward or ops.of(n, graph.opsets).timed for o in n.outputs}
    for node in graph.nodes:
        if node.notes.phase is Phase.BACKWARD:
            roles.update((i, "saved") for i in node.inputs if i in forward and graph.tensors[i].kind == "activation"
                         and roles.get(i) != "update")
    return roles
