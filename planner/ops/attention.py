"""ONNX's Attention and RotaryEmbedding (opset 23 on) as composites: planning replaces each by MatMul,
Softmax, Reshape, Transpose, Concat, Slice, Where and elementwise ops, so that they run and
differentiate with nothing of their own. Their building blocks (`attend`, `rotary`, the head
layouts) also build ONNX Runtime's contrib forms (planner/ops/contrib_attention.py)."""
import math

import numpy as np
from onnx import helper

from .registry import schema
from .base import Schema, broadcast
from ..dtypes import to_onnx
from ..errors import ShapeError


def widening(schema_, b, dtype):
    """A function casting a tensor of `dtype` to the accumulation dtype where `dtype` is a narrow float
    (the composites compute in float32 and round once at the end, as a fused kernel would)."""
    wide = schema_.accumulation(dtype)
    return (lambda name: b.cast(name, wide)) if wide != dtype else (lambda name: name)


def additive(b, allowed, like, fill=-np.inf):
    """A bool mask as a bias to add to scores: 0 where `allowed`, `fill` elsewhere (dtype of `like`)."""
    return b.op("Where", allowed, b.const(0, like), b.const(fill, like))


def within(b, like, keys, lows=(), highs=()):
    """Whether low <= key <= high for every low and high: int arrays that broadcast with `keys` (key
    positions). The mask is computed when running from these small index arrays (folded into a constant
    when small), so that a long sequence's (S, T) mask is never stored; also returned in NumPy."""
    anchor = b.cast(b.op("Shape", like), np.int64)  # an int64 tensor for constants (folded, then pruned)
    allowed, values = None, True
    for low, high in [(low, None) for low in lows] + [(None, high) for high in highs]:
        pair = (b.const(low, anchor), b.const(keys, anchor)) if high is None else (b.const(keys, anchor),
                                                                                   b.const(high, anchor))
        test = b.op("LessOrEqual", *pair)
        allowed = test if allowed is None else b.op("And", allowed, test)
        values = values & ((low <= keys) if high is None else (keys <= high))
    return allowed, values


def attend(b, q, kt, v, dims, scale, like, softcap=0.0, bias=None, guard=False, softmax_dtype=None,
           sqrt_scale=True):
    """Scaled dot-product attention over heads, with grouped keys and values.

    q (B, Hq, Sq, D), kt (B, Hk, D, Sk) and v (B, Hk, Sk, Dv), `dims` their sizes by those letters;
    query head h reads key head h // (Hq / Hk) (grouped-query attention, without copying K or V).
    Scores are scaled (Q and K each by sqrt(scale), as ONNX's function body, or the product once),
    soft-capped, biased, and soft-maxed; where `guard`, a row whose bias is all -inf yields zeros (and
    no NaN, in value or gradient). Returns Y (B, Hq, Sq, Dv) and the scores by ONNX's
    qk_matmul_output_mode: 0 raw, 1 soft-capped, 2 biased, 3 the probabilities."""
    batch, hq, hk, sq, sk = dims["B"], dims["Hq"], dims["Hk"], dims["Sq"], dims["Sk"]
    if sqrt_scale:
        root = b.const(math.sqrt(scale), like)
        q, kt = b.op("Mul", q, root), b.op("Mul", kt, root)
    groups = hq // hk
    if groups > 1:
        q = b.op("Reshape", q, shape=[batch, hk, groups * sq, dims["D"]])
    scores = b.op("MatMul", q, kt)
    if groups > 1:
        scores = b.op("Reshape", scores, shape=[batch, hq, sq, sk])
    if not sqrt_scale:
        scores = b.op("Mul", scores, b.const(scale, like))
    modes = {0: scores}
    if softcap > 0:
        cap = b.const(softcap, like)
        scores = b.op("Mul", b.op("Tanh", b.op("Div", scores, cap)), cap)
    modes[1] = scores
    if bias is not None:
        scores = b.op("Add", scores, bias)
    modes[2] = scores
    if guard:
        masked = b.op("IsInf", b.op("ReduceMax", bias, axes=[-1], keepdims=1), detect_positive=0)
        zero = b.const(0, like)
        scores = b.op("Where", masked, zero, scores)
    if softmax_dtype is not None and np.dtype(softmax_dtype) != b.dtype(like):
        probs = b.op("Cast", b.op("Softmax", b.op("Cast", scores, to=to_onnx(softmax_dtype)), axis=-1),
                     to=to_onnx(b.dtype(like)))
    else:
        probs = b.op("Softmax", scores, axis=-1)
    if guard:
        probs = b.op("Where", masked, zero, probs)
    modes[3] = probs
    if groups > 1:
        probs = b.op("Reshape", probs, shape=[batch, hk, groups * sq, sk])
    y = b.op("MatMul", probs, v)
    if groups > 1:
        y = b.op("Reshape", y, shape=[batch, hq, sq, dims["Dv"]])
    return y, modes


def summed(b, parts):
    """The sum of the tensors `parts` (broadcasting); None for none."""
    total = parts[0] if parts else None
    for part in parts[1:]:
        total = b.op("Add", total, part)
    return total


def heads_first(b, x, batch, seq, heads, size, last=False):
    """(B, S, H * size) as (B, H, S, size), or with `last` as (B, H, size, S) (keys, transposed)."""
    x = b.op("Reshape", x, shape=[batch, seq, heads, size])
    return b.op("Transpose", x, perm=[0, 2, 3, 1] if last else [0, 2, 1, 3])


def heads_last(b, y, batch, seq, heads, size):
    """(B, H, S, size) back as (B, S, H * size)."""
    return b.op("Reshape", b.op("Transpose", y, perm=[0, 2, 1, 3]), shape=[batch, seq, heads * size])


def given(names, inputs):
    """{name: input} of the inputs a node gives (names or Infos), by the op's input names."""
    return {k: v for k, v in zip(names, inputs) if v}


def wants(node, k):
    """Whether the node uses its output k."""
    return k < len(node.outputs) and bool(node.outputs[k])


def output(b, name, node, k):
    """Output k's name, or None where the node omits it; a node's own input is copied first (the
    decomposition renames what it returns)."""
    if not wants(node, k):
        return None
    return b.op("Identity", name) if name in node.inputs else name


@schema("Attention", since=23)
class Attention(Schema):
    """Attention (opsets 23 to 25): Q (B, Hq, Sq, D) or (B, Sq, Hq D) with q_num_heads, K and V
    likewise with kv_num_heads; attn_mask bool or additive (its last dim may be short: padded
    masked), is_causal (offset by past_key's length, or per batch by nonpad_kv_seqlen), the window
    bounds, scale, softcap, softmax_precision; past_key and past_value concatenated into the present
    outputs; the qk_matmul_output of every mode. A fully masked row gives zeros. It computes in its
    inputs' dtype, the softmax in softmax_precision, as ONNX's function body does."""

    autocast = "low"
    defaults = {"is_causal": 0, "kv_num_heads": None, "q_num_heads": None, "qk_matmul_output_mode": 0,
                "scale": None, "softcap": 0.0, "softmax_precision": None, "left_window_size": -1,
                "right_window_size": -1}

    def shapes(self, node, shapes):
        """{letter: size} of the op's dims (see `attend`), 'past' and 'rank', from the inputs' shapes;
        ShapeError where they disagree."""
        q, k, v, mask, past_k, past_v, nonpad = (list(shapes) + [None] * 7)[:7]
        rank = len(q)
        if rank not in (3, 4) or len(k) != rank or len(v) != rank:
            raise ShapeError(f"Q, K and V must all be 3-D or all 4-D, got shapes {q}, {k} and {v}")
        if rank == 3:
            hq, hk = self.attr(node, "q_num_heads"), self.attr(node, "kv_num_heads")
            if not hq or not hk:
                raise ShapeError("3-D inputs need the q_num_heads and kv_num_heads attributes")
            for name, size, heads in (("Q", q[2], hq), ("K", k[2], hk), ("V", v[2], hk)):
                if size % heads:
                    raise ShapeError(f"{name}'s hidden size {size} is not a multiple of its {heads} heads")
            dims = dict(B=q[0], Hq=hq, Hk=hk, Sq=q[1], Skv=k[1], D=q[2] // hq, Dk=k[2] // hk, Dv=v[2] // hk)
            v_seq = v[1]
        else:
            dims = dict(B=q[0], Hq=q[1], Hk=k[1], Sq=q[2], Skv=k[2], D=q[3], Dk=k[3], Dv=v[3])
            v_seq = v[2]
            if v[1] != k[1]:
                raise ShapeError(f"K and V must have the same number of heads, got {k[1]} and {v[1]}")
        if not q[0] == k[0] == v[0]:
            raise ShapeError(f"Q, K and V must have one batch size, got {q[0]}, {k[0]} and {v[0]}")
        if v_seq != dims["Skv"]:
            raise ShapeError(f"K and V must have one sequence length, got {dims['Skv']} and {v_seq}")
        if dims["Dk"] != dims["D"]:
            raise ShapeError(f"Q and K must have one head size, got {dims['D']} and {dims['Dk']}")
        if dims["Hq"] % dims["Hk"]:
            raise ShapeError(f"the {dims['Hq']} query heads are not a multiple of the {dims['Hk']} key heads")
        if (past_k is None) != (past_v is None):
            raise ShapeError("past_key and past_value must be given together")
        dims["past"] = 0
        if past_k is not None:
            if nonpad is not None:
                raise ShapeError("nonpad_kv_seqlen cannot be combined with past_key and past_value")
            past = past_k[2] if len(past_k) == 4 else -1
            if (tuple(past_k), tuple(past_v)) != ((dims["B"], dims["Hk"], past, dims["D"]),
                                                  (dims["B"], dims["Hk"], past, dims["Dv"])):
                raise ShapeError(f"past_key and past_value must be (batch, kv heads, past, head size), got "
                                 f"{tuple(past_k)} and {tuple(past_v)}")
            dims["past"] = past
        dims["Sk"] = dims["past"] + dims["Skv"]
        if mask is not None:
            if not mask or mask[-1] > dims["Sk"]:
                raise ShapeError(f"attn_mask of shape {tuple(mask)} is longer than the {dims['Sk']} keys")
            broadcast(tuple(mask[:-1]) + (dims["Sk"],), (dims["B"], dims["Hq"], dims["Sq"], dims["Sk"]))
        if nonpad is not None and tuple(nonpad) != (dims["B"],):
            raise ShapeError(f"nonpad_kv_seqlen must have one length per batch, shape ({dims['B']},); got {nonpad}")
        dims["rank"] = rank
        return dims

    def infer(self, node, ins):
        q, k, v, mask = (list(ins) + [None] * 4)[:4]
        for name, info in (("K", k), ("V", v)):
            if info.dtype != q.dtype:
                raise ShapeError(f"{name} is {info.dtype}, Q {q.dtype}: they must have one dtype")
        if mask is not None and mask.dtype != np.bool_ and mask.dtype != q.dtype:
            raise ShapeError(f"attn_mask must be bool or Q's dtype {q.dtype}, got {mask.dtype}")
        if self.attr(node, "qk_matmul_output_mode") not in (0, 1, 2, 3):
            raise ShapeError(f"qk_matmul_output_mode must be 0 to 3, got {self.attr(node, 'qk_matmul_output_mode')}")
        for side in ("left_window_size", "right_window_size"):
            if self.attr(node, side) < -1:
                raise ShapeError(f"{side} must be -1 (unbounded) or at least 0, got {self.attr(node, side)}")
        d = self.shapes(node, [None if i is None else i.shape for i in ins])
        y = (d["B"], d["Sq"], d["Hq"] * d["Dv"]) if d["rank"] == 3 else (d["B"], d["Hq"], d["Sq"], d["Dv"])
        return [(y, q.dtype), ((d["B"], d["Hk"], d["Sk"], d["D"]), q.dtype),
                ((d["B"], d["Hk"], d["Sk"], d["Dv"]), v.dtype), ((d["B"], d["Hq"], d["Sq"], d["Sk"]), q.dtype)]

    def decompose(self, b, node):
        names = (list(node.inputs) + [""] * 7)[:7]
        q, k, v, mask, past_k, past_v, nonpad = (n or None for n in names)
        d = self.shapes(node, [b.shape(n) if n else None for n in names])
        batch, hq, hk, sq, skv = d["B"], d["Hq"], d["Hk"], d["Sq"], d["Skv"]
        queries = heads_first(b, q, batch, sq, hq, d["D"]) if d["rank"] == 3 else q
        if d["rank"] == 3 and past_k is None and not wants(node, 1):
            present_k, kt = None, heads_first(b, k, batch, skv, hk, d["D"], last=True)
        else:
            keys = heads_first(b, k, batch, skv, hk, d["D"]) if d["rank"] == 3 else k
            present_k = b.op("Concat", past_k, keys, axis=2) if past_k else keys
            kt = b.op("Transpose", present_k, perm=[0, 1, 3, 2])
        values = heads_first(b, v, batch, skv, hk, d["Dv"]) if d["rank"] == 3 else v
        present_v = b.op("Concat", past_v, values, axis=2) if past_v else values
        bias, guard = self.bias(b, node, d, mask, nonpad, q)
        scale = self.attr(node, "scale")
        precision = self.attr(node, "softmax_precision")
        y, modes = attend(b, queries, kt, present_v, d, 1 / math.sqrt(d["D"]) if scale is None else scale, q,
                          softcap=self.attr(node, "softcap"), bias=bias, guard=guard,
                          softmax_dtype=None if precision is None else helper.tensor_dtype_to_np_dtype(precision))
        if d["rank"] == 3:
            y = heads_last(b, y, batch, sq, hq, d["Dv"])
        qk = modes[self.attr(node, "qk_matmul_output_mode")]
        return [y, output(b, present_k, node, 1), output(b, present_v, node, 2), output(b, qk, node, 3)]

    def bias(self, b, node, d, mask, nonpad, like):
        """The additive bias of the scores (None without one), and whether a row may be all masked."""
        sq, sk = d["Sq"], d["Sk"]
        parts, guard = [], False
        if mask is not None:
            shape = b.shape(mask)
            if shape[-1] < sk:
                fill = np.zeros if b.dtype(mask) == np.bool_ else lambda s, dtype: np.full(s, -np.inf, dtype)
                pad = b.const(fill((*shape[:-1], sk - shape[-1]), dtype=b.dtype(mask)), mask)
                mask = b.op("Concat", mask, pad, axis=-1)
            parts.append(additive(b, mask, like) if b.dtype(mask) == np.bool_ else mask)
            guard = True
        causal, left, right = (self.attr(node, a) for a in ("is_causal", "left_window_size", "right_window_size"))
        i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
        if nonpad is not None:
            n = b.op("Reshape", nonpad, shape=[d["B"], 1, 1, 1])
            after = j - i + sq  # query i attends key j while j <= i + n - sq
            allowed = b.op("Less", b.const(j, nonpad), n)
            bounds = []
            if causal:
                bounds.append((b.const(after, nonpad), n))
            if left >= 0:
                bounds.append((n, b.const(after + left, nonpad)))
            if right >= 0:
                bounds.append((b.const(after - right, nonpad), n))
            for pair in bounds:
                allowed = b.op("And", allowed, b.op("LessOrEqual", *pair))
            parts.append(additive(b, allowed, like))
            guard = True
        elif causal or left >= 0 or right >= 0:
            place = i + d["past"]
            highs = [place] * bool(causal) + [place + right] * (right >= 0)
            allowed, values = within(b, like, j, lows=[place - left] * (left >= 0), highs=highs)
            parts.append(additive(b, allowed, like))
            guard = guard or not np.broadcast_to(values, (sq, sk)).any(axis=1).all()
        return summed(b, parts), guard


def rotate(b, x, shape, cos, sin, dim, interleaved):
    """x (..., D) with its first `dim` features rotated in pairs by angles whose cosines and sines
    broadcast as (..., dim / 2): halves (x1, x2) = (first, second half), or with `interleaved` the
    (even, odd) features; the rest of x passes as it is."""
    half, size = dim // 2, shape[-1]
    rotated = x if dim == size else b.op("Slice", x, starts=[0], ends=[dim], axes=[-1])
    if interleaved:
        pairs = b.op("Reshape", rotated, shape=[*shape[:-1], half, 2])
        x1, x2 = (b.op("Slice", pairs, starts=[k], ends=[k + 1], axes=[-1]) for k in (0, 1))
        cos, sin = (b.op("Unsqueeze", t, axes=[-1]) for t in (cos, sin))
    else:
        x1, x2 = (b.op("Slice", rotated, starts=[k * half], ends=[(k + 1) * half], axes=[-1]) for k in (0, 1))
    real = b.op("Sub", b.op("Mul", cos, x1), b.op("Mul", sin, x2))
    imag = b.op("Add", b.op("Mul", sin, x1), b.op("Mul", cos, x2))
    y = b.op("Concat", real, imag, axis=-1)
    if interleaved:
        y = b.op("Reshape", y, shape=[*shape[:-1], dim])
    if dim < size:
        y = b.op("Concat", y, b.op("Slice", x, starts=[dim], ends=[size], axes=[-1]), axis=-1)
    return y


def rotary(b, x, shape, heads, cos, sin, dim, interleaved):
    """x (B, H, S, D), or (B, S, H D) of `heads` heads, rotated (see `rotate`) by the angles of the
    caches (B or 1, S, dim / 2) as gathered for its positions."""
    if len(shape) == 4:
        cos, sin = (b.op("Unsqueeze", t, axes=[1]) for t in (cos, sin))
        return rotate(b, x, shape, cos, sin, dim, interleaved)
    cos, sin = (b.op("Unsqueeze", t, axes=[2]) for t in (cos, sin))
    four = [shape[0], shape[1], heads, shape[2] // heads]
    y = rotate(b, b.op("Reshape", x, shape=four), four, cos, sin, dim, interleaved)
    return b.op("Reshape", y, shape=list(shape))


@schema("RotaryEmbedding", since=23)
class RotaryEmbedding(Schema):
    """RotaryEmbedding (opset 23): X (B, H, S, D) or (B, S, H D) with num_heads; the caches
    (B, S, dim / 2), or (positions, dim / 2) read at position_ids (B, S); the first
    rotary_embedding_dim features (all by default) rotated, halves or interleaved pairs."""

    defaults = {"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0}

    def layout(self, node, x, cos, positions):
        """(batch, sequence, heads, head size, rotated dims) from the inputs' shapes."""
        if len(x) == 4:
            batch, heads, seq, size = x
        elif len(x) == 3:
            heads = self.attr(node, "num_heads")
            if not heads or x[2] % heads:
                raise ShapeError(f"a 3-D input needs num_heads dividing its hidden size {x[2]}, got {heads}")
            batch, seq, size = x[0], x[1], x[2] // heads
        else:
            raise ShapeError(f"the input must be 3-D or 4-D, got shape {tuple(x)}")
        dim = self.attr(node, "rotary_embedding_dim") or size
        if dim % 2 or dim > size:
            raise ShapeError(f"rotary_embedding_dim {dim} must be even and at most the head size {size}")
        want = (batch, seq, dim // 2)
        if positions is not None:
            if tuple(positions) != (batch, seq) or len(cos) != 2 or cos[1] != dim // 2:
                raise ShapeError(f"position_ids must be (batch, sequence) = {(batch, seq)} and the caches "
                                 f"(positions, {dim // 2}); got {tuple(positions)} and {tuple(cos)}")
        elif tuple(cos) != want:
            raise ShapeError(f"without position_ids the caches must be {want}, got {tuple(cos)}")
        return batch, seq, heads, size, dim

    def infer(self, node, ins):
        x, cos, sin, positions = (list(ins) + [None])[:4]
        if cos.shape != sin.shape:
            raise ShapeError(f"cos_cache and sin_cache must have one shape, got {cos.shape} and {sin.shape}")
        self.layout(node, x.shape, cos.shape, None if positions is None else positions.shape)
        return [(x.shape, x.dtype)]

    def decompose(self, b, node):
        x, cos, sin, positions = (list(node.inputs) + [""])[:4]
        shape = b.shape(x)
        _, _, heads, _, dim = self.layout(node, shape, b.shape(cos), b.shape(positions) if positions else None)
        widen = widening(self, b, b.dtype(x))
        wide, cos, sin = widen(x), widen(cos), widen(sin)
        if positions:
            cos, sin = b.op("Gather", cos, positions, axis=0), b.op("Gather", sin, positions, axis=0)
        y = rotary(b, wide, shape, heads, cos, sin, dim, self.attr(node, "interleaved"))
        return [b.cast(y, b.dtype(x)) if wide != x else y]
