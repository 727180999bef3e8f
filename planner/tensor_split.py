"""How tensor parallelism follows a layer's split through the ops after it (planner/passes/tensor_parallel.py):
each op's rule takes the cuts of its inputs and gives its outputs', or says the region cannot be split.

A tensor's Cut says which indices of its dim `axis` a rank holds: the dim is consecutive blocks, each (tp, span)
in row-major order, and rank r holds the span of each block at r. A column-parallel output holds one run (one
block); a fused projection's holds one in each of the blocks its Split or Slices cut it into (q, k and v, the
grouped-query k and v smaller than q; an MLP's gate and up); heads merged with the batch (a block a batch row)
a run of each batch row. A weight cut alike is planner.parallel.piece(value, dim, blocks): the rank's span of
each block, side by side."""
import math

from . import ops
from .ops.base import axis as normal_axis


class Unsplittable(Exception):
    """A region's op that cannot work on its pieces alone: the region stays whole."""


class Indivisible(Exception):
    """A region whose split sizes tp does not divide."""


class Cut:
    """See the module: `spans` are the rank's span of each block, left to right. `fixed` once a reader relies on
    the layout, so that a later Split or Slices can no longer make blocks of it (only a column-parallel output,
    read elementwise so far, can)."""

    def __init__(self, axis, spans, fixed=True, parent=None):
        self.axis, self.spans, self.fixed, self.parent = axis, tuple(spans), fixed, parent

    @property
    def outer(self):
        """How many blocks the dim holds."""
        return len(self.spans)

    @property
    def span(self):
        """The span of each block, where they are equal: a rule that needs one refuses blocks of unequal sizes."""
        if len(set(self.spans)) > 1:
            raise Unsplittable(f"blocks of {', '.join(map(str, self.spans))} features a rank meet an op that needs "
                               "them equal")
        return self.spans[0]

    def blocks(self, tp):
        """The blocks as planner.parallel.piece takes them: how many, where equal; else their sizes."""
        return self.outer if len(set(self.spans)) == 1 else [s * tp for s in self.spans]

    def lineage(self):
        """This cut and those it was reshaped from without moving its dim (a Gemm's 2-D output viewed as
        (batch, seq, features)): a Split or Slices refine them all."""
        cut = self
        while cut is not None:
            yield cut
            cut = cut.parent

    def moved(self, axis):
        """The same split of another axis (a Transpose, a broadcast)."""
        return Cut(axis, self.spans)

    def alike(self, other):
        return self.spans == other.spans


class Region:
    """What the sweep found, by node index: the weights to cut or to read a piece of, the attributes to
    rewrite, the column- and row-parallel layers."""

    def __init__(self, graph, tp):
        self.graph, self.tp = graph, tp
        self.params, self.pieces, self.attrs, self.rows, self.columns = {}, {}, {}, set(), set()

    def shape(self, name):
        return self.graph.tensors[name].shape

    def readers(self, name):
        """How many nodes read tensor `name`."""
        return len(self.graph.consumers[name])

    def cut_operand(self, k, j, name, dim, cut):
        """Input `j` of node `k`, a weight or constant, split on `dim` as `cut` says: cut itself where node k
        is its only reader; else (a weight the exporter shares among equal ones, zero biases) read through
        this rank's piece of it, which 1-D ones have."""
        t = self.graph.tensors[name]
        if t.shape[dim] != self.tp * sum(cut.spans):
            raise Unsplittable(f"{name} does not match the split it meets")
        weight = self.weight(name)
        if weight is not None:
            self.params.setdefault(k, []).append((weight, dim, cut))
        elif t.kind in ("param", "const") and len(t.shape) == 1:
            self.pieces.setdefault(k, []).append((j, name, cut))
        else:
            raise Unsplittable(f"{name} is not a weight or constant to cut")

    def weight(self, name):
        """The param that tensor `name`, read once, stands for: itself, or the param of the 16-bit copy autocast
        reads it by (planner.precision's Cast, where nothing else reads the param), so that the param is cut and
        its copy follows; else None."""
        t = self.graph.tensors[name]
        if self.readers(name) != 1:
            return None
        if t.kind == "param":
            return name
        cast = self.graph.producers.get(name)
        if cast is None or (cast.op, cast.domain) != ("Cast", ""):
            return None
        source = self.graph.tensors[cast.inputs[0]]
        return source.name if source.kind == "param" and self.readers(source.name) == 1 else None

    def broadcast(self, k, j, name, axis, rank, cut):
        """Input `j` of node `k` broadcast against an output of `rank` dims split on `axis`: along it, or cut
        alike where it has that dim whole."""
        shape = self.shape(name)
        dim = axis - (rank - len(shape))
        if dim >= 0 and shape[dim] != 1:
            self.cut_operand(k, j, name, dim, cut)


def column(region, node):
    """The dim of the weight to cut where `node` is a column-parallel layer: a MatMul or Gemm (an op of the
    default domain that the "matmul" or "gemm" rule follows; a Gemm not transposing A) of an activation by a
    2-D weight read nowhere else (or its 16-bit copy: Region.weight), or an Einsum making the last dim of its output
    from such a weight's (_einsum_column); else None."""
    split = None if node.domain else ops.of(node).split
    if split not in ("matmul", "gemm", "einsum") or len(node.inputs) < 2:
        return None
    x, w = (region.graph.tensors[i] for i in node.inputs[:2])
    if split == "einsum":
        return _einsum_column(region, node, x, w)
    if not (region.weight(w.name) is not None and len(w.shape) == 2
            and x.kind in ("activation", "input") and len(x.shape) >= 2):
        return None
    if split == "gemm":
        if node.attrs.get("transA", 0):
            return None
        return 0 if node.attrs.get("transB", 0) else 1
    return 1


def _einsum_roles(region, node):
    """{"batch", "contracted", "features"}: the letters of an Einsum of an activation by a weight (a mixture of
    experts' grouped GEMM, (E, C, in) by (E, out, in) -> (E, C, out)) that both operands and the output have, that
    both operands have alone, and that the weight and the output have alone; None where its equation is not such a
    product: one contracted and one feature letter, and the weight's others batch letters."""
    terms, out = ops.of(node).subscripts(node, [region.shape(i) for i in node.inputs])
    if len(terms) != 2 or "..." in "".join(terms) + out:
        return None
    xs, ws = terms
    roles = {"batch": set(xs) & set(ws) & set(out), "contracted": (set(xs) & set(ws)) - set(out),
             "features": (set(ws) & set(out)) - set(xs)}
    if len(roles["contracted"]) != 1 or len(roles["features"]) != 1 or len(set(ws)) != len(ws) or \
            set(ws) != set().union(*roles.values()):
        return None
    return {"batch": roles["batch"], **{k: roles[k].pop() for k in ("contracted", "features")},
            "terms": terms, "out": out}


def _einsum_column(region, node, x, w):
    """The dim of the weight to cut where the Einsum `node` is a column-parallel layer: an activation by a weight
    read nowhere else (Region.weight) whose feature letter is the output's last dim."""
    roles = _einsum_roles(region, node)
    if roles is None or region.weight(w.name) is None or x.kind not in ("activation", "input") or \
            roles["out"][-1] != roles["features"]:
        return None
    return roles["terms"][1].index(roles["features"])


def _einsum(region, k, node, ins):
    """A row-parallel Einsum: its activation split on the letter it contracts with a weight (each expert's down
    projection of a grouped GEMM), the weight cut alike, the product all-reduced."""
    cx, cw = ins
    roles = _einsum_roles(region, node)
    if roles is None or cx is None or cw is not None or roles["terms"][0][cx.axis] != roles["contracted"]:
        raise Unsplittable(f"{node.name} (Einsum) reads a split tensor other than the features it contracts")
    return _row(region, k, node, cx, roles["terms"][1].index(roles["contracted"]))


def rule(node):
    """The rule that follows a region through `node`: fn(region, k, node, input cuts) -> output cuts, the one
    its schema names (`Schema.split`); a rule refusing the split for an op that names none."""
    return RULES.get(ops.of(node).split, _unknown)


def _unknown(region, k, node, ins):
    raise Unsplittable(f"{node.name} ({node.op}) reads a split tensor")


def _elementwise(region, k, node, ins):
    """Broadcasting ops: the split inputs split alike on one output axis, each other input broadcast along it
    or a weight (a bias) cut alike."""
    rank = len(region.shape(node.outputs[0]))
    axes = {c.axis + rank - len(region.shape(i)) for i, c in zip(node.inputs, ins) if c is not None}
    split = [c for c in ins if c is not None]
    if len(axes) > 1 or any(not c.alike(split[0]) for c in split):
        raise Unsplittable(f"{node.name} reads tensors split unlike")
    (a,) = axes
    for j, (name, c) in enumerate(zip(node.inputs, ins)):
        if c is None and name:
            region.broadcast(k, j, name, a, rank, split[0])
    if len({id(c) for c in split}) == 1 and split[0].axis == a:
        return [split[0]] * len(node.outputs)
    for c in split:
        c.fixed = True
    return [split[0].moved(a)] * len(node.outputs)


def _same(region, k, node, ins):
    """Ops that keep their input's layout (Cast, Dropout and its mask)."""
    if any(c is not None for c in ins[1:]):
        raise Unsplittable(f"{node.name} reads a split tensor past its first input")
    ins[0].fixed = True
    return [ins[0]] * len(node.outputs)


def _norm(region, k, node, ins):
    """Norms stay whole: tensor parallelism leaves them to every rank (sequence parallelism shards them by tokens,
    planner/passes/sequence_parallel.py)."""
    raise Unsplittable(f"{node.name} normalizes a split tensor")


def _softmax(region, k, node, ins):
    c = ins[0]
    if normal_axis(ops.of(node).attr(node, "axis"), len(region.shape(node.inputs[0]))) == c.axis:
        raise Unsplittable(f"{node.name} normalizes over the split axis")
    c.fixed = True
    return [c]


def _split(region, k, node, ins):
    """Split on the split axis into consecutive blocks of any sizes (a fused QKV projection's three, an MLP's gate
    and up): each output one block's run. Along another axis each output splits as the input."""
    c, schema = ins[0], ops.of(node)
    a = normal_axis(schema.attr(node, "axis"), len(region.shape(node.inputs[0])))
    if a != c.axis:
        c.fixed = True
        return [c.moved(c.axis)] * len(node.outputs)
    sizes = schema.split_sizes(node, region.shape(node.inputs[0])[a])
    spans = _blocks(region, node, c, sizes)
    if schema.attr(node, "split") is not None or len(set(sizes)) > 1:
        region.attrs[k] = {"split": list(spans)}
    return [Cut(a, (span,)) for span in spans]


def _blocks(region, node, c, sizes):
    """The rank's spans of the consecutive blocks of `sizes` that `node` (a Split, Slices) cuts c's axis into:
    c's blocks already, or made its blocks (and those of the cuts it was viewed from) where no reader relied on
    its layout yet. A block tp does not divide is Indivisible."""
    refinable = all(not x.fixed for x in c.lineage())
    c.fixed = True
    if [span * region.tp for span in c.spans] == list(sizes):
        return c.spans
    if c.outer != 1 or not refinable or not all(sizes):
        raise Unsplittable(f"{node.name} cuts the split axis into blocks unlike its layout")
    if any(size % region.tp for size in sizes):
        raise Indivisible(f"{node.name} cuts {sum(sizes)} features into blocks of {', '.join(map(str, sizes))}, and "
                          f"{region.tp} ranks do not split each block evenly")
    spans = tuple(size // region.tp for size in sizes)
    for x in c.lineage():
        x.spans, x.fixed = spans, True
    return spans


def _view(region, k, node, ins):
    """Reshape and the other views: the ranks' split lands in the output dim whose elements hold it (hidden
    -> heads x head size, batch x heads -> one dim, and back), which must hold whole spans."""
    c, before, after = ins[0], region.shape(node.inputs[0]), region.shape(node.outputs[0])
    if after[-1] == before[-1] and c.axis == len(before) - 1:  # the features kept: blocks may still be cut
        if node.op == "Reshape":
            region.attrs[k] = {"shape": [*after[:-1], after[-1] // region.tp]}
        return [Cut(len(after) - 1, c.spans, c.fixed, c)]
    c.fixed = True
    stride = c.span * math.prod(before[c.axis + 1:])  # of the rank digit in the flat index, tp values
    for b in reversed(range(len(after))):
        tail = math.prod(after[b + 1:])
        if stride % tail == 0 and math.prod(after[b:]) % (stride * region.tp) == 0:
            break
    else:
        if math.prod(after) % (stride * region.tp) == 0:  # the ranks' runs would end inside a dim's entries
            raise Indivisible(f"{node.name} reshapes {tuple(before)} to {tuple(after)}, and its {region.tp} pieces "
                              "do not hold whole entries of one dim (fewer attention heads than ranks?)")
        raise Unsplittable(f"{node.name} scatters the split over several dims")
    span = stride // tail
    if after[b] % (span * region.tp):
        raise Indivisible(f"{node.name} makes a dim of {after[b]}, which {region.tp} ranks do not split evenly "
                          "(attention heads?)")
    if node.op == "Reshape":
        region.attrs[k] = {"shape": [d // region.tp if j == b else d for j, d in enumerate(after)]}
    return [Cut(b, (span,) * (after[b] // (span * region.tp)))]


def _slice(region, k, node, ins):
    """Slice of other axes (RoPE's halves of each head), or of one of the consecutive blocks the Slices reading a
    fused projection's output cut it into (Phi-3's q, k and v): the rank's run of that block."""
    c, schema, name = ins[0], ops.of(node), node.inputs[0]
    if any(ins[1:]):
        raise Unsplittable(f"{node.name} reads a split tensor past its first input")
    shape = region.shape(name)
    start, stop, step = schema.slices(node, shape)[c.axis].indices(shape[c.axis])
    if (start, stop, step) == (0, shape[c.axis], 1):
        c.fixed = True
        return [c.moved(c.axis)]
    ranges = _consecutive(region, name, c.axis)
    spans = _blocks(region, node, c, [end - begin for begin, end in ranges])
    j = ranges.index((start, stop))
    begin = sum(spans[:j])
    starts, ends = list(schema.attr(node, "starts")), list(schema.attr(node, "ends"))
    axes = schema.attr(node, "axes")
    at = [normal_axis(a, len(shape)) for a in (range(len(starts)) if axes is None else axes)].index(c.axis)
    starts[at], ends[at] = begin, begin + spans[j]
    region.attrs[k] = {"starts": starts, "ends": ends}
    return [Cut(c.axis, (spans[j],))]


def _consecutive(region, name, axis):
    """The (start, stop) ranges, left to right, that the readers of `name` slice its `axis` into: every reader a
    Slice of step 1 along it, the ranges consecutive blocks that cover it (ranges alike read one block); else
    the region cannot follow them."""
    dim = region.shape(name)[axis]
    ranges = set()
    for reader in region.graph.consumers[name]:
        if reader.op != "Slice" or reader.domain or reader.inputs[0] != name:
            raise Unsplittable(f"{reader.name} reads {name}, which Slices cut into blocks")
        start, stop, step = ops.of(reader).slices(reader, region.shape(name))[axis].indices(dim)
        if step != 1 or stop <= start:
            raise Unsplittable(f"{reader.name} slices the split axis with step {step}, or to nothing")
        ranges.add((start, stop))
    ranges = sorted(ranges)
    if [r[0] for r in ranges] != [0, *(r[1] for r in ranges[:-1])] or ranges[-1][1] != dim:
        raise Unsplittable(f"the slices of {name} along the split axis overlap or leave gaps")
    return ranges


def _concat(region, k, node, ins):
    """Concat along another axis of inputs split alike."""
    rank = len(region.shape(node.outputs[0]))
    a = normal_axis(ops.of(node).attr(node, "axis"), rank)
    if any(c is None or c.axis == a or not c.alike(ins[0]) or c.axis != ins[0].axis for c in ins):
        raise Unsplittable(f"{node.name} concatenates a whole tensor, or along the split axis")
    for c in ins:
        c.fixed = True
    return [ins[0].moved(ins[0].axis)]


def _expand(region, k, node, ins):
    """Expand of other axes (grouped-query attention's shared key and value heads)."""
    c, before, after = ins[0], region.shape(node.inputs[0]), region.shape(node.outputs[0])
    a = c.axis + len(after) - len(before)
    if after[a] != before[c.axis]:
        raise Unsplittable(f"{node.name} expands the split axis")
    shape = list(ops.of(node).attr(node, "shape"))
    j = a - (len(after) - len(shape))
    if j >= 0 and shape[j] == after[a]:
        shape[j] //= region.tp
        region.attrs[k] = {"shape": shape}
    c.fixed = True
    return [c.moved(a)]


def _transpose(region, k, node, ins):
    c = ins[0]
    c.fixed = True
    perm = list(node.attrs.get("perm") or reversed(range(len(region.shape(node.inputs[0])))))
    return [c.moved(perm.index(c.axis))]


def _attention(region, k, node, ins):
    """memplan.ScaledDotProductAttention over heads: Q, K and V split on the heads axis, a bias broadcast
    over heads."""
    q, key, v, *bias = ins
    if any(c is None or c.axis != 1 or c.outer != 1 for c in (q, key, v)) or any(bias):
        raise Unsplittable(f"{node.name} reads Q, K and V not split by heads alike")
    if len(node.inputs) > 3 and node.inputs[3]:
        shape = region.shape(node.inputs[3])
        if len(shape) >= 3 and shape[len(shape) - 3] != 1:
            raise Unsplittable(f"{node.name} reads a bias of each head")
    return [Cut(1, q.spans) for _ in node.outputs]


def _row(region, k, node, c, weight_dim):
    """A row-parallel layer: its input split on the contracted features, its weight cut in rows."""
    if c.outer != 1:
        raise Unsplittable(f"{node.name} contracts a merged or fused split")
    region.cut_operand(k, 1, node.inputs[1], weight_dim, c)
    region.rows.add(k)
    return [None]


def _matmul(region, k, node, ins):
    """A row-parallel MatMul (the product all-reduced), or one batched over a split axis."""
    cx, cy = ins
    x, y = (region.shape(i) for i in node.inputs)
    if cx is not None and cy is None and cx.axis == len(x) - 1 and len(y) == 2:
        return _row(region, k, node, cx, 0)
    rank = len(region.shape(node.outputs[0]))
    axes = {c.axis + rank - len(s) for c, s in ((cx, x), (cy, y)) if c is not None}
    if len(axes) != 1 or max(axes) >= rank - 2 or (cx and cy and not cx.alike(cy)):
        raise Unsplittable(f"{node.name} contracts a split axis")
    (a,) = axes
    for c, s in ((cx, x), (cy, y)):
        if c is None and a - (rank - len(s)) >= 0 and s[a - (rank - len(s))] != 1:
            raise Unsplittable(f"{node.name} reads a whole tensor beside a split one")
        elif c is not None:
            c.fixed = True
    return [(cx or cy).moved(a)]


def _gemm(region, k, node, ins):
    """A row-parallel Gemm: its bias C added once the product is all-reduced."""
    cx, cw, *rest = ins + [None]
    if cx is None or cx.axis != 1 or cw is not None or any(rest) or node.attrs.get("transA", 0) \
            or node.attrs.get("beta", 1.0) != 1.0:
        raise Unsplittable(f"{node.name} (Gemm) reads a split tensor other than its input's features")
    return _row(region, k, node, cx, 1 if node.attrs.get("transB", 0) else 0)


RULES = {"elementwise": _elementwise, "same": _same, "norm": _norm, "softmax": _softmax, "split": _split,
         "view": _view, "slice": _slice, "concat": _concat, "expand": _expand, "transpose": _transpose,
         "attention": _attention, "matmul": _matmul, "gemm": _gemm, "einsum": _einsum}
"""The rules by the name an op's schema gives (`Schema.split`)."""
