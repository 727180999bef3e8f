"""Small op patterns to find in a graph, and the rewrite that replaces what they match:

    SILU = Op("Mul", "x", Op("Sigmoid", "x"))            # x * sigmoid(x)
    LINEAR = Op("Add", Op("MatMul", "a", "b"), "c")       # a @ b + c
    for m in matches(graph, LINEAR): m.bindings["a"], m.root, m.nodes
    graph, modified = rewrite(graph, LINEAR, lambda m: [Node("Gemm", (a, b, c), m.root.outputs, ...)])

An input of an Op is an Op, matched against the node writing that tensor (as its first output), or a
variable (a str) that binds the tensor; a variable used twice binds the same tensor, and an Op (the same
object) used twice matches the same node. Binary ops of COMMUTATIVE match their inputs in either order. A
match is exclusive: what its inner nodes write is read by no node outside it and is no graph output or
update, and no variable binds it, so replacing the match loses nothing.
"""
from dataclasses import dataclass, replace

from .. import ops, shapes
from ..deferred import is_absent
from ..errors import ModelError
from ..ir import Tensor, op_name

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})
"""ONNX ops whose two inputs may swap."""


@dataclass(frozen=True, init=False)
class Op:
    """A node of a pattern: its op type (in `domain`), its inputs (Ops or variable names), the
    attributes it must have (`attrs`, compared with the op's defaults filled in), and `name`, under
    which a match keeps the node it matched."""

    op: str
    inputs: tuple
    domain: str
    attrs: tuple
    name: str | None

    def __init__(self, op, *inputs, domain="", attrs=None, name=None):
        for key, value in (("op", op), ("inputs", inputs), ("domain", domain),
                           ("attrs", tuple((attrs or {}).items())), ("name", name)):
            object.__setattr__(self, key, value)

    def __str__(self):
        return f"{op_name(self.domain, self.op)}({', '.join(map(str, self.inputs))})"


@dataclass(frozen=True)
class Match:
    """One place a pattern matched: its `root` node (the pattern's outer Op), every node it matched in
    the graph's order, the tensors its variables bound, and the nodes of its named Ops."""

    root: object
    nodes: tuple
    bindings: dict
    named: dict


def constant(graph, name, absent=False):
    """The value of tensor `name` where it is a param or a const holding data (a weight, a folded value),
    else None: what a rewrite may read while planning. A weight without values (planner.deferred.Absent) is
    None, unless `absent`: a rewrite that builds new weights from it lazily (planner.deferred.computed) takes it."""
    t = graph.tensors.get(name)
    if t is None or t.kind not in ("const", "param") or t.data is None:
        return None
    return None if is_absent(t.data) and not absent else t.data


def matches(graph, pattern):
    """The exclusive matches of `pattern` in `graph`, in the order of their roots; where two would share
    a node, the first is kept."""
    taken, found, position = set(), [], {}
    held = {*graph.outputs, *(new for new, _ in graph.updates)}
    for node in graph.nodes:
        if (node.op, node.domain) != (pattern.op, pattern.domain):
            continue
        for bindings, nodes, named in _node(graph, pattern, node, {}, {}, {}):
            variables = {k: v for k, v in bindings.items() if isinstance(k, str)}  # not the Ops' nodes (by id)
            if taken.isdisjoint(nodes) and exclusive(graph, node, nodes, variables.values(), held):
                position = position or {n.name: k for k, n in enumerate(graph.nodes)}
                ordered = tuple(sorted(nodes.values(), key=lambda n: position[n.name]))
                found.append(Match(node, ordered, variables, named))
                taken.update(nodes)
                break
    return found


def rewrite(graph, pattern, build, tensors=None):
    """(graph, modified): the typed `graph` with the nodes of each match of `pattern` replaced by the
    nodes `build(match)` returns (None: that match stays as it is), placed where the root was. They
    must write the root's outputs; the other tensors they write are new, described by `tensors`
    ({name: Tensor}) where they are constants. The result is typed again where it changed (shapes.retype)."""
    built = [(m, build(m)) for m in matches(graph, pattern)]
    return replace_matches(graph, [(m, new) for m, new in built if new is not None], tensors, pattern)


def replace_matches(graph, found, tensors=None, what="a pattern"):
    """(graph, modified): the typed `graph` with the nodes of each (Match, new nodes) of `found` replaced as
    `rewrite` replaces them (`what` names the rewrite in its error)."""
    if not found:
        return graph, False
    instead, gone, tensors = {}, set(), {**graph.tensors, **(tensors or {})}
    for m, new in found:
        new = tuple(new)
        written = {o for n in new for o in n.outputs if o}
        missing = [o for o in m.root.outputs if o and o not in written]
        if missing:
            raise ModelError(f"the rewrite of {what} at node {m.root.name!r} does not write "
                             f"{', '.join(map(repr, missing))}")
        instead[m.root.name] = new
        gone.update(n.name for n in m.nodes)
        tensors.update((o, Tensor(o, None, None, "activation")) for o in written if o not in tensors)
    nodes = [n for node in graph.nodes for n in instead.get(node.name, () if node.name in gone else (node,))]
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors), graph), True


def _node(graph, pattern, node, bindings, nodes, named):
    """Every way `node` matches the Op `pattern`, given what is bound so far: (bindings, nodes, named), the
    bindings holding, besides the variables' tensors, the node each Op matched (by the Op's id)."""
    if (node.op, node.domain) != (pattern.op, pattern.domain) or len(node.inputs) != len(pattern.inputs) \
            or bindings.get(id(pattern), node.name) != node.name:
        return
    defaults = ops.of(node, graph.opsets).defaults
    if any(node.attrs.get(key, defaults.get(key)) != value for key, value in pattern.attrs):
        return
    nodes, bindings = {**nodes, node.name: node}, {**bindings, id(pattern): node.name}
    named = {**named, pattern.name: node} if pattern.name else named
    orders = [pattern.inputs]
    if node.op in COMMUTATIVE and not node.domain and len(pattern.inputs) == 2:
        orders.append(pattern.inputs[::-1])
    for order in orders:
        yield from _inputs(graph, order, node.inputs, bindings, nodes, named)


def _inputs(graph, patterns, tensors, bindings, nodes, named):
    """Every way the tensors match the input patterns, one by one."""
    if not patterns:
        yield bindings, nodes, named
        return
    for state in _value(graph, patterns[0], tensors[0], bindings, nodes, named):
        yield from _inputs(graph, patterns[1:], tensors[1:], *state)


def _value(graph, pattern, tensor, bindings, nodes, named):
    """Every way one tensor matches a pattern: a variable binds it, an Op matches its producer."""
    if isinstance(pattern, str):
        if bindings.get(pattern, tensor) == tensor and tensor:
            yield {**bindings, pattern: tensor}, nodes, named
        return
    producer = graph.producer(tensor)
    if producer is not None and producer.outputs[0] == tensor:
        yield from _node(graph, pattern, producer, bindings, nodes, named)


def exclusive(graph, root, nodes, bound=(), held=None):
    """Whether every tensor the matched `nodes` ({name: Node}) but the root write is read only by matched
    nodes, and is neither `held` (a graph output or update; by default the graph's) nor `bound` (a
    variable's tensor, which the rewrite would read after the node writing it is gone)."""
    held = {*graph.outputs, *(new for new, _ in graph.updates)} if held is None else held
    inner = {o for n in nodes.values() if n is not root for o in n.outputs if o}
    return inner.isdisjoint(bound) and \
        all(o not in held and all(c.name in nodes for c in graph.consumers.get(o, ())) for o in inner)
