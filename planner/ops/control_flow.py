"""Control flow, planned statically: an If, Loop or Scan is replaced during shape inference by the nodes
of its subgraphs (`expand`), renamed into the outer graph. An If whose condition is known takes one
branch; otherwise both run and `Select` keeps the taken one's outputs (so the arena holds both
branches' outputs, and the larger branch's temporaries). A Loop is unrolled one iteration at a time
while its trip count and condition are known; a Scan, over the static length of its scan inputs. What
unrolling adds is bounded by MAX_UNROLLED nodes, nested Loops and Scans multiplied: each Loop or Scan is
measured before its first copy is made (`unrolled`), and shape inference counts what they all add."""
from dataclasses import replace

import numpy as np
import onnx

from .registry import schema
from .base import Schema
from ..errors import ShapeError
from ..ir import Graph, Node, Tensor, captured

MAX_ITERATIONS = 1024
"""Most iterations a Loop or Scan is unrolled to: each one is a copy of its body in the plan."""
MAX_UNROLLED = 1 << 16
"""Most nodes unrolling a model's control flow may add, in all: each is planned (a Loop of 1,024 inside a
Loop of 1,024 would add a million and plan for many minutes)."""


def check_unrolled(count, what="unrolling the model's control flow makes"):
    """Raise ShapeError when `count` nodes of unrolled control flow are more than MAX_UNROLLED."""
    if count > MAX_UNROLLED:
        raise ShapeError(f"{what} {count:,} nodes, more than the {MAX_UNROLLED:,} memplan unrolls "
                         "(planner.ops.control_flow.MAX_UNROLLED)")


def unrolled(graph, scope):
    """At least how many nodes `graph` becomes once its control flow is unrolled, without unrolling it: its
    nodes, and for each Loop or Scan the nodes of its body times the iterations known now (a Loop's trip
    count when `scope`, {name: Tensor or Info} of the names it sees, or the graph's constants give it and its
    body passes the condition on unchanged; else one), for an If its smaller branch."""
    defined = {*graph.inputs, *(o for n in graph.nodes for o in n.outputs)}
    scope = {**{k: v for k, v in scope.items() if k not in defined},
             **{t.name: t for t in graph.tensors.values() if t.kind in ("param", "const")}}
    total = 0
    for node in graph.nodes:
        total += 1
        if node.domain:
            continue
        if node.op == "If":
            total += min(unrolled(node.attrs["then_branch"], scope), unrolled(node.attrs["else_branch"], scope))
        elif node.op in ("Loop", "Scan"):
            trips = _trips(node, [scope.get(i) for i in node.inputs[:2]]) if node.op == "Loop" else 1
            total += trips * unrolled(node.attrs["body"], scope)
    return total


def _trips(node, known):
    """The iterations a Loop runs at least: its trip count M when it and the condition are known (`known`,
    the Tensor or Info of each input, None where unknown) and its body passes the condition on unchanged;
    else one."""
    count, going = (_known(node.inputs[k] if k < len(node.inputs) else "", known[k] if k < len(known) else None)
                    for k in (0, 1))
    if going is not None and not going:
        return 0
    return 1 if count is None or not _keeps_going(node.attrs["body"]) else max(int(count), 0)


def _known(name, source):
    """The one value of input `name` from its Tensor's data or Info's value, or None where unknown."""
    data = None if not name or source is None else source.data if isinstance(source, Tensor) else source.value
    return None if data is None or np.size(data) != 1 else np.ravel(np.asarray(data))[0]


def _keeps_going(body):
    """Whether a Loop body gives back its condition unchanged (through Identity nodes) or a true constant,
    so that only the trip count ends the loop."""
    if not body.outputs or len(body.inputs) < 2:
        return False
    cond, made = body.outputs[0], {o: n for n in body.nodes for o in n.outputs}
    while cond in made and made[cond].op == "Identity" and not made[cond].domain:
        cond = made[cond].inputs[0]
    t = body.tensors.get(cond)
    value = _known(cond, t) if t is not None and t.kind == "const" else None
    return cond == body.inputs[1] or bool(value is not None and value)


def _check_copies(node, ins, iterations):
    """Refuse a Loop or Scan whose `iterations` copies of its body unroll to more than MAX_UNROLLED nodes,
    before any is made; `ins` the Infos of its inputs, among them the names its body captures."""
    names = captures(node)
    scope = dict(zip(names, ins[len(ins) - len(names):]))
    body = unrolled(node.attrs["body"], scope)
    check_unrolled(iterations * body, f"unrolling it ({iterations:,} iterations of a body of {body:,} nodes, "
                                      "nested Loops and Scans multiplied) makes at least")


def inline(body, prefix, bound, node, targets=()):
    """The nodes of subgraph `body` of `node` renamed into the outer graph, the tensors they add, and the
    outer names of the body's outputs. `bound` maps the body's inputs to outer names, the names the body
    captures are the node's (see `captures`), a body output a body node makes is written straight into
    its outer name in `targets`, and every other name the body defines gets `prefix`."""
    names = {**captures(node), **bound}
    made = {o for n in body.nodes for o in n.outputs if o}
    written = {}
    for out, target in zip(body.outputs, targets):
        if target and out in made:
            written.setdefault(out, target)
    tensors = {}
    for name, t in body.tensors.items():
        if t.kind in ("param", "const") and name not in body.inputs:
            names[name] = prefix + name
            tensors[prefix + name] = replace(t, name=prefix + name)
    for out in made - set(written):
        names[out] = prefix + out
        tensors[prefix + out] = Tensor(prefix + out, None, None, "activation")
    names.update(written)
    nodes = [replace(n, inputs=tuple(names.get(i, i) for i in n.inputs), name=prefix + n.name,
                     outputs=tuple(names.get(o, o) for o in n.outputs)) for n in body.nodes]
    return nodes, tensors, [names.get(o, o) for o in body.outputs]


def captures(node):
    """{name a subgraph of `node` captures: the outer name the node reads for it}: the frontend appended
    the captured names, sorted, after the node's ONNX inputs (renamed since, where the node was inlined)."""
    names = captured(*(v for v in node.attrs.values() if isinstance(v, Graph)))
    return dict(zip(names, node.inputs[len(node.inputs) - len(names):]))


def _const(name, value):
    return Tensor(name, np.shape(value), np.asarray(value).dtype, "const", np.asarray(value))


def _bind(node, sources, outputs):
    """Identity nodes writing the node's outputs from `sources` (omitted outputs skipped)."""
    return [Node("Identity", (src,), (out,), {}, f"{node.name}/out{k}") for k, (src, out) in
            enumerate(zip(sources, outputs)) if out and src != out]


def _stacked(parts, out, axis, opset):
    """The nodes stacking the per-iteration tensors `parts` along a new `axis` into `out`, and the
    tensors they add."""
    if not parts:
        raise ShapeError(f"its scan output {out!r} has no iterations, so no known shape")
    axes = f"{out}/axes"
    tensors = {axes: _const(axes, np.array([axis], np.int64))} if opset >= 13 else {}
    nodes, pieces = [], []
    for k, part in enumerate(parts):
        piece = f"{out}/{k}"
        tensors[piece] = Tensor(piece, None, None, "activation")
        inputs, attrs = ((part, axes), {}) if opset >= 13 else ((part,), {"axes": [axis]})
        nodes.append(Node("Unsqueeze", inputs, (piece,), attrs, f"{piece}/unsqueeze"))
        pieces.append(piece)
    return nodes + [Node("Concat", tuple(pieces), (out,), {"axis": axis}, f"{out}/concat")], tensors


@schema("If")
class If(Schema):
    """If: the then_branch when `cond` is true, else the else_branch."""

    def expand(self, node, ins, opsets):
        then, other = node.attrs["then_branch"], node.attrs["else_branch"]
        if len(then.outputs) != len(other.outputs):
            raise ShapeError(f"its branches give {len(then.outputs)} and {len(other.outputs)} outputs")
        if ins[0].value is not None:
            if np.size(ins[0].value) != 1:
                raise ShapeError(f"its condition must be one value, got shape {ins[0].shape}")
            nodes, tensors, outs = inline(then if bool(np.ravel(ins[0].value)[0]) else other,
                                          f"{node.name}/", {}, node, node.outputs)
            return nodes + _bind(node, outs, node.outputs), tensors
        a, ta, outs_a = inline(then, f"{node.name}/then/", {}, node)
        b, tb, outs_b = inline(other, f"{node.name}/else/", {}, node)
        select = [Node("Select", (node.inputs[0], x, y), (out,), {}, f"{node.name}/select{k}", domain="memplan")
                  for k, (x, y, out) in enumerate(zip(outs_a, outs_b, node.outputs)) if out]
        return a + b + select, {**ta, **tb}


@schema("Select", domain="memplan")
class Select(Schema):
    """Y = A if the scalar C is true else B, A and B of one shape and dtype: the outputs of an If whose
    condition is known only when running (both branches ran)."""

    types = (("B", "T", "T"), {"B": frozenset({"tensor(bool)"}), "T": frozenset(
        t for c in onnx.defs.get_schema("Identity").type_constraints for t in c.allowed_type_strs if t.startswith("tensor("))})
    flops = staticmethod(lambda node, ins, outs: 0)

    def infer(self, node, ins):
        c, a, b = ins
        if np.prod(c.shape) != 1:
            raise ShapeError(f"the condition must be one value, got shape {c.shape}")
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            raise ShapeError(f"the branches give {a.shape} {a.dtype} and {b.shape} {b.dtype}; a static plan "
                             "needs both branches to give one shape and dtype")
        return [(a.shape, a.dtype)]

    def kernel(self, xp, step, ins, outs, ws):
        c, a, b = ins
        xp.copyto(outs[0], a if bool(c.reshape(())) else b)

    def torch(self, torch, c, a, b):
        return torch.where(c.reshape(()), a, b)


def _count(info, what):
    """The value of a scalar input planning must know (a trip count, a condition)."""
    if info.value is None:
        raise ShapeError(f"its {what} depends on input data; a static plan needs it known when planning")
    if np.size(info.value) != 1:
        raise ShapeError(f"its {what} must be one value, got shape {info.shape}")
    return np.ravel(info.value)[0]


@schema("Loop")
class Loop(Schema):
    """Loop: the body runs while the iteration is below the trip count M and the condition holds, each
    run reading (iteration, condition, the loop-carried values) and giving (condition, the new values,
    the scan outputs, stacked along a new first axis). Unrolled one iteration at a time: the body's
    nodes, then this node again for the next iteration (its progress in `_iteration` and `_parts`), so
    that a condition the body computes from constants is known before the next is planned."""

    def expand(self, node, ins, opsets):
        body = node.attrs["body"]
        carried = len(body.inputs) - 2
        trip = None if not node.inputs[0] else int(_count(ins[0], "trip count M"))
        going = True if not node.inputs[1] else bool(_count(ins[1], "condition"))
        i, parts = node.attrs.get("_iteration", 0), node.attrs.get("_parts", ())
        state = node.inputs[2:2 + carried]
        if not going or (trip is not None and i >= trip):
            scans = [_stacked(parts_k, out, 0, opsets[""]) for parts_k, out in
                     zip(zip(*parts) if parts else [()] * (len(body.outputs) - 1 - carried), node.outputs[carried:]) if out]
            return (_bind(node, state, node.outputs[:carried]) + [n for ns, _ in scans for n in ns],
                    {k: t for _, ts in scans for k, t in ts.items()})
        if i >= MAX_ITERATIONS:
            raise ShapeError(f"it runs more than {MAX_ITERATIONS} iterations, the most memplan unrolls")
        if i == 0:
            counted = trip is not None and _keeps_going(body)
            if counted and trip > MAX_ITERATIONS:
                raise ShapeError(f"it runs {trip:,} iterations, more than the {MAX_ITERATIONS} memplan unrolls")
            _check_copies(node, ins, trip if counted else 1)
        prefix = f"{node.name}/{i}/"
        tensors = {prefix + "iteration": _const(prefix + "iteration", np.array(i, np.int64)),
                   prefix + "condition": _const(prefix + "condition", np.array(True))}
        bound = dict(zip(body.inputs, (prefix + "iteration", node.inputs[1] or prefix + "condition", *state)))
        nodes, made, outs = inline(body, prefix, bound, node)
        again = replace(node, inputs=(node.inputs[0], outs[0], *outs[1:1 + carried], *node.inputs[2 + carried:]),
                        attrs={**node.attrs, "_iteration": i + 1, "_parts": (*parts, tuple(outs[1 + carried:]))})
        return nodes + [again], {**tensors, **made}


@schema("Scan")
class Scan(Schema):
    """Scan: the body runs once per slice of the scan inputs along their scan axes (the length known
    from their shapes), reading (the states, one slice of each scan input) and giving (the new states,
    one slice of each scan output), the slices taken and stacked in each one's direction."""

    def expand(self, node, ins, opsets):
        body = node.attrs["body"]
        m = node.attrs["num_scan_inputs"]
        n = len(body.inputs) - m
        onnx_inputs = len(node.inputs) - len(captures(node))
        if onnx_inputs != n + m:
            raise ShapeError(f"it has {onnx_inputs} inputs, its body reads {n + m}")
        axes = [a % ins[n + j].rank for j, a in enumerate(node.attrs.get("scan_input_axes", [0] * m))]
        backwards = node.attrs.get("scan_input_directions", [0] * m)
        lengths = {ins[n + j].shape[a] for j, a in enumerate(axes)}
        if len(lengths) != 1:
            raise ShapeError(f"its scan inputs have different lengths {sorted(lengths)} along their scan axes")
        length = lengths.pop()
        if length > MAX_ITERATIONS:
            raise ShapeError(f"it runs {length} iterations, more than the {MAX_ITERATIONS} memplan unrolls")
        _check_copies(node, ins, length)
        nodes, tensors, state, parts = [], {}, list(node.inputs[:n]), []
        for t in range(length):
            prefix = f"{node.name}/{t}/"
            slices = []
            for j, a in enumerate(axes):
                index, piece = f"{prefix}index{j}", f"{prefix}slice{j}"
                tensors[index] = _const(index, np.array(length - 1 - t if backwards[j] else t, np.int64))
                tensors[piece] = Tensor(piece, None, None, "activation")
                nodes.append(Node("Gather", (node.inputs[n + j], index), (piece,), {"axis": a}, f"{prefix}gather{j}"))
                slices.append(piece)
            made_nodes, made, outs = inline(body, prefix, dict(zip(body.inputs, (*state, *slices))), node)
            nodes += made_nodes
            tensors.update(made)
            state, parts = outs[:n], [*parts, outs[n:]]
        k = len(body.outputs) - n
        out_axes = node.attrs.get("scan_output_axes", [0] * k)
        forwards = [not d for d in node.attrs.get("scan_output_directions", [0] * k)]
        for j, out in enumerate(node.outputs[n:]):
            if out:
                pieces = [p[j] for p in parts] if forwards[j] else [p[j] for p in reversed(parts)]
                stacked, made = _stacked(pieces, out, out_axes[j], opsets[""])
                nodes += stacked
                tensors.update(made)
        return nodes + _bind(node, state, node.outputs[:n]), tensors
