"""One rank's forward pass under Megatron-style tensor parallelism (planner.parallel's `tp`; Shoeybi et al.
2019): the linear layers and attention heads of transformer blocks split over `tp` ranks, found in the graph.

A region starts at each column-parallel MatMul or Gemm (an activation times a 2-D weight whose columns split: each
rank makes its share of the output features), or Einsum (a mixture of experts' grouped GEMM, each expert's weight
split alike: its gate/up projection by columns, its down projection by rows) and follows the split forward through
the ops that need only their own share (planner/tensor_split.py: elementwise ops and their biases, the Split or
Slices cutting a fused projection into consecutive blocks of any sizes, each block cut over the ranks (QKV,
grouped-query included; gate and up), reshapes into heads and the exporters' merges of heads with the batch,
transposes, RoPE's slices, grouped-query expands, attention, batched MatMuls over heads, Softmax over another axis)
to the row-parallel MatMuls, Gemms or Einsums that contract it (the weight's rows split: each rank's product is a
partial sum, all-reduced, a Gemm's bias added after). Each activation a region reads enters through
memplan.ParallelInput (its gradient all-reduced: Megatron's f) and each row-parallel product leaves through memplan.AllReduce
(Megatron's g); the rest of the graph runs whole on every rank. A region that meets anything else (a graph
output, a reduction over the split axis, overlapping or strided slices of it) stays whole, as do embeddings,
norms and the LM head; one whose split sizes `tp` does not divide is an error, the ops failing only for want
of such a split (attention reading key heads fewer than ranks) included. A 1-D weight the region shares with
other readers (an exporter's one initializer for equal biases) is read through this rank's piece
(memplan.Shard). Facts: "tensor_parallel" (tp, the split params {name: [dim, blocks]}: blocks a count where
equal, else their sizes; the column- and row-parallel layers, the regions left whole, the params left whole)."""
from dataclasses import replace
from functools import partial

from .. import shapes
from ..errors import ConfigError
from ..builder import FreshNames
from ..ir import Annotations, Node, Tensor
from ..parallel import Whole
from ..tensor_split import Cut, Indivisible, Region, Unsplittable, column, rule
from .base import TYPED, Pass, Property, Result


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


def tensor_parallel(tp):
    """The Pass making one rank's forward pass of `tp` tensor-parallel ranks (tp > 1)."""
    split = Property(f"with each split param holding 1/{tp} of its whole", partial(_pieces, tp=tp))
    return Pass("tensor_parallel", partial(_tensor_parallel, tp=tp), needs=frozenset({TYPED}), makes=frozenset({TYPED}),
                ensures=frozenset({split}))


def _pieces(graph, facts, tp):
    """Whether each param the facts name split is typed as its piece, holding its whole: the split dim 1/tp."""
    for name, (dim, _) in facts["tensor_parallel"]["split"].items():
        t = graph.tensors[name]
        if not isinstance(t.data, Whole) or tuple(t.data.value.shape) != tuple(
                d * tp if j == dim else d for j, d in enumerate(t.shape)):
            return False
    return True


def _tensor_parallel(graph, context, tp):
    region, sets, failed, cuts, made, short = Region(graph, tp), _Sets(), {}, {}, {}, set()
    for k, node in enumerate(graph.nodes):
        ins = [cuts.get(i) if i else None for i in node.inputs]
        follows = not short.isdisjoint(node.inputs)  # it reads what is made of a split tp could not make
        try:
            if not any(ins):
                dim = column(region, node)
                if dim is not None:
                    sets.find(k)
                    _columns(region, k, node, dim, cuts, made, failed)
                elif follows:
                    short.update(node.outputs)
                continue
            for i in node.inputs:
                if i in cuts:
                    sets.union(k, made[i])
            outs = rule(node)(region, k, node, ins)
        except (Unsplittable, Indivisible) as e:
            failed.setdefault(k, []).extend([] if follows else [e])  # a follower fails for that split's reason
            if follows or isinstance(e, Indivisible):
                short.update(node.outputs)
            continue
        for name, cut in zip(node.outputs, outs):
            if name and cut is not None:
                cuts[name], made[name] = cut, k
    for name in graph.outputs:
        if name in cuts:
            failed.setdefault(made[name], []).append(Unsplittable(f"{name} is a graph output"))
    dropped = {}
    for k, errors in failed.items():
        dropped.setdefault(sets.find(k), []).extend(errors)
    indivisible = [e for errors in dropped.values() if all(isinstance(x, Indivisible) for x in errors)
                   for e in errors]
    if indivisible:
        raise ConfigError(f"tensor parallelism over {tp} ranks cannot split every layer evenly: {indivisible[0]}")
    kept = {k for k in sets.parent if sets.find(k) not in dropped}
    if not kept & region.columns:
        raise ConfigError("tensor parallelism found no linear layers to split: it splits MatMuls and Gemms of "
                          "2-D weights whose outputs reach another one's contraction (transformer blocks' attention "
                          "and MLPs)")
    typed, split = _rewrite(graph, region, kept, cuts, tp)
    facts = {"tp": tp, "split": split, "column_layers": len(kept & region.columns),
             "row_layers": len(kept & region.rows), "whole_regions": len(dropped),
             "replicated_params": sum(1 for t in typed.params() if t.name not in split)}
    return Result(typed, True, {"tensor_parallel": facts})


def _columns(region, k, node, dim, cuts, made, failed):
    """Node `k`, a column-parallel layer: its output split in runs, its weight cut on `dim`, a Gemm's bias
    cut alike. Features tp does not divide fail the region once followed (an LM head's vocabulary, which
    reaches a graph output, leaves it whole without an error)."""
    out = node.outputs[0]
    rank, size = len(region.shape(out)), region.shape(out)[-1]
    cut = Cut(rank - 1, (size // region.tp,), fixed=False)
    region.columns.add(k)
    cuts[out], made[out] = cut, k
    if size % region.tp:
        failed.setdefault(k, []).append(Indivisible(f"{node.name} makes {size} features, not a multiple of "
                                                    f"{region.tp}"))
        return
    region.cut_operand(k, 1, node.inputs[1], dim, cut)
    if len(node.inputs) > 2 and node.inputs[2]:
        region.broadcast(k, 2, node.inputs[2], rank - 1, rank, cut)


def _rewrite(graph, region, kept, cuts, tp):
    """The rank's typed graph: the kept regions' params cut, their attributes rewritten, their shared weights
    read through this rank's piece, their activations entered through ParallelInput and their row-parallel
    products all-reduced (a Gemm's bias added after); and {param: [dim, blocks]}."""
    tensors, nodes, entered, split, pieces = dict(graph.tensors), [], {}, {}, {}
    fresh = FreshNames({*(n.name for n in graph.nodes), *graph.tensors})
    for k in sorted(kept):
        for name, dim, cut in region.params.get(k, ()):
            t = graph.tensors[name]
            shape = tuple(d // tp if j == dim else d for j, d in enumerate(t.shape))
            tensors[name] = Tensor(name, shape, t.dtype, "param", Whole(t.data, shape))
            split[name] = [dim, cut.blocks(tp)]
            for copy in graph.consumers[name]:  # autocast's 16-bit copy (Region.weight) is the piece's
                if (copy.op, copy.domain) == ("Cast", ""):
                    tensors[copy.outputs[0]] = replace(tensors[copy.outputs[0]], shape=shape)

    def add(op, inputs, output, name, notes, domain="", **attrs):
        """Append a node of `op` named `name` (or as its output, None) writing the new tensor `output`, both
        names made fresh: the output's name."""
        output = fresh(output)
        nodes.append(Node(op, tuple(inputs), (output,), attrs, output if name is None else fresh(name),
                          Annotations(notes.phase), domain))
        tensors[output] = Tensor(output, None, None, "activation")
        return output

    for k, node in enumerate(graph.nodes):
        if k not in kept:
            nodes.append(node)
            continue
        inputs = list(node.inputs)
        for j, name, cut in region.pieces.get(k, ()):
            if (name, cut.spans) not in pieces:
                pieces[name, cut.spans] = _piece(add, graph.tensors[name], cut.spans, tp, node.notes)
            inputs[j] = pieces[name, cut.spans]
        bias = inputs.pop(2) if k in region.rows and node.op == "Gemm" and len(inputs) > 2 else ""
        for j, name in enumerate(inputs):
            if name in graph.tensors and name not in cuts and graph.tensors[name].kind in ("activation", "input"):
                if name not in entered:
                    entered[name] = add("ParallelInput", (name,), f"{name}/tensor_parallel",
                                        f"tensor_parallel/ParallelInput/{name}", node.notes, "memplan", world=tp,
                                        group="tp")
                inputs[j] = entered[name]
        outputs = list(node.outputs)
        if k in region.rows:
            outputs[0] = fresh(f"{node.outputs[0]}/partial")
            tensors[outputs[0]] = Tensor(outputs[0], None, None, "activation")
        nodes.append(replace(node, inputs=tuple(inputs), outputs=tuple(outputs),
                             attrs={**node.attrs, **region.attrs.get(k, {})}))
        for name in node.outputs:
            if name:
                tensors[name] = Tensor(name, None, None, "activation")
        if k in region.rows:
            reduced = fresh(f"{node.outputs[0]}/reduced") if bias else node.outputs[0]
            nodes.append(Node("AllReduce", (outputs[0],), (reduced,), {"world": tp, "mean": 0, "group": "tp"},
                              fresh(f"tensor_parallel/AllReduce/{node.outputs[0]}"), Annotations(node.notes.phase),
                              "memplan"))
            if bias:
                tensors[reduced] = Tensor(reduced, None, None, "activation")
                nodes.append(Node("Add", (reduced, bias), (node.outputs[0],), {},
                                  fresh(f"tensor_parallel/Add/{node.name}"), Annotations(node.notes.phase)))
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors), graph), dict(sorted(split.items()))


def _piece(add, t, spans, tp, notes):
    """This rank's piece of the 1-D weight or constant `t` whose dim holds blocks of `spans` a rank (memplan.Shard
    of its rank-major reordering: each block's (tp, span) side by side), its nodes appended by `add` (see
    _rewrite): its name. The piece's gradient all-gathers every rank's, so that the whole one's is alike on every
    rank."""
    def step(op, inputs, what, domain="", **attrs):
        return add(op, inputs, f"{t.name}/tensor_parallel/{what}/{len(spans)}", None, notes, domain, **attrs)
    x, start, blocks = t.name, 0, []
    if len(spans) > 1:
        for span in spans:
            block = step("Slice", (x,), "block", starts=[start], ends=[start + tp * span], axes=[0])
            blocks.append(step("Reshape", (block,), "by_rank", shape=[tp, span]))
            start += tp * span
        x = step("Reshape", (step("Concat", blocks, "blocks", axis=1),), "flat", shape=[-1])
    return step("Shard", (x,), "Shard", domain="memplan", world=tp, unit=1, group="tp")
