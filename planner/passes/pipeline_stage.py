"""One pipeline stage's training step (planner.parallel's `pp` and `microbatches`; planner.pipeline cuts the
graph and orders the microbatches): the stage's own nodes of the step, each value another stage makes
received (memplan.Recv) before its first reader here and each value another stage reads sent
(memplan.Send) once made, forward activations one way and their gradients the other; a param read by
several stages (tied or deduplicated weights) is updated where its gradient is summed and its new value sent
to the others, which write it over their copy at the end of the step. With M microbatches
the stage's forward and backward run once per microbatch in 1F1B order, each microbatch's values under their
own names (NAME@j: the inputs too, so that each microbatch is fed its rows), each param's gradient summed
over the microbatches as they come and the optimizer run on the sum after the last; the loss (on the last
stage) is the microbatches' mean, and each microbatch's gradients are of its share of it (planner.passes.
gradients seeds them with 1/M). Facts: "pipeline" (pp, stage, microbatches, in_flight, each stage's first
and last forward node and FLOPs, the bytes this stage sends a step); "params" and "grads" become the stage's
(the gradients its optimizer reads), and "loss" None but on the last stage."""
from dataclasses import replace
from functools import partial

import numpy as np

from .. import ops, pipeline, shapes
from ..dtypes import to_onnx
from ..errors import ConfigError
from ..ir import Annotations, Node, Phase, Tensor
from ..training import LR, STEP
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Property, Result
from .data_parallel import OPTIMIZER_OPS


CUT = Property("cut into pipeline stages", lambda graph, facts: "pipeline_cuts" in facts)
"""facts["pipeline_cuts"] holds where the step's forward pass is cut (planner.pipeline.cut)."""


def pipeline_cut(parallel):
    """The Pass choosing where the step is cut into `parallel.pp` stages: the same for every stage, so that
    planner.compile_stages chooses it once for all of them."""
    def apply(graph, context):
        cuts = pipeline.cut(graph, parallel.pp, parallel.microbatches, context.facts["labels"])
        return Result(graph, False, {"pipeline_cuts": cuts})
    return Pass("pipeline_cut", apply, needs=frozenset({TYPED, UPDATES}), keeps=frozenset({TYPED, LOSS, GRADIENTS,
                                                                                         UPDATES}),
                makes=frozenset({CUT}))


def pipeline_stage(parallel):
    """The Pass making stage `parallel.stage`'s step of `parallel.pp` stages and `parallel.microbatches` (a
    planner.Parallel of more than one of either) where pipeline_cut cut it; the loss is the last stage's alone."""
    kept = {LOSS, GRADIENTS} if parallel.stage == parallel.pp - 1 else {GRADIENTS}
    return Pass("pipeline_stage", partial(_pipeline_stage, parallel=parallel), needs=frozenset({TYPED, UPDATES, CUT}),
                makes=frozenset({TYPED, UPDATES}), keeps=frozenset(kept),
                ensures=frozenset({Property("with every value made, received or held before it is read", _closed)}))


def _closed(graph, facts):
    known = set(graph.inputs) | {name for name, t in graph.tensors.items() if t.kind in ("param", "const", "state")}
    for node in graph.nodes:
        if not known.issuperset(i for i in node.inputs if i):
            return False
        known.update(node.outputs)
    return True


def _pipeline_stage(graph, context, parallel):
    if "scaler" in context.facts:
        raise ConfigError("amp-fp16's loss scaling checks every gradient of the step at once: plan pipeline "
                          "stages and microbatches in fp32, fp16, bf16 or amp-bf16")
    stages, microbatches, me = parallel.pp, parallel.microbatches, parallel.stage
    stage_of = pipeline.assign(graph, context.facts["pipeline_cuts"])
    producer, readers = pipeline.indexed(graph)
    transfers = _transfers(graph, stage_of, producer, readers)
    last = me == stages - 1
    one = _one_microbatch(graph, _stage_nodes(graph, stage_of, me, transfers, producer, readers), last)
    nodes, tensors, inputs = _unrolled(one, one.nodes, pipeline.order(me, stages, microbatches), microbatches,
                                       len(transfers))
    if last and microbatches > 1:
        nodes += _mean_loss(one, tensors, microbatches)
    made = {o for n in nodes for o in n.outputs if o}  # what a microbatch makes under its names is no update
    typed = shapes.prune(replace(one, nodes=tuple(nodes), tensors=tensors, inputs=tuple(inputs),
                                 updates=tuple((new, old) for new, old in one.updates if new in made)))
    updated_values = {new for new, _ in graph.updates}  # sent once a step, the others once a microbatch
    sent = sum(graph.tensors[name].nbytes * (1 if name in updated_values else microbatches)
               for name, src, _ in transfers if src == me)
    facts = {"pp": stages, "stage": me, "microbatches": microbatches,
             "in_flight": pipeline.in_flight(me, stages, microbatches), "order": "1F1B",
             "stages": _summary(graph, stage_of, stages), "sent_bytes": sent}
    updated = {n.inputs[len(ops.of(n).scalars)]: n.inputs[len(ops.of(n).scalars) + 1] for n in typed.nodes
               if (n.domain, n.op) in OPTIMIZER_OPS}
    params = [p for p in context.facts["params"] if p in updated]
    return Result(typed, True, {"pipeline": facts, "params": params, "grads": {p: updated[p] for p in params},
                                "loss": "loss" if last else None})


def _one_microbatch(graph, nodes, last):
    """The typed graph of the stage's `nodes` for one microbatch (planner.shapes.retype types only the sends and
    receives): each other microbatch's copy is typed as it is, so that the step is typed without inferring it
    microbatch by microbatch."""
    made = {o for n in nodes for o in n.outputs if o}
    read = {i for n in nodes for i in n.inputs}
    inputs = [i for i in graph.inputs if i in (LR, STEP) or i in read]
    stage = replace(graph, nodes=tuple(nodes), tensors=_used(graph.tensors, nodes, inputs), inputs=tuple(inputs),
                    outputs=("loss",) if last else (), updates=tuple((new, old) for new, old in graph.updates
                                                                     if new in made))
    return shapes.retype(stage, graph)


def _transfers(graph, stage_of, producer, readers):
    """[(tensor, from stage, to stage)] of every value a node of one stage reads from another, in the
    order of the graph's nodes (every stage's plan numbers them alike: the tags); then each param's new
    value, to the other stages that read the param. `producer` and `readers` index the graph's nodes."""
    found = {}
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name in producer and stage_of[producer[name]] != stage_of[k]:
                found.setdefault((name, stage_of[k]), (name, stage_of[producer[name]], stage_of[k]))
    for new, old in graph.updates:
        owner = stage_of[producer[new]]
        for k in readers.get(old, ()):
            if stage_of[k] != owner:
                found.setdefault((new, stage_of[k]), (new, owner, stage_of[k]))
    return list(found.values())


def _stage_nodes(graph, stage_of, me, transfers, producer, readers):
    """Stage `me`'s nodes of one microbatch: its own, a Recv before the first reader of each value it
    receives, a Send after the maker of each value it sends; a param's new value is sent and received
    after everything else (its optimizer node may wait for a gradient bucket: planner/passes/
    data_parallel.py)."""
    updated, end = {new for new, _ in graph.updates}, len(graph.nodes)
    recv_at, send_at = {}, {}
    for tag, (name, src, dst) in enumerate(transfers):
        if dst == me:
            first = end if name in updated else next(k for k in readers[name] if stage_of[k] == me)
            recv_at.setdefault(first, []).append((tag, name, src))
        if src == me:
            send_at.setdefault(end if name in updated else producer[name], []).append((tag, name, dst))
    nodes = []
    for k, node in enumerate((*graph.nodes, None)):
        if node is not None and stage_of[k] != me:
            continue
        for tag, name, src in recv_at.get(k, ()):
            t = graph.tensors[name]
            nodes.append(Node("Recv", (), (name,), {"peer": src, "tag": tag, "shape": list(t.shape),
                                                     "dtype": to_onnx(t.dtype)},
                              f"pipeline/Recv/{name}", Annotations(graph.nodes[producer[name]].notes.phase),
                              "memplan"))
        if node is not None:
            nodes.append(node)
        for tag, name, dst in send_at.get(k, ()):
            nodes.append(Node("Send", (name,), (), {"peer": dst, "tag": tag}, f"pipeline/Send/{name}/{dst}",
                              Annotations(graph.nodes[producer[name]].notes.phase), "memplan"))
    return nodes


def _unrolled(graph, single, steps, microbatches, tags):
    """(nodes, tensors, inputs) of the stage's step from `graph`, its nodes `single` for one microbatch
    (_one_microbatch): `single`'s forward nodes at each ("F", j) of `steps`,
    its backward ones at each ("B", j), the optimizer's (and the sends and receives of new param values) in
    the last microbatch's backward, reading each gradient summed over the microbatches. With one microbatch,
    `single` as it is."""
    optimizing = {n for n in single if n.notes.phase is Phase.OPTIMIZER}  # Nodes hash by identity
    grads = {n.inputs[len(ops.of(n).scalars) + 1] for n in optimizing if (n.domain, n.op) in OPTIMIZER_OPS}
    per_batch = dict.fromkeys(o for n in single if n not in optimizing for o in n.outputs if o)  # in order: tensors
    per_batch.update(dict.fromkeys(i for n in single if n not in optimizing for i in n.inputs if i in graph.inputs))
    inputs = list(graph.inputs)
    if microbatches == 1:
        return single, _used(graph.tensors, single, inputs), inputs

    def name(x, j):
        return f"{x}@{j}" if x in per_batch else x

    def summed(g, j):
        return g if j == 0 else f"{g}@sum{j}"

    tensors = dict(graph.tensors)
    for x in per_batch:
        t = graph.tensors[x]
        for j in range(microbatches):
            tensors[name(x, j)] = replace(t, name=name(x, j), kind="activation" if t.kind == "output" else t.kind)
    nodes = []
    for kind, j in steps:
        for node in single:
            if (node.notes.phase is Phase.FORWARD) != (kind == "F"):
                continue
            if node in optimizing:
                if j == microbatches - 1:
                    nodes.append(replace(node, inputs=tuple(summed(name(i, j), j) if i in grads else i
                                                            for i in node.inputs)))
                continue
            attrs = {**node.attrs, "tag": node.attrs["tag"] + tags * j} if node.op in ("Send", "Recv") else node.attrs
            nodes.append(replace(node, name=f"{node.name}@{j}", attrs=attrs,
                                 inputs=tuple(name(i, j) if i else i for i in node.inputs),
                                 outputs=tuple(name(o, j) if o else o for o in node.outputs)))
            for g in [o for o in node.outputs if o in grads] if j else ():
                nodes.append(Node("Add", (summed(name(g, j - 1), j - 1), name(g, j)), (summed(name(g, j), j),),
                                  {}, f"pipeline/accumulate/{g}@{j}", node.notes))
                tensors[summed(name(g, j), j)] = replace(graph.tensors[g], name=summed(name(g, j), j),
                                                        kind="activation")
    inputs = [name(i, j) for i in inputs for j in (range(microbatches) if i in per_batch else (0,))]
    return nodes, _used(tensors, nodes, inputs), inputs


def _mean_loss(graph, tensors, microbatches):
    """The step's "loss": the mean of the microbatches' losses."""
    t = graph.tensors["loss"]
    share = "pipeline/microbatch_share"
    tensors[share] = Tensor(share, (), t.dtype, "const", np.asarray(1 / microbatches, t.dtype))
    tensors["pipeline/loss_sum"] = replace(t, name="pipeline/loss_sum", kind="activation")
    tensors["loss"] = t
    notes = Annotations(Phase.FORWARD)
    return [Node("Sum", tuple(f"loss@{j}" for j in range(microbatches)), ("pipeline/loss_sum",), {},
                 "pipeline/Sum/loss", notes),
            Node("Mul", ("pipeline/loss_sum", share), ("loss",), {}, "pipeline/Mul/loss", notes)]


def _used(tensors, nodes, inputs):
    names = set(inputs) | {x for n in nodes for x in (*n.inputs, *n.outputs) if x}
    return {k: t for k, t in tensors.items() if k in names}


def _summary(graph, stage_of, stages):
    """Each stage's first and last forward node and its FLOPs (forward, backward and optimizer)."""
    out = [{"first": None, "last": None, "flops": 0} for _ in range(stages)]
    for k, node in enumerate(graph.nodes):
        s = out[stage_of[k]]
        s["flops"] += ops.node_flops(graph, node)
        if node.notes.phase is Phase.FORWARD:
            s["first"] = s["first"] or node.name
            s["last"] = node.name
    return out
