"""One rank's forward pass under Megatron-LM's sequence parallelism (planner.parallel's `sequence_parallel`;
Korthikanti et al. 2022, section 4.2.2), once tensor parallelism has split the blocks' linear layers
(planner/passes/tensor_parallel.py) and training mode has drawn the dropouts' masks.

What tensor parallelism leaves whole on every rank between its regions, each token's own computation (the norms,
residual and bias adds, dropouts), runs on 1/tp of the sequence: a rank holds its run of each sequence of the batch,
dim 1 of the (batch, sequence, features) tensors (its run of each batch row where the export merges batch and
sequence in one dim). Megatron's f before a column-parallel layer becomes an all-gather of the sequence whose
gradient is reduce-scattered (memplan.AllGather with `axis` and `partial`: g-bar); the all-reduce after a
row-parallel layer a reduce-scatter along the sequence, whose gradient is all-gathered; the first whole tensor the
layers read (the embeddings' sum) enters by this rank's runs (memplan.Shard, its gradient all-gathered); what runs
whole after the last layer (the LM head and the loss, on every rank as tensor parallelism leaves them) reads the
sequence all-gathered, its gradient this rank's runs, so that the final norm stays sharded. A weight such an op
reads whole (a norm's scale and bias, a bias added after the reduce-scatter) gets a part of its gradient on each
rank, summed over them (ParallelInput), as Megatron all-reduces the layer norms' gradients; a rank's dropout masks
are drawn from its own counter (the step offset by rank), as Megatron draws them from its model-parallel generator.

An op runs on the rank's tokens by its schema's `split` where its outputs hold the tokens whole: "elementwise" (its
inputs holding the sequence cut alike, the others broadcast along it), "same" (Dropout), "norm" (over dims after
the sequence), "softmax" (over another dim), and "view" between such tensors. It does where it reads a sharded
tensor, or where the sharded layers read its output and it reads one tensor of tokens (where it reads several, none
sharded, as the token and position embeddings' sum, its output is scattered instead, once). A sequence tp does not
divide is an error. Facts: "sequence_parallel" (tp, batch, sequence, the sharded nodes, the reduce-scatters and
all-gathers made of tensor parallelism's collectives and those kept, the tensors scattered and gathered)."""
from dataclasses import replace
from functools import partial

import numpy as np

from .. import ops, shapes
from ..builder import FreshNames
from ..dtypes import is_float
from ..errors import ConfigError
from ..ir import Annotations, Node, Tensor
from ..ops.base import axis as normal_axis
from ..ops.collectives import AllGather, AllReduce, ParallelInput, ReduceScatter, Shard
from ..training import STEP
from .base import TYPED, Pass, Property, Result

KINDS = ("elementwise", "same", "norm", "softmax", "view")
"""The `split` rules of the ops that can run on the rank's tokens (see the module)."""
COLLECTIVES = (AllGather, AllReduce, ParallelInput, ReduceScatter, Shard)
STRIDE = 0x9E3779B9
"""How far apart the ranks' dropout counters run (2^32 over the golden ratio steps), so that no two draw alike."""


def sequence_parallel(tp):
    """The Pass sharding the sequence between the tensor-parallel regions of one of `tp` ranks (tp > 1)."""
    done = Property("with no all-reduce left whose sum a token's own computation reads", _reduced)
    return Pass("sequence_parallel", partial(_sequence_parallel, tp=tp), needs=frozenset({TYPED}),
                makes=frozenset({TYPED}), ensures=frozenset({done}))


def _reduced(graph, facts):
    """Whether each tensor-parallel all-reduce kept is read by no op that could run on the rank's tokens."""
    found = facts["sequence_parallel"]
    tokens = _Tokens(graph, found["batch"], found["sequence"])
    return not any(tokens.reads(reader, node.outputs[0]) for node in graph.nodes if _exit(node)
                   for reader in graph.consumers[node.outputs[0]])


def _sequence_parallel(graph, context, tp):
    split = context.facts["tensor_parallel"]["split"]
    entries = [k for k, node in enumerate(graph.nodes) if isinstance(ops.of(node), ParallelInput) and any(
        r.inputs[0] == node.outputs[0] and len(r.inputs) > 1 and r.inputs[1] in split and ops.of(r).split in
        ("matmul", "gemm") for r in graph.consumers[node.outputs[0]])]
    exits = [k for k, node in enumerate(graph.nodes) if _exit(node)]
    batch, seq = _sequence(graph, entries)
    if seq % tp:
        raise ConfigError(f"sequence parallelism over {tp} ranks splits the sequence evenly: {seq} tokens is not a "
                          f"multiple of {tp}")
    sweep = _Sweep(_Tokens(graph, batch, seq), entries, exits)
    typed = _rewrite(graph, sweep, tp)
    facts = {"tp": tp, "batch": batch, "sequence": seq, "sharded_nodes": len(sweep.nodes),
             "reduce_scatters": len(sweep.exits), "all_reduces_kept": len(exits) - len(sweep.exits),
             "all_gathers": len(sweep.entries), "inputs_kept": len(entries) - len(sweep.entries),
             "scattered": sorted(sweep.scattered), "gathered": sorted(sweep.gathered)}
    return Result(typed, True, {"sequence_parallel": facts})


def _exit(node):
    """Whether `node` is tensor parallelism's all-reduce of a row-parallel product."""
    return isinstance(ops.of(node), AllReduce) and node.attrs.get("group") == "tp"


def _sequence(graph, entries):
    """(batch, sequence) of the (batch, sequence, features) tensor the first column-parallel layer reads (or a
    view of)."""
    for k in entries:
        name = graph.nodes[k].inputs[0]
        while len(graph.tensors[name].shape) < 3 and graph.producer(name) is not None and \
                ops.of(graph.producer(name)).split == "view":
            name = graph.producer(name).inputs[0]
        shape = graph.tensors[name].shape
        if len(shape) >= 3:
            return shape[0], shape[1]
    raise ConfigError("sequence parallelism finds no (batch, sequence, features) tensor that a column-parallel "
                      "layer reads")


class _Tokens:
    """The layout of the tokens of `batch` sequences of `seq`: where a tensor holds them, and the ops that can run on
    a rank's run of each sequence alone. A cut is (axis, blocks): the dim holding the sequence
    and how many sequences that dim holds one after the other (memplan's collectives' `axis` and `blocks`)."""

    def __init__(self, graph, batch, seq):
        self.graph, self.batch, self.seq = graph, batch, seq

    def cut(self, name):
        """The cut of tensor `name` where it holds the tokens whole, leading its dims: (batch, sequence, ...), or
        (batch * sequence, ...); else None."""
        shape = self.graph.tensors[name].shape
        if len(shape) >= 2 and tuple(shape[:2]) == (self.batch, self.seq):
            return 1, 1
        return (0, self.batch) if len(shape) >= 1 and shape[0] == self.batch * self.seq else None

    def rule(self, node):
        """(the cut of its outputs, {input index: cut} of the inputs it reads the tokens of) where `node` can run on
        a rank's tokens alone (see the module); else None."""
        schema, outs = ops.of(node), [o for o in node.outputs if o]
        if schema.split not in KINDS or isinstance(schema, COLLECTIVES) or not outs or \
                not set(outs).isdisjoint(self.graph.outputs) or len({self.cut(o) for o in outs}) != 1:
            return None
        cut = self.cut(outs[0])
        if cut is None:
            return None
        axis, rank = cut[0], len(self.graph.tensors[outs[0]].shape)
        over = None if schema.split not in ("norm", "softmax") else normal_axis(schema.attr(node, "axis"), rank)
        if (schema.split == "norm" and over <= axis) or (schema.split == "softmax" and over == axis):
            return None
        if schema.split == "view":
            ins = {0: self.cut(node.inputs[0])}
            return (cut, ins) if ins[0] else None
        ins = {}
        for j, name in enumerate(node.inputs[:1] if schema.split == "same" else node.inputs):
            shape = self.graph.tensors[name].shape if name else ()
            dim = axis - (rank - len(shape))
            if name and dim >= 0 and shape[dim] != 1:
                ins[j] = (dim, cut[1])
                if self.cut(name) not in (None, ins[j]):  # holds the tokens, but not where this op reads them
                    return None
        return (cut, ins) if ins else None

    def reads(self, node, name):
        """Whether `node` could run on a rank's tokens reading those of tensor `name`."""
        rule = self.rule(node)
        return rule is not None and any(node.inputs[j] == name for j in rule[1])


class _Sweep:
    """What runs on the rank's tokens: the least set of nodes (`nodes`, index -> rule) holding every node that can
    and reads a sharded tensor, and every one that can, reads one tensor of tokens and makes what a sharded node
    or column-parallel layer reads; the tensors they make (`cuts`), the whole ones they read cut (`scattered`), the
    sharded ones the rest reads gathered (`gathered`), the row-parallel products reduce-scattered (`exits`) and the
    column-parallel inputs all-gathered (`entries`)."""

    def __init__(self, tokens, entries, exits):
        graph = tokens.graph
        rules = {k: rule for k, node in enumerate(graph.nodes) if (rule := tokens.rule(node))}
        self.exits = [k for k in exits if any(tokens.reads(r, graph.nodes[k].outputs[0])
                                              for r in graph.consumers[graph.nodes[k].outputs[0]])]
        self.cuts = {graph.nodes[k].outputs[0]: tokens.cut(graph.nodes[k].outputs[0]) for k in self.exits}
        self.nodes, wanted, grown = {}, {graph.nodes[k].inputs[0] for k in entries}, True
        while grown:
            grown = False
            for k in [*rules, *reversed(rules)]:  # forward, then back to what is wanted
                node, (cut, ins) = graph.nodes[k], rules[k]
                if k in self.nodes or not (any(node.inputs[j] in self.cuts for j in ins) or (
                        len(ins) == 1 and not wanted.isdisjoint(node.outputs))):
                    continue
                self.nodes[k], grown = rules[k], True
                self.cuts.update((o, cut) for o in node.outputs if o)
                wanted.update(node.inputs[j] for j in ins)
        self.entries = [k for k in entries if graph.nodes[k].inputs[0] in self.cuts]
        self.scattered = {graph.nodes[k].inputs[j]: c for k, (_, ins) in self.nodes.items() for j, c in ins.items()
                          if graph.nodes[k].inputs[j] not in self.cuts}
        sharded = {*self.nodes, *self.entries}
        self.gathered = sorted({i for k, node in enumerate(graph.nodes) if k not in sharded for i in node.inputs
                                if i in self.cuts})


def _rewrite(graph, sweep, tp):
    """The rank's typed graph: the sweep's nodes reading the rank's tokens (a Reshape's shape cut alike, the weights
    they read whole through ParallelInput, the step counter offset by rank), the tensors it scatters and gathers cut
    and gathered before their first reader, tensor parallelism's collectives it takes made along the sequence. Each
    all-gather is forced to be recomputed (`force_mirroring`): the backward pass gathers the sequence again, so
    that a rank keeps its runs alone for backward, as Megatron's linear layers keep their input's."""
    tensors, nodes, made = dict(graph.tensors), [], {}
    fresh = FreshNames({*(n.name for n in graph.nodes), *graph.tensors})

    def add(op, inputs, output, notes, **attrs):
        """Append memplan's `op` (or ONNX's, where `op` is (domain, op)) writing the new tensor `output`: its name.
        An all-gather is made again in backward rather than kept (see `_rewrite`)."""
        domain, op = op if isinstance(op, tuple) else ("memplan", op)
        output = fresh(output)
        nodes.append(Node(op, tuple(inputs), (output,), attrs, fresh(f"sequence_parallel/{op}/{inputs[0]}"),
                          Annotations(notes.phase, force_mirroring=op == "AllGather"), domain))
        tensors[output] = Tensor(output, None, None, "activation")
        return output

    def once(key, make, *args, **attrs):
        """`make(*args, **attrs)`, made the first time `key` is asked for: the tensor it names."""
        if key not in made:
            made[key] = make(*args, **attrs)
        return made[key]

    def along(cut, **attrs):
        return {"world": tp, "mean": 0, "axis": cut[0], "blocks": cut[1], "group": "tp", **attrs}

    def counter(notes):
        """This rank's dropout counter: the step's, plus rank * STRIDE (memplan.Shard of the ranks' offsets)."""
        offsets = fresh(f"{STEP}/sequence_parallel/offsets")
        tensors[offsets] = Tensor(offsets, (tp,), np.dtype(np.float64), "const", np.arange(tp) * float(STRIDE))
        mine = add("Shard", (offsets,), f"{offsets}/rank", notes, world=tp, unit=1, group="tp")
        step = add(("", "Add"), (STEP, mine), f"{STEP}/rank", notes)
        return add(("", "Reshape"), (step,), f"{STEP}/sequence_parallel", notes, shape=[], allowzero=0)

    for k, node in enumerate(graph.nodes):
        inputs, attrs, notes = list(node.inputs), dict(node.attrs), node.notes
        if k in sweep.exits or k in sweep.entries:
            cut = sweep.cuts[node.outputs[0] if k in sweep.exits else node.inputs[0]]
            op, attrs = ("ReduceScatter", along(cut)) if k in sweep.exits else ("AllGather", along(cut, partial=1))
            nodes.append(replace(node, op=op, attrs=attrs, name=fresh(f"sequence_parallel/{op}/{node.outputs[0]}"),
                                 notes=replace(notes, force_mirroring=op == "AllGather")))
            tensors[node.outputs[0]] = Tensor(node.outputs[0], None, None, "activation")
            continue
        if k in sweep.nodes:
            ins = sweep.nodes[k][1]
            for j, name in enumerate(inputs):
                t = graph.tensors.get(name)
                if name in sweep.scattered and j in ins:
                    inputs[j] = once(("scatter", name), add, "Shard", (name,), f"{name}/scattered", notes,
                                     **along(sweep.scattered[name]))
                elif name == STEP:
                    inputs[j] = once(STEP, counter, notes)
                elif j not in ins and t is not None and t.kind in ("param", "activation") and is_float(t.dtype):
                    inputs[j] = once(("sum", name), add, "ParallelInput", (name,), f"{name}/sequence_parallel", notes,
                                     world=tp, group="tp")
            if "shape" in attrs:  # a Reshape's: the rank's tokens
                attrs["shape"] = [d // tp if j == sweep.cuts[node.outputs[0]][0] else d
                                  for j, d in enumerate(graph.tensors[node.outputs[0]].shape)]
            tensors.update((o, Tensor(o, None, None, "activation")) for o in node.outputs if o)
        else:
            for j, name in enumerate(inputs):
                if name in sweep.cuts:
                    inputs[j] = once(("gather", name), add, "AllGather", (name,), f"{name}/gathered", notes,
                                     **along(sweep.cuts[name]))
        nodes.append(replace(node, inputs=tuple(inputs), attrs=attrs) if (inputs, attrs) != (list(node.inputs),
                                                                                            node.attrs) else node)
    return shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors), graph)
