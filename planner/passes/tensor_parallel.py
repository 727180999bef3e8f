"""One rank's forward pass under Megatron-style tensor parallelism (planner.parallel's `tp`; Shoeybi et al.
2019): the linear layers and attention heads of transformer blocks split over `tp` ranks, found in the graph.

A region starts at each column-parallel MatMul (an activation times a 2-D weight whose columns split: each
rank makes its slice of the output features) and follows the slices forward through ops that need only
their own (elementwise ops and their biases, the Split of a fused QKV projection, Reshape into heads,
Transpose, attention and batched MatMuls over heads, Softmax over another axis) to the row-parallel MatMuls
that contract them (the weight's rows split: each rank's product is a partial sum, all-reduced). Each
activation a region reads enters through memplan.ParallelInput (its gradient all-reduced: Megatron's f) and
each row-parallel product leaves through memplan.AllReduce (Megatron's g); the rest of the graph runs whole
on every rank. A region that meets anything else (a graph output, a reduction over the split axis, a weight
read twice) stays whole, as do embeddings, norms and the LM head; one whose split sizes `tp` does not divide
is an error. Facts: "tensor_parallel" (tp, the split params {name: [dim, blocks]}, the column- and
row-parallel layers, the regions left whole)."""
import math
from dataclasses import replace

from .. import ops, shapes
from ..errors import ConfigError
from ..ir import Annotations, Node, Tensor
from ..ops.base import axis as normal_axis
from ..ops.elementwise import Elementwise
from ..parallel import Whole
from .base import TYPED, Pass, Result


class _Whole(Exception):
    """A region's op that cannot work on its slices alone: the region stays whole."""


class _Indivisible(Exception):
    """A region whose split sizes tp does not divide."""


class _Cut:
    """How a tensor is split: on `axis`, which holds `blocks` equal blocks (a fused QKV projection's three),
    each in tp pieces. `fixed` once a reader relies on the layout, so that a later Split can no longer
    make it blocks (only a column-parallel output, read elementwise so far, can)."""

    def __init__(self, axis, blocks=1, fixed=True):
        self.axis, self.blocks, self.fixed = axis, blocks, fixed


class _Sets:
    """Union-find over node indices: the regions."""

    def __init__(self):
        self.parent = {}

    def find(self, k):
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a, b):
        self.parent[self.find(a)] = self.find(b)


class _Region:
    """What the sweep found, by node index, kept or dropped with the node's region."""

    def __init__(self, graph, tp):
        self.graph, self.tp = graph, tp
        self.readers = {}
        for node in graph.nodes:
            for name in dict.fromkeys(i for i in node.inputs if i):
                self.readers[name] = self.readers.get(name, 0) + 1
        self.params, self.attrs, self.rows, self.columns = {}, {}, set(), set()

    def shape(self, name):
        return self.graph.tensors[name].shape

    def cut_param(self, k, name, dim, cut):
        """Split param `name` on `dim` as `cut` says, where node `k` is its only reader."""
        t = self.graph.tensors[name]
        if t.kind != "param" or self.readers[name] != 1:
            raise _Whole(f"{name} is not a weight read once")
        self.params.setdefault(k, []).append((name, dim, cut))


def _tensor_parallel(graph, context):
    parallel = context.options.parallel
    if parallel is None or parallel.tp == 1:
        return Result(graph, False)
    tp = parallel.tp
    region, sets, failed, cuts, made = _Region(graph, tp), _Sets(), {}, {}, {}
    for k, node in enumerate(graph.nodes):
        ins = [cuts.get(i) if i else None for i in node.inputs]
        if not any(ins):
            if _column(region, node):
                cuts[node.outputs[0]], made[node.outputs[0]] = _Cut(len(region.shape(node.outputs[0])) - 1,
                                                                    fixed=False), k
                region.cut_param(k, node.inputs[1], 1, cuts[node.outputs[0]])
                region.columns.add(k)
                sets.find(k)
            continue
        for i in node.inputs:
            if i in cuts:
                sets.union(k, made[i])
        try:
            outs = _rule(node)(region, k, node, ins)
        except (_Whole, _Indivisible) as e:
            failed[k] = e
            continue
        for name, cut in zip(node.outputs, outs):
            if name and cut is not None:
                cuts[name], made[name] = cut, k
    for name in graph.outputs:
        if name in cuts:
            failed.setdefault(made[name], _Whole(f"{name} is a graph output"))
    for name, cut in cuts.items():
        size = region.shape(name)[cut.axis]
        if size % (cut.blocks * tp):
            failed.setdefault(made[name], _Indivisible(f"{name} has {size} on the split axis"))
    dropped = {}
    for k, error in failed.items():
        dropped.setdefault(sets.find(k), []).append(error)
    indivisible = [e for errors in dropped.values() if all(isinstance(x, _Indivisible) for x in errors)
                   for e in errors]
    if indivisible:
        raise ConfigError(f"tensor parallelism over {tp} ranks cannot split {len(indivisible)} layer(s) evenly: "
                          f"{indivisible[0]}, not a multiple of {tp}")
    kept = {k for k in sets.parent if sets.find(k) not in dropped}
    if not kept & region.columns:
        raise ConfigError("tensor parallelism found no linear layers to split: it splits "
                          "MatMuls of 2-D weights whose outputs reach another MatMul's contraction (transformer "
                          "blocks' attention and MLP)")
    typed, split = _rewrite(graph, region, kept, cuts, tp)
    facts = {"tp": tp, "split": split, "column_layers": len(kept & region.columns),
             "row_layers": len(kept & region.rows), "whole_regions": len(dropped),
             "replicated_params": sum(1 for t in typed.params() if t.name not in split)}
    return Result(typed, True, {"tensor_parallel": facts})


def _column(region, node):
    """Whether `node` is a MatMul of an activation by a 2-D weight read nowhere else."""
    if node.op != "MatMul" or node.domain or len(node.inputs) != 2:
        return False
    x, w = (region.graph.tensors[i] for i in node.inputs)
    return (w.kind == "param" and len(w.shape) == 2 and region.readers[w.name] == 1
            and x.kind in ("activation", "input") and len(x.shape) >= 2)


def _rewrite(graph, region, kept, cuts, tp):
    """The rank's typed graph: the kept regions' params cut, their attributes rewritten, their activations
    entered through ParallelInput and their row-parallel products all-reduced; and {param: [dim, blocks]}."""
    tensors, nodes, entered, split = dict(graph.tensors), [], {}, {}
    for k in sorted(kept):
        for name, dim, cut in region.params.get(k, ()):
            t = graph.tensors[name]
            shape = tuple(d // tp if j == dim else d for j, d in enumerate(t.shape))
            tensors[name] = Tensor(name, shape, t.dtype, "param", Whole(t.data, shape))
            split[name] = [dim, cut.blocks]
    for k, node in enumerate(graph.nodes):
        if k not in kept:
            nodes.append(node)
            continue
        inputs = list(node.inputs)
        for j, name in enumerate(inputs):
            if name and name not in cuts and graph.tensors[name].kind in ("activation", "input"):
                if name not in entered:
                    entered[name] = f"{name}/tensor_parallel"
                    nodes.append(Node("ParallelInput", (name,), (entered[name],), {"world": tp, "group": "tp"},
                                      f"tensor_parallel/ParallelInput/{name}", Annotations(node.notes.phase),
                                      "memplan"))
                    tensors[entered[name]] = Tensor(entered[name], None, None, "activation")
                inputs[j] = entered[name]
        outputs = list(node.outputs)
        if k in region.rows:
            outputs[0] = f"{node.outputs[0]}/partial"
            tensors[outputs[0]] = Tensor(outputs[0], None, None, "activation")
        nodes.append(replace(node, inputs=tuple(inputs), outputs=tuple(outputs),
                             attrs={**node.attrs, **region.attrs.get(k, {})}))
        for name in node.outputs:
            if name:
                tensors[name] = Tensor(name, None, None, "activation")
        if k in region.rows:
            nodes.append(Node("AllReduce", (outputs[0],), (node.outputs[0],), {"world": tp, "mean": 0, "group": "tp"},
                              f"tensor_parallel/AllReduce/{node.outputs[0]}", Annotations(node.notes.phase),
                              "memplan"))
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors), graph), dict(sorted(split.items()))


def _rule(node):
    """The rule that follows a region through `node`: fn(region, k, node, input cuts) -> output cuts."""
    if (node.domain, node.op) in RULES:
        return RULES[node.domain, node.op]
    schema = ops.of(node)
    if isinstance(schema, Elementwise):
        return _elementwise
    if schema.identity and len(node.inputs) >= 1:
        return _view
    return _unknown


def _unknown(region, k, node, ins):
    raise _Whole(f"{node.name} ({node.op}) reads a split tensor")


def _elementwise(region, k, node, ins):
    """Broadcasting ops: the split inputs on one output axis, each other input broadcast along it or a
    weight (a bias) cut alike."""
    rank = len(region.shape(node.outputs[0]))
    axes = {c.axis + rank - len(region.shape(i)) for i, c in zip(node.inputs, ins) if c is not None}
    split = [c for c in ins if c is not None]
    if len(axes) > 1 or len({c.blocks for c in split}) > 1:
        raise _Whole(f"{node.name} reads tensors split on different axes")
    (a,) = axes
    for name, c in zip(node.inputs, ins):
        if c is None and name:
            shape = region.shape(name)
            dim = a - (rank - len(shape))
            if dim >= 0 and shape[dim] != 1:
                region.cut_param(k, name, dim, split[0])
    if len({id(c) for c in split}) == 1 and split[0].axis == a:
        return [split[0]] * len(node.outputs)
    for c in split:
        c.fixed = True
    return [_Cut(a, split[0].blocks)] * len(node.outputs)


def _same(region, k, node, ins):
    """Ops that keep their input's layout (Cast, Dropout and its mask)."""
    if any(c is not None for c in ins[1:]):
        raise _Whole(f"{node.name} reads a split tensor past its first input")
    ins[0].fixed = True
    return [ins[0]] * len(node.outputs)


def _softmax(region, k, node, ins):
    c = ins[0]
    if normal_axis(ops.of(node).attr(node, "axis"), len(region.shape(node.inputs[0]))) == c.axis:
        raise _Whole(f"{node.name} normalizes over the split axis")
    c.fixed = True
    return [c]


def _split(region, k, node, ins):
    """Split on the split axis into k equal parts: the input's axis holds k blocks, each output one."""
    c, schema = ins[0], ops.of(node)
    a = normal_axis(schema.attr(node, "axis"), len(region.shape(node.inputs[0])))
    if a != c.axis:
        c.fixed = True
        return [_Cut(c.axis, c.blocks)] * len(node.outputs)
    sizes = schema.split_sizes(node, region.shape(node.inputs[0])[a])
    if len(set(sizes)) != 1 or not (c.blocks == len(sizes) or (c.blocks == 1 and not c.fixed)):
        raise _Whole(f"{node.name} splits the split axis unevenly")
    c.blocks, c.fixed = len(sizes), True
    if schema.attr(node, "split") is not None:
        region.attrs[k] = {"split": [s // region.tp for s in sizes]}
    return [_Cut(a)] * len(node.outputs)


def _view(region, k, node, ins):
    """Reshape and the other views: the split axis lands on the output dim after the same leading elements,
    which the ranks' pieces divide (hidden -> heads x head size, and back)."""
    c, before, after = ins[0], region.shape(node.inputs[0]), region.shape(node.outputs[0])
    c.fixed = True
    lead = math.prod(before[:c.axis])
    for b in range(len(after)):
        if math.prod(after[:b]) == lead and after[b] != 1:
            break
    else:
        raise _Whole(f"{node.name} moves the split axis")
    if math.prod(after[:b]) != lead or (c.blocks > 1 and after[b] != before[c.axis]):
        raise _Whole(f"{node.name} moves the split axis")
    if after[b] % (c.blocks * region.tp):
        raise _Indivisible(f"{node.name} makes a dim of {after[b]} (attention heads?)")
    if node.op == "Reshape":
        region.attrs[k] = {"shape": [d // region.tp if j == b else d for j, d in enumerate(after)]}
    return [_Cut(b, c.blocks)]


def _transpose(region, k, node, ins):
    c = ins[0]
    c.fixed = True
    perm = list(node.attrs.get("perm") or reversed(range(len(region.shape(node.inputs[0])))))
    return [_Cut(perm.index(c.axis), c.blocks)]


def _attention(region, k, node, ins):
    """memplan.ScaledDotProductAttention over heads: Q, K and V split on the heads axis, a bias broadcast
    over heads."""
    q, key, v, *bias = ins
    if any(c is None or c.axis != 1 or c.blocks != 1 for c in (q, key, v)) or any(c is not None for c in bias):
        raise _Whole(f"{node.name} reads Q, K and V not split by heads alike")
    if len(node.inputs) > 3 and node.inputs[3]:
        shape = region.shape(node.inputs[3])
        if len(shape) >= 3 and shape[len(shape) - 3] != 1:
            raise _Whole(f"{node.name} reads a bias of each head")
    return [_Cut(1)] * len(node.outputs)


def _matmul(region, k, node, ins):
    """A row-parallel MatMul (its input split on the contracted features, the weight cut in rows: the
    product all-reduced), or one batched over a split axis."""
    cx, cy = ins
    x, y = (region.shape(i) for i in node.inputs)
    if cx is not None and cy is None and cx.axis == len(x) - 1 and len(y) == 2:
        if cx.blocks != 1:
            raise _Whole(f"{node.name} contracts a fused projection's blocks")
        region.cut_param(k, node.inputs[1], 0, cx)
        region.rows.add(k)
        return [None]
    rank = len(region.shape(node.outputs[0]))
    axes = {c.axis + rank - len(s) for c, s in ((cx, x), (cy, y)) if c is not None}
    if len(axes) != 1 or max(axes) >= rank - 2:
        raise _Whole(f"{node.name} contracts a split axis")
    (a,) = axes
    for c, s in ((cx, x), (cy, y)):
        if c is None and a - (rank - len(s)) >= 0 and s[a - (rank - len(s))] != 1:
            raise _Whole(f"{node.name} reads a whole tensor beside a split one")
        elif c is not None:
            c.fixed = True
    return [_Cut(a, (cx or cy).blocks)]


RULES = {("", "MatMul"): _matmul, ("", "Split"): _split, ("", "Transpose"): _transpose,
         ("", "Softmax"): _softmax, ("", "LogSoftmax"): _softmax, ("", "Cast"): _same, ("", "Dropout"): _same,
         ("memplan", "Dropout"): _same, ("memplan", "BiasActivation"): _elementwise,
         ("memplan", "ScaledDotProductAttention"): _attention}

tensor_parallel = Pass("tensor_parallel", _tensor_parallel, needs=frozenset({TYPED}), makes=frozenset({TYPED}))
