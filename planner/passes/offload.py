"""Optimizer offload (ZeRO-Offload, Ren et al. 2021): the optimizer's state and master weights live in the host
arena and its update runs on the host. Each gradient an update reads is copied out (memplan.SwapOut) right after
the step that makes it; the host updates the master (this rank's shard of it under ZeRO's stages, which
data_parallel placed before) and copies the new value back (memplan.SwapIn) over the device's param, or over the
shard the device then all-gathers.

The master weights are float32 for a 16-bit param (precision "fp16" or "bf16": ZeRO-Offload's mixed precision,
the update in float32 and its result cast to the param's type on the host), else the param's own type. Under amp,
a float32 param that the device reads only through one cast to the low type is held on the device in that type
alone: the cast moves to the host, after the update, and the device never holds the float32 copy; a gradient made
by casting a 16-bit one up leaves in 16 bits and is cast on the host. Where the master
has the param's type (fp32, amp) a run matches the plan without offload bit for bit.
Facts: "offload" {"what", "masters" {param: master}, "low" (params the device holds in 16 bits that amp computed
in float32), "sharded" (masters that are this rank's shard of a whole value), "host_bytes" (masters and state),
"link_bytes" (a step's, each way), "time" (the step's by the time model: planner.remat.swap_time), "base_seconds"
(the step's with the optimizer on the device)}; "grads" with
the 16-bit gradients that leave as they are."""
from dataclasses import replace
from functools import partial

import numpy as np

from .. import ops, shapes, timing
from ..options import OFFLOADS
from ..deferred import computed
from ..dtypes import from_onnx, is_float, to_onnx
from ..errors import ConfigError
from ..ir import Annotations, Node, Phase, Tensor
from ..parallel import Whole, whole_value
from ..remat import swap_time
from ..schedule import followed
from .base import GRADIENTS, LOSS, TYPED, UPDATES, Pass, Result
from .data_parallel import OPTIMIZER_OPS

MASTER = "/master"
"""The suffix of a param's master weights in the host arena."""


def offload(what="optimizer", model=None):
    """The Pass moving `what` (one of OFFLOADS) to the host; the step's modeled time by the DeviceModel `model`
    (planner.timing; default "cpu") in its facts."""
    if what not in OFFLOADS:
        raise ConfigError(f"unknown offload {what!r}; choose one of {', '.join(OFFLOADS)}")
    model = model or timing.PROFILES["cpu"]
    return Pass("offload", partial(_offload, model=model), needs=frozenset({TYPED, UPDATES}),
                makes=frozenset({TYPED, UPDATES}),
                keeps=frozenset({LOSS, GRADIENTS}))


def _offload(graph, context, model):
    """The graph with each optimizer node's update moved to the host (see the module's docstring), and its facts."""
    if any(n.notes.assign for n in graph.nodes):
        raise ConfigError("optimizer offload updates the params in place (MEGENGINE_INPLACE_UPDATE=1)")
    rewrite = _Rewrite(graph, context.facts)
    for k, node in enumerate(graph.nodes):
        if (node.domain, node.op) in OPTIMIZER_OPS:
            rewrite.move(k, node)
    typed = rewrite.graph()
    facts = rewrite.facts
    facts["host_bytes"] = sum(t.nbytes for t in typed.tensors.values() if t.host and t.kind in ("param", "state"))
    facts["link_bytes"] = sum(typed.tensors[n.outputs[0]].nbytes for n in typed.nodes
                              if n.domain == "memplan" and n.op == "SwapIn" and n.name.startswith("offload/"))
    facts["time"], facts["base_seconds"] = swap_time(typed, model), swap_time(graph, model)["seconds"]
    return Result(typed, True, {"offload": facts, "grads": rewrite.grads})


class _Rewrite:
    """The offload of one graph as it is made: its tensors, updates and the names on the host, the nodes to put
    `after` a step's index and `instead` of a node (by name), the names `renamed` and the nodes `dropped`."""

    def __init__(self, graph, facts):
        self.source, self.readers = graph, graph.consumers
        self.made = {o: k for k, node in enumerate(graph.nodes) for o in node.outputs if o}
        self.updates, self.tensors, self.host = dict(graph.updates), dict(graph.tensors), set()
        self.after, self.instead, self.renamed, self.dropped = {}, {}, {}, set()
        self.facts = {"what": "optimizer", "masters": {}, "low": [], "sharded": []}
        self.zero3 = set((facts.get("parallel") or {}).get("sharded", ()))
        self.grads = dict(facts.get("grads", {}))

    def move(self, k, node):
        """Optimizer node `node` (step k) updating on the host: its gradient copied out, its param copied back."""
        graph, tensors = self.source, self.tensors
        scalars = len(ops.of(node, graph.opsets).scalars)
        read, grad, *state = node.inputs[scalars:]
        shard = graph.producer(read) if graph.tensors[read].kind != "param" else None  # ZeRO-1 and 2's Shard
        param = shard.inputs[0] if shard else read
        master_dtype = np.dtype(np.float32) if _is_low(graph.tensors[param].dtype) else graph.tensors[param].dtype
        device = self._device_param(param, {node.name, shard.name if shard else ""})
        if shard and all(r is node for r in self.readers[read]):  # the device's update read it alone
            self.dropped.add(shard.name)
        master = self._master(param, tuple(graph.tensors[read].shape), master_dtype, bool(shard))
        steps = _Steps(tensors, self.host, f"offload/{param}")
        grad = self._leaving(grad, node)
        out = steps.copy("SwapOut", grad, grad + "/host", graph.nodes[self.made[grad]].notes.phase
                         if grad in self.made else Phase.OPTIMIZER)
        self.after.setdefault(self.made.get(grad, k - 1), []).extend(steps.take())
        if tensors[out].dtype != master_dtype:
            out = steps.cast(out, master_dtype)
        steps.nodes.append(replace(node, inputs=(*node.inputs[:scalars], master, out, *state)))
        self.host.update((*node.outputs, master, *state))
        tensors.update((s, replace(tensors[s], dtype=master_dtype)) for s in state)
        tensors.update((o, Tensor(o, None, None, "activation")) for o in node.outputs if o)
        new = node.outputs[0]
        self.updates.pop(new, None)
        self.updates[new] = master
        back = steps.copy("SwapIn", steps.cast(new, device) if device != master_dtype else new, f"{param}/offloaded")
        gather = next((r for r in self.readers[new] if r.op == "AllGather"), None)
        if gather is None:
            self.updates[back] = param
        else:  # ZeRO-1 and 2: the device gathers the shard it got back into the param
            self.instead[gather.name] = [replace(gather, inputs=(back,))]
            tensors[gather.outputs[0]] = Tensor(gather.outputs[0], None, None, "activation")
        self.instead[node.name] = steps.take()

    def _device_param(self, param, skip):
        """The dtype the device holds `param` in: amp's 16-bit one where its one cast is all the device reads of it
        (the casts dropped, their readers reading the param or ZeRO-3's gather of it), else its own."""
        p = self.tensors[param]
        casts = _low_casts(self.readers, param, skip)
        if not casts:
            return p.dtype
        low = from_onnx(casts[0].attrs["to"])
        self.tensors[param] = replace(p, dtype=low, data=_converted(p.data, low))
        self.dropped.update(c.name for c in casts)
        self.renamed.update((c.outputs[0], c.inputs[0]) for c in casts)
        self.tensors.update((c.inputs[0], Tensor(c.inputs[0], None, None, "activation")) for c in casts
                            if c.inputs[0] != param)
        self.facts["low"].append(param)
        return low

    def _master(self, param, shard, dtype, from_shard):
        """The host's master weights of `param` in `dtype`, of the `shard` shape the update read (this rank's shard
        under ZeRO, cut from the whole value where the update read a Shard of it, or ZeRO-3's)."""
        master, sharded = param + MASTER, from_shard or param in self.zero3
        value = _master_value(self.source.tensors[param].data, shard, dtype, sharded)
        self.tensors[master] = Tensor(master, shard, dtype, "param", value, True)
        self.facts["masters"][param] = master
        if sharded:
            self.facts["sharded"].append(master)
        return master

    def _leaving(self, grad, node):
        """The gradient that leaves the device for `node`: `grad`, or where a cast up of a 16-bit one made it for the
        update alone (amp), that one (the cast dropped, done on the host)."""
        cast = self.source.producer(grad)
        if cast is None or cast.op != "Cast" or cast.domain or self.readers[grad] != [node] or \
                not _is_low(self.source.tensors[cast.inputs[0]].dtype):
            return grad
        self.dropped.add(cast.name)
        self.grads = {p: cast.inputs[0] if g == grad else g for p, g in self.grads.items()}
        return cast.inputs[0]

    def graph(self):
        """The rewritten graph, typed, its host tensors marked, each copy back after the readers of what it
        overwrites (a 16-bit param's, after its casts' readers)."""
        graph, readers = self.source, self.readers
        self.host.update(n for n, t in self.tensors.items() if t.kind == "input" and readers.get(n) and
                         all(r.name in self.instead and (r.domain, r.op) in OPTIMIZER_OPS for r in readers[n]))
        nodes = self.after.get(-1, [])
        for k, node in enumerate(graph.nodes):
            if node.name not in self.dropped:
                nodes += [replace(s, inputs=tuple(self.renamed.get(i, i) for i in s.inputs))
                          for s in self.instead.get(node.name, [node])]
            nodes += self.after.get(k, [])
        tensors = {n: t for n, t in self.tensors.items() if n not in self.renamed}
        typed = shapes.retype(replace(graph, nodes=tuple(nodes), tensors=tensors,
                                      updates=tuple(self.updates.items())), graph)
        typed = replace(typed, tensors={n: replace(t, host=True) if n in self.host else t
                                        for n, t in typed.tensors.items()})
        return replace(typed, nodes=followed(typed, typed.nodes))


class _Steps:
    """The nodes one param's offloaded update adds, named under `prefix`; what they make on the host noted in
    `host`, their outputs typed later (retype)."""

    def __init__(self, tensors, host, prefix):
        self.tensors, self.host, self.prefix, self.nodes = tensors, host, prefix, []

    def copy(self, op, name, to, phase=Phase.OPTIMIZER):
        """`name` copied by `op` (memplan.SwapOut to the host, SwapIn to the device) into `to`."""
        self.nodes.append(Node(op, (name,), (to,), {}, f"{self.prefix}/{op}", Annotations(phase), "memplan"))
        self.tensors[to] = replace(self.tensors[name], name=to, kind="activation", data=None)
        if op == "SwapOut":
            self.host.add(to)
        return to

    def cast(self, name, dtype):
        """`name` cast to `dtype` on the host."""
        out = f"{name}/{np.dtype(dtype).name}"
        self.nodes.append(Node("Cast", (name,), (out,), {"to": to_onnx(dtype)}, f"{self.prefix}/Cast/{out}",
                               Annotations(Phase.OPTIMIZER)))
        self.tensors[out] = Tensor(out, None, None, "activation")
        self.host.add(out)
        return out

    def take(self):
        taken, self.nodes = self.nodes, []
        return taken


def _low_casts(readers, param, skip):
    """The Cast nodes reading the float32 `param` where every reader but those named in `skip` is a Cast to one
    16-bit float type (amp's copy of a weight) that no copy to the host reads, or ZeRO-3's AllGather of it read by
    such Casts alone; [] otherwise."""
    others = [r for r in readers.get(param, ()) if r.name not in skip]
    others = [c for r in others for c in (readers.get(r.outputs[0], [None]) if r.op == "AllGather" else [r])]
    if not others or any(r is None or r.op != "Cast" or r.domain for r in others):
        return []
    if any(ops.of(r).timed for c in others for r in readers.get(c.outputs[0], ())):  # a swapped cast stays as it is
        return []
    types = {from_onnx(r.attrs["to"]) for r in others}
    return others if len(types) == 1 and _is_low(next(iter(types))) else []


def _is_low(dtype):
    """Whether `dtype` is a 16-bit float (float16, bfloat16)."""
    return is_float(dtype) and np.dtype(dtype).itemsize == 2


def _master_value(data, shard, dtype, sharded):
    """The master weights' value: the param's whole value (`data`, perhaps a rank's part of it: parallel.Whole) in
    `dtype`, standing for this rank's `shard` where it is a part (a tensor-parallel piece, or `sharded`)."""
    whole = whole_value(data)
    value = whole if np.dtype(whole.dtype) == dtype else _converted(whole, dtype)
    return Whole(value, shard) if sharded or isinstance(data, Whole) else value


def _converted(data, dtype):
    """A param's value (`data`, perhaps a rank's part of a whole: parallel.Whole) in `dtype`, as the executor loads
    it."""
    if isinstance(data, Whole):
        return Whole(_converted(data.value, dtype), data.shape)
    return computed(_astype, np.shape(data), dtype, data, dtype)


def _astype(value, dtype):
    return np.asarray(value).astype(dtype)
