"""A memplan graph as a PyTorch module run op by op in eager mode: the oracle memplan's executor and
training steps are checked against, and the PyTorch side of the memory benchmarks.

    module = to_torch("zoo:resnet18", {"input": (4, 3, 224, 224)})
    out = module(input=x)["output"]          # or module(x): graph inputs in order; returns {name: tensor}

The module runs the graph at the shapes it was loaded with (Reshape targets are fixed by then). Float
params are `nn.Parameter`s in `module.params`, keyed by sanitised names (`graph_parameters()` maps the
graph's names to them); consts, integer params and BatchNormalization's running statistics are buffers
(`graph_buffers()`). `module.train()` runs BatchNormalization on batch statistics, updating the running
ones as ONNX does (old * momentum + batch * (1 - momentum), with the batch's population variance), and
Dropout at random; so do nodes whose training_mode attribute is set. A tensor is dropped once its last
reader has run, as eager PyTorch frees it, so peak memory compares with a hand-written module's. Each op's
PyTorch form is its schema's (`torch_node` or `torch`, found by executor.torch_ops.form); LOSSES and
torch_optimizer are PyTorch's forms of memplan's losses and optimizers, to train the copy as memplan trains
the plan.
"""
import re

import numpy as np

import planner
from planner import ops
from planner.errors import MissingDependencyError
from planner.ir import op_name
from planner.ops.torch_forms import unsupported
from planner.optimizers import OPTIMIZERS

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError as e:
    raise MissingDependencyError("executor.torch_module needs PyTorch: pip install torch") from e

from .torch_ops import form  # noqa: E402  (needs torch)


def to_torch(graph_or_model, input_shapes=None):
    """A GraphModule running `graph_or_model` (anything planner.load reads) at `input_shapes`."""
    return GraphModule(planner.load(graph_or_model, input_shapes))


LOSSES = {"cross_entropy": F.cross_entropy, "mse": F.mse_loss}
"""PyTorch's form of each of memplan's losses (planner.losses), both averaging over the batch."""


def torch_optimizer(name, params, args=None):
    """torch.optim's form of memplan's optimizer `name` with its optimizer_args over memplan's defaults."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    args = {**OPTIMIZERS[name][1], **(args or {})}
    if name in ("adam", "adamw"):
        adam = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return adam(params, lr=args["lr"], betas=tuple(args["betas"]), eps=args["eps"], weight_decay=args["weight_decay"])
    return torch.optim.SGD(params, lr=args["lr"], momentum=args.get("momentum", 0.0), weight_decay=args["weight_decay"],
                           nesterov=bool(args.get("nesterov", False)))


class GraphModule(nn.Module):
    """Runs a typed planner Graph; forward returns {graph output name: tensor}."""

    def __init__(self, graph):
        super().__init__()
        self.forms = [form(node.op, node.domain, graph.opsets.get(node.domain)) for node in graph.nodes]
        missing = [op_name(node.domain, node.op) for node, fn in zip(graph.nodes, self.forms) if fn is None]
        if missing:
            raise unsupported(*missing)
        self.graph = graph
        running = {node.inputs[k] for node in graph.nodes for k in ops.of(node, graph.opsets).statistics}
        self.params, self.consts = nn.ParameterDict(), nn.Module()
        self.keys = {}
        for t in graph.tensors.values():
            if t.kind not in ("param", "const") or t.data is None:
                continue
            key = self.keys[t.name] = _key(t.name, self.keys.values())
            value = torch.from_numpy(np.array(t.data))
            if t.kind == "param" and t.dtype.kind == "f" and t.name not in running:
                self.params[key] = nn.Parameter(value)
            else:
                self.consts.register_buffer(key, value)
        last = {name: k for k, node in enumerate(graph.nodes) for name in (*node.outputs, *node.inputs) if name}
        self.dead = [[] for _ in graph.nodes]  # per node, the tensors no later node reads
        for name, k in last.items():
            if name not in graph.outputs:
                self.dead[k].append(name)

    def graph_parameters(self):
        """{graph param name: nn.Parameter}: what an optimizer trains."""
        return {name: self.params[key] for name, key in self.keys.items() if key in self.params}

    def graph_buffers(self):
        """{graph tensor name: buffer}: consts, integer params and running statistics."""
        return {name: getattr(self.consts, key) for name, key in self.keys.items() if key not in self.params}

    def forward(self, *inputs, **feeds):
        feeds = {**dict(zip(self.graph.inputs, inputs)), **feeds}
        missing = [n for n in self.graph.inputs if n not in feeds]
        unknown = [n for n in feeds if n not in self.graph.inputs]
        if missing or unknown or len(inputs) > len(self.graph.inputs):
            raise TypeError(f"graph inputs are {list(self.graph.inputs)}; missing {missing}, unknown {unknown}")
        device = next((t.device for t in [*self.parameters(), *self.buffers()]), None)
        env = {**self.graph_parameters(), **self.graph_buffers(),
               **{n: _tensor(x, device) for n, x in feeds.items()}}
        for node, fn, dead in zip(self.graph.nodes, self.forms, self.dead):
            outs = fn(self, node, [env[i] if i else None for i in node.inputs])
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            env.update((name, y) for name, y in zip(node.outputs, outs) if name)
            for name in dead:
                del env[name]
        return {name: env[name] for name in self.graph.outputs}

    def shape(self, name):
        return self.graph.tensors[name].shape

    def training_mode(self, node):
        """Whether the node runs its training form: the module is training, or the node says so."""
        return self.training or bool(ops.of(node).attr(node, "training_mode"))


def _tensor(x, device):
    """A feed as a tensor on `device`; arrays are copied (they may be read-only, which torch cannot share)."""
    return x.to(device) if isinstance(x, torch.Tensor) else torch.tensor(np.asarray(x), device=device)


def _key(name, taken):
    """`name` with what ParameterDict and buffer names refuse replaced, unique among `taken`."""
    base = key = "t_" + re.sub(r"\W", "_", name)
    taken, k = set(taken), 0
    while key in taken:
        k += 1
        key = f"{base}_{k}"
    return key
