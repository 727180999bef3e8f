"""Fuse attention: scaled dot-product attention as exporters write it, MatMul(Softmax(scores), V) with the
scores MatMul(Q, K^T) scaled by a constant (Div, Mul, or both factors on Q and K^T) and masked (an Add of a
bias, or a Where of a constant mask), replaced by one memplan.ScaledDotProductAttention, whose kernel works
tile by tile and never holds the (S, T) scores (planner/ops/fused_attention.py). A constant lower-triangular
mask becomes the op's `causal`; any other mask, its additive bias. Attention of a 16-bit export stays as it
is, since the fused op accumulates in float32 where the export rounds each step in 16 bits (so results would
change); fp16 and bf16 plans of float32 models fuse first and lower after. planner.compile counts the fused ops in
plan.stats["fused_attention"]; CompileOptions(fuse_attention=False) keeps the exported form."""
import math

import numpy as np

from .. import ops
from ..ir import Node, Tensor
from ..ops import Info
from .base import rewrite_pass
from .pattern import Op, constant, rewrite

FUSED = "ScaledDotProductAttention"
PROBE_LIMIT = 1 << 25
"""Most elements of a mask built from constants alone (transformers' causal masks from index comparisons)
that planning evaluates, to learn whether it is the causal one; larger masks stay an input of the op."""
MASKED = -1e30
"""An additive bias at or below this masks its score out: exp underflows to exactly 0 in float32."""


def _scores():
    """(pattern of the scaled scores, how it scales): Div or Mul by a constant, the factors on Q and K^T
    (a split scale), or none."""
    qk = Op("MatMul", "q", "kt", name="qk")
    return [(Op("Div", qk, "c"), "div"), (Op("Mul", qk, "c"), "mul"),
            (Op("MatMul", Op("Mul", "q", "cq"), Op("Mul", "kt", "ck"), name="qk"), "split"), (qk, "none")]


def _patterns():
    """Every exported form: the scores, unmasked, plus a bias, or under a Where mask (either way round);
    the probabilities as they are, or with the NaN of fully masked rows made 0 (torch.onnx's dynamo
    form of SDPA), which the fused op gives such rows anyway."""
    found = []
    for scores, scaling in _scores():
        for masked, masking in ((scores, "none"), (Op("Add", scores, "bias"), "add"),
                                (Op("Where", "cond", scores, "fill"), "where"),
                                (Op("Where", "cond", "fill", scores), "where_not")):
            p = Op("Softmax", masked, attrs={"axis": -1})
            for probabilities in (p, Op("Where", Op("IsNaN", p), "zero", p)):
                found.append((Op("MatMul", probabilities, "v"), scaling, masking))
    return found



def _scale(graph, m, scaling):
    """The scale the scores are multiplied by, or None where a factor is not a one-value constant."""
    if scaling == "none":
        return 1.0
    names = ("cq", "ck") if scaling == "split" else ("c",)
    values = [constant(graph, m.bindings[n]) for n in names]
    if any(v is None or v.size != 1 for v in values):
        return None
    product = float(np.prod([float(v.ravel()[0]) for v in values]))
    return 1.0 / product if scaling == "div" else product


def _causal(cond, s, t):
    """Whether a constant mask (True: attend) is the causal one of S queries over T keys, broadcast."""
    if cond.dtype != bool or cond.ndim > 4 or cond.shape[-2:] != (s, t):
        return False
    flat = cond.reshape(-1, s, t)
    return bool((flat == np.tril(np.ones((s, t), bool), t - s)).all())


def _built_causal(graph, cond, s, t):
    """Whether `cond` is a causal mask built when running, too large to fold: the lower triangle
    (Trilu, upper=0, diagonal T - S) of ones (ConstantOfShape), as bools (or cast to them)."""
    node = graph.producers.get(cond)
    if node is not None and node.op == "Cast" and graph.tensors[cond].dtype == bool:
        node = graph.producers.get(node.inputs[0])
    if node is None or node.op != "Trilu" or node.attrs.get("upper", 1) or _k(node) != t - s:
        return False
    ones = graph.producers.get(node.inputs[0])
    shape = graph.tensors[node.inputs[0]].shape
    filled = ones is not None and ones.op == "ConstantOfShape" and bool(np.all(ones.attrs.get("value", 0)))
    return filled and shape[-2:] == (s, t)


def _causal_bias(bias, s, t):
    """Whether an additive bias is 0 on the causal lower triangle and masks out (<= MASKED) the rest."""
    attend = bias == 0
    return bool((attend | (bias <= MASKED)).all()) and _causal(attend, s, t)


def _computed(graph, name, limit=PROBE_LIMIT):
    """The value of tensor `name` where it depends on constants alone, each value on the way at most
    `limit` elements, computed by the ops' NumPy forms (planning folds only small constants); else None."""
    value = constant(graph, name)
    node = graph.producers.get(name)
    if value is not None or node is None or math.prod(graph.tensors[name].shape) > limit:
        return value
    ins = []
    for i in node.inputs:
        v = _computed(graph, i, limit) if i else None
        if i and v is None:
            return None
        ins.append(Info(graph.tensors[i].shape, graph.tensors[i].dtype, v) if i else None)
    with np.errstate(all="ignore"):
        values = ops.of(node, graph.opsets).fold(node, ins)
    return None if values is None else np.asarray(values[node.outputs.index(name)])


def _k(trilu):
    k = trilu.attrs.get("k", 0)
    return int(np.ravel(k)[0]) if k is not None else 0


class _Fuser:
    """Builds the replacement of one match, or None where the match is not attention memplan can fuse."""

    def __init__(self, graph):
        self.graph, self.count, self.fresh, self.masks = graph, 0, {}, {}

    def mask(self, name):
        """`_computed` of a mask, once per mask (every layer reads the same one)."""
        if name not in self.masks:
            self.masks[name] = _computed(self.graph, name)
        return self.masks[name]

    def build(self, m, scaling, masking):
        g = self.graph
        q, kt, v = (m.bindings[k] for k in ("q", "kt", "v"))
        shapes = [g.tensors[x].shape for x in (q, kt, v)]
        if any(len(s) != 4 for s in shapes) or shapes[0][:2] != shapes[1][:2] or shapes[1][:2] != shapes[2][:2]:
            return None
        if g.tensors[q].dtype.itemsize < 4:  # a 16-bit export rounds its softmax in 16 bits; the fused op would not
            return None
        (b, h, s, _), t = shapes[0], shapes[1][3]
        zero = m.bindings.get("zero")
        if zero is not None and (constant(g, zero) is None or np.any(constant(g, zero))):
            return None
        scale = _scale(g, m, scaling)
        if scale is None:
            return None
        inputs, causal, nodes = [q, None, v], 0, []
        if masking == "add":
            bias = m.bindings["bias"]
            if g.tensors[bias].dtype != g.tensors[q].dtype or not _broadcasts(g.tensors[bias].shape, (b, h, s, t)):
                return None
            value = self.mask(bias)
            if value is not None and _causal_bias(value, s, t):
                causal = 1
            elif value is None or value.any():
                inputs.append(bias)
        elif masking.startswith("where"):
            cond, fill = m.bindings["cond"], constant(g, m.bindings["fill"])
            if fill is None or fill.size != 1 or not _broadcasts(g.tensors[cond].shape, (b, h, s, t)):
                return None
            if masking == "where" and _built_causal(g, cond, s, t):
                causal = 1
            else:
                value = self.mask(cond)
                if value is None:
                    return None
                attend = value if masking == "where" else ~value
                if _causal(attend, s, t):
                    causal = 1
                else:
                    inputs.append(self._const(np.where(attend, 0, fill.ravel()[0]).astype(g.tensors[q].dtype)))
        name = m.root.name
        source, perm = _key_source(g, kt)
        if perm == [0, 1, 2, 3]:
            inputs[1] = source
        else:
            inputs[1] = f"{name}/key"
            self.fresh[inputs[1]] = Tensor(inputs[1], None, None, "activation")
            nodes.append(Node("Transpose", (source,), (inputs[1],), {"perm": perm}, f"{name}/transpose_key"))
        nodes.append(Node(FUSED, tuple(inputs), m.root.outputs, {"scale": scale, "causal": causal}, name,
                          m.root.notes, "memplan"))
        self.count += 1
        return nodes

    def _const(self, value):
        name = f"fused_attention/bias{len(self.fresh)}"
        self.fresh[name] = Tensor(name, value.shape, value.dtype, "const", value)
        return name


def _key_source(graph, kt):
    """(tensor, perm) with K = Transpose(tensor, perm), K^T being `kt`: where the export transposed the
    keys into K^T itself, the one Transpose from its input (none when it comes out as the identity)."""
    swap = [0, 1, 3, 2]
    producer = graph.producers.get(kt)
    if producer is None or producer.op != "Transpose" or producer.domain:
        return kt, swap
    inner = producer.attrs.get("perm") or list(range(len(graph.tensors[kt].shape)))[::-1]
    return producer.inputs[0], [int(inner[i]) for i in swap]


def _broadcasts(shape, to):
    return len(shape) <= len(to) and all(a in (1, b) for a, b in zip(shape[::-1], to[::-1]))


def fused(graph):
    """(graph with every attention it can fuse replaced, how many)."""
    fuser = _Fuser(graph)
    for pattern, scaling, masking in _patterns():
        fuser.graph = graph
        graph, _ = rewrite(graph, pattern, lambda m: fuser.build(m, scaling, masking), fuser.fresh)
    return graph, fuser.count


fuse_attention = rewrite_pass("fuse_attention", fused)
