"""ONNX Runtime's contrib attention ops (domain "com.microsoft", version 1) as composites, in the forms
its transformer optimizer and Optimum's exports write: RotaryEmbedding, MultiHeadAttention,
Attention and GroupQueryAttention. Built on attention.py's helpers; scores are scaled once
(Q K^T times scale), and masks add mask_filter_value, as onnxruntime computes them. The forms they
do not cover (buffer sharing, beam search indirection, quantized caches) are refused by name."""
import math

import numpy as np

from .registry import schema
from .attention import additive, attend, given, heads_first, heads_last, output, rotary, summed, wants, widening, within
from .base import FLOATS, Schema, broadcast
from ..dtypes import to_onnx
from ..errors import ShapeError

DOMAIN = "com.microsoft"
INT32 = frozenset({"tensor(int32)"})


def refuse_given(node, names, inputs=(), attrs=()):
    """ShapeError for each input of `inputs` (indices into `names`) the node gives, and each attribute
    of `attrs` (name, value it must keep) it sets otherwise."""
    for k in inputs:
        if k < len(node.inputs) and node.inputs[k]:
            raise ShapeError(f"input {names[k]} is not supported")
    for name, value in attrs:
        if node.attrs.get(name, value) != value:
            raise ShapeError(f"attribute {name}={node.attrs[name]} is not supported (only {value})")


@schema("RotaryEmbedding", domain=DOMAIN)
class RotaryEmbedding(Schema):
    """RotaryEmbedding: input (B, S, N H) or (B, N, S, H); position_ids (B, S), or (1,) the position
    of the first token; caches (positions, dim / 2); interleaved, rotary_embedding_dim, num_heads."""

    defaults = {"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0, "is_packed_batching": 0, "scale": 1.0}
    types = (("T", "M", "T", "T"), {"T": FLOATS - {"tensor(double)"}, "M": frozenset({"tensor(int64)"})})

    def layout(self, node, x, positions, cos):
        """(heads, rotated dims) from the shapes, checked."""
        refuse_given(node, (), attrs=(("is_packed_batching", 0), ("scale", 1.0)))
        dim, heads = self.attr(node, "rotary_embedding_dim"), self.attr(node, "num_heads")
        if len(cos) != 2:
            raise ShapeError(f"the caches must be 2-D (positions, dim / 2), got {tuple(cos)}")
        if len(x) == 4:
            heads, size = x[1], x[3]
        elif len(x) == 3:
            heads = heads or x[2] // (dim or 2 * cos[1])
            if not heads or x[2] % heads:
                raise ShapeError(f"num_heads {heads} does not divide the hidden size {x[2]}")
            size = x[2] // heads
        else:
            raise ShapeError(f"the input must be 3-D or 4-D, got shape {tuple(x)}")
        dim = dim or size
        if dim % 2 or dim > size or cos[1] != dim // 2:
            raise ShapeError(f"the caches' last dim {cos[1]} must be half the even rotary dim {dim} <= head size {size}")
        seq = x[2] if len(x) == 4 else x[1]
        if tuple(positions) not in ((1,), (x[0], seq)):
            raise ShapeError(f"position_ids must be (1,) or (batch, sequence) = {(x[0], seq)}, got {tuple(positions)}")
        return heads, dim

    def infer(self, node, ins):
        x, positions, cos, sin = ins
        if cos.shape != sin.shape:
            raise ShapeError(f"cos_cache and sin_cache must have one shape, got {cos.shape} and {sin.shape}")
        self.layout(node, x.shape, positions.shape, cos.shape)
        return [(x.shape, x.dtype)]

    def decompose(self, b, node):
        x, positions, cos, sin = node.inputs
        shape = b.shape(x)
        heads, dim = self.layout(node, shape, b.shape(positions), b.shape(cos))
        if b.shape(positions) == (1,):
            seq = shape[2] if len(shape) == 4 else shape[1]
            positions = b.op("Add", b.const(np.arange(seq)[None], positions), positions)
        widen = widening(self, b, b.dtype(x))
        cos, sin = (b.op("Gather", widen(t), positions, axis=0) for t in (cos, sin))
        y = rotary(b, widen(x), shape, heads, cos, sin, dim, self.attr(node, "interleaved"))
        return [b.cast(y, b.dtype(x)) if b.dtype(x) != self.accumulation(b.dtype(x)) else y]


def key_mask(b, mask, batch, seq, total, fill, like):
    """The additive bias (broadcasting to (B, N, S, T)) of an int32 key mask: lengths (B,) (key j is
    kept while j < length), or 1/0 per key (B, T) or per query and key (B, S, T); `fill` where masked."""
    shape = tuple(b.shape(mask))
    if shape == (batch,):
        keep = b.op("Less", b.const(np.arange(total), mask), b.op("Reshape", mask, shape=[batch, 1]))
        keep = b.op("Reshape", keep, shape=[batch, 1, 1, total])
    elif shape in ((batch, total), (batch, seq, total)):
        keep = b.op("Greater", mask, b.const(0, mask))
        keep = b.op("Reshape", keep, shape=[batch, 1, 1 if len(shape) == 2 else seq, total])
    else:
        raise ShapeError(f"the key mask must be lengths ({batch},), or ({batch}, {total}) or ({batch}, {seq}, "
                         f"{total}) of ones and zeros; got {shape}")
    return b.op("Where", keep, b.const(0, like), b.const(fill, like))


def scores_bias(b, node, d, mask, extra, fill, like):
    """The sum of a key mask's bias, an additive attention_bias `extra` and, with unidirectional, a
    causal one (fill above the diagonal offset by the past); None when there is none."""
    parts = []
    if mask:
        parts.append(key_mask(b, mask, d["B"], d["Sq"], d["Sk"], fill, like))
    if extra:
        parts.append(extra)
    if node.attrs.get("unidirectional", 0):
        allowed, _ = within(b, like, np.arange(d["Sk"])[None], highs=[np.arange(d["Sq"])[:, None] + d["past"]])
        parts.append(additive(b, allowed, like, fill))
    return summed(b, parts)


def check_extra(extra, d):
    """attention_bias must broadcast as (B or 1, N or 1, S, T)."""
    if extra is not None and (len(extra) != 4 or broadcast(extra, (d["B"], d["Hq"], d["Sq"], d["Sk"])) !=
                              (d["B"], d["Hq"], d["Sq"], d["Sk"])):
        raise ShapeError(f"attention_bias must be (batch or 1, heads or 1, {d['Sq']}, {d['Sk']}), got {tuple(extra)}")


class ContribAttention(Schema):
    """What MultiHeadAttention, Attention and GroupQueryAttention share: the narrow floats computed in
    float32 (as onnxruntime's CPU kernels do), the present caches kept in the inputs' dtype."""

    names = ()

    def widen(self, b, node, name):
        """`name` in the accumulation dtype of the op's input 0."""
        return widening(self, b, b.dtype(node.inputs[0]))(name)

    def like(self, b, node, query):
        """A tensor of the computing dtype for constants: `query` where it was cast, else input 0."""
        return query if self.accumulation(b.dtype(node.inputs[0])) != b.dtype(node.inputs[0]) else node.inputs[0]

    def finish(self, b, node, y, dims):
        """Y (B, N, S, Hv) as (B, S, N Hv) in the input dtype."""
        y = heads_last(b, y, dims["B"], dims["Sq"], dims["Hq"], dims["Dv"])
        dtype = b.dtype(node.inputs[0])
        return b.cast(y, dtype) if self.accumulation(dtype) != dtype else y


def unpacked(b, x, k, batch, seq, heads, size):
    """Part k of packed (B, S, N, parts, H) as (B, N, S, H)."""
    part = b.op("Slice", x, starts=[k], ends=[k + 1], axes=[3])
    return b.op("Transpose", b.op("Reshape", part, shape=[batch, seq, heads, size]), perm=[0, 2, 1, 3])


@schema("MultiHeadAttention", domain=DOMAIN)
class MultiHeadAttention(ContribAttention):
    """MultiHeadAttention: query (B, S, D) with key and value (B, L, D) and (B, L, Dv), their bias
    (D + D + Dv,) added; or packed QKV (B, S, N, 3, H); or packed KV (B, L, N, 2, H); or key and value
    already (B, N, L, H). key_padding_mask (lengths, or ones and zeros), attention_bias, past_key and
    past_value concatenated into the present outputs, unidirectional."""

    names = ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key", "past_value",
             "past_sequence_length", "cache_indirection")
    defaults = {"mask_filter_value": -10000.0, "scale": None, "unidirectional": 0}
    types = (("T", "T", "T", "T", "M", "T", "T", "T", "M", "M"), {"T": FLOATS - {"tensor(double)"}, "M": INT32})

    def layout(self, node, s):
        """{letter: size} (see attention.attend), 'form' and 'past' from the inputs' shapes {name: shape}."""
        refuse_given(node, self.names, inputs=(8, 9))
        heads, q, k, v = self.attr(node, "num_heads"), s["query"], s.get("key"), s.get("value")
        if len(q) == 5:
            if k is not None or v is not None or q[2:4] != (heads, 3):
                raise ShapeError(f"packed QKV must be (batch, sequence, {heads}, 3, head size) without key and value")
            form, length, size, v_size = "qkv", q[1], q[4], q[4]
        elif len(q) == 3 and k is not None and len(k) == 5:
            if v is not None or k[2:4] != (heads, 2) or k[4] * heads != q[2]:
                raise ShapeError(f"packed KV must be (batch, length, {heads}, 2, {q[2] // heads}) without value")
            form, length, size, v_size = "kv", k[1], k[4], k[4]
        elif len(q) == 3 and k is not None and v is not None and len(k) == len(v) in (3, 4):
            form = "3d" if len(k) == 3 else "bnsh"
            if len(k) == 3:
                length, size, v_size = k[1], k[2] // heads, v[2] // heads
                bad = k[2] != q[2] or v[2] % heads or v[1] != k[1]
            else:
                length, size, v_size = k[2], k[3], v[3]
                bad = k[1] != heads or v[1] != heads or v[2] != k[2] or k[3] * heads != q[2]
            if bad:
                raise ShapeError(f"key {tuple(k)} and value {tuple(v)} do not fit query {tuple(q)} of {heads} heads")
        else:
            raise ShapeError(f"query (B, S, D) needs key and value (3-D or 4-D) or packed KV; or packed QKV "
                             f"(B, S, N, 3, H) alone; got {tuple(q)}, {k and tuple(k)} and {v and tuple(v)}")
        if any(x is not None and x[0] != q[0] for x in (k, v)):
            raise ShapeError(f"query, key and value must have one batch size, got {q[0]}, {k and k[0]} and {v and v[0]}")
        if len(q) == 3 and q[2] % heads:
            raise ShapeError(f"the query's hidden size {q[2]} is not a multiple of its {heads} heads")
        if "bias" in s and (form != "3d" or tuple(s["bias"]) != (2 * q[2] + heads * v_size,)):
            raise ShapeError(f"bias must be ({2 * q[2] + heads * v_size},), with 3-D key and value; got {s['bias']}")
        d = dict(B=q[0], Hq=heads, Hk=heads, Sq=q[1], Skv=length, D=size, Dv=v_size, form=form, past=0)
        if ("past_key" in s) != ("past_value" in s) or ("past_key" in s and form == "bnsh"):
            raise ShapeError("past_key and past_value must be given together, with key and value not 4-D")
        if "past_key" in s:
            d["past"] = s["past_key"][2]
            if (tuple(s["past_key"]), tuple(s["past_value"])) != ((q[0], heads, d["past"], size),
                                                                   (q[0], heads, d["past"], v_size)):
                raise ShapeError(f"past_key and past_value must be (batch, {heads}, past, head size), got "
                                 f"{tuple(s['past_key'])} and {tuple(s['past_value'])}")
        d["Sk"] = d["past"] + length
        check_extra(s.get("attention_bias"), d)
        return d

    def infer(self, node, ins):
        if wants(node, 3):
            raise ShapeError("output qk is not supported")
        d = self.layout(node, {k: v.shape for k, v in given(self.names, ins).items()})
        dtype = ins[0].dtype
        return [((d["B"], d["Sq"], d["Hq"] * d["Dv"]), dtype), ((d["B"], d["Hk"], d["Sk"], d["D"]), dtype),
                ((d["B"], d["Hk"], d["Sk"], d["Dv"]), dtype)]

    def decompose(self, b, node):
        t = given(self.names, node.inputs)
        d = self.layout(node, {k: tuple(b.shape(v)) for k, v in t.items()})
        batch, heads, seq, length, size = d["B"], d["Hq"], d["Sq"], d["Skv"], d["D"]
        query, key, value = t["query"], t.get("key"), t.get("value")
        if d["form"] == "qkv":
            q, k, v = (unpacked(b, query, n, batch, seq, heads, size) for n in range(3))
        else:
            if "bias" in t:
                hidden = b.shape(query)[2]
                cuts = [0, hidden, 2 * hidden, 2 * hidden + heads * d["Dv"]]
                query, key, value = (b.op("Add", x, b.op("Slice", t["bias"], starts=[cuts[n]], ends=[cuts[n + 1]],
                                                         axes=[0]))
                                     for n, x in enumerate((query, key, value)))
            q = heads_first(b, query, batch, seq, heads, size)
            if d["form"] == "kv":
                k, v = (unpacked(b, key, n, batch, length, heads, size) for n in range(2))
            elif d["form"] == "3d":
                k, v = heads_first(b, key, batch, length, heads, size), heads_first(b, value, batch, length, heads, d["Dv"])
            else:
                k, v = key, value
        if "past_key" in t:
            k, v = b.op("Concat", t["past_key"], k, axis=2), b.op("Concat", t["past_value"], v, axis=2)
        q = self.widen(b, node, q)
        like = self.like(b, node, q)
        bias = scores_bias(b, node, d, t.get("key_padding_mask"), t.get("attention_bias") and
                           self.widen(b, node, t["attention_bias"]), self.attr(node, "mask_filter_value"), like)
        scale = self.attr(node, "scale") or 1 / math.sqrt(size)
        kt = b.op("Transpose", self.widen(b, node, k), perm=[0, 1, 3, 2])
        y, _ = attend(b, q, kt, self.widen(b, node, v), d, scale, like, bias=bias, sqrt_scale=False)
        return [self.finish(b, node, y, d), output(b, k, node, 1), output(b, v, node, 2)]


@schema("Attention", domain=DOMAIN)
class Attention(ContribAttention):
    """Attention (BERT's and GPT-2's fused form): Q, K and V projected from one input by merged
    weights (D_in, D + D + Dv) and bias; mask_index as lengths (B,) or ones and zeros (B, T) or
    (B, S, T); past (2, B, N, P, H) and present; attention_bias; unidirectional."""

    autocast = "low"
    names = ("input", "weights", "bias", "mask_index", "past", "attention_bias", "past_sequence_length")
    defaults = {"qkv_hidden_sizes": None, "unidirectional": 0, "mask_filter_value": -10000.0,
                "scale": None, "do_rotary": 0, "past_present_share_buffer": 0, "rotary_embedding_dim": 0}
    types = (("T", "T", "T", "M", "T", "T", "M"), {"T": FLOATS - {"tensor(double)"}, "M": INT32})

    def layout(self, node, s):
        refuse_given(node, self.names, inputs=(6,), attrs=(("do_rotary", 0), ("past_present_share_buffer", 0)))
        heads, x, w = self.attr(node, "num_heads"), s["input"], s["weights"]
        if len(x) != 3 or len(w) != 2 or w[0] != x[2]:
            raise ShapeError(f"input (B, S, D_in) and weights (D_in, D + D + Dv) do not fit: {tuple(x)} and {tuple(w)}")
        sizes = self.attr(node, "qkv_hidden_sizes") or [w[1] // 3] * 3
        if len(sizes) != 3 or sizes[0] != sizes[1] or sum(sizes) != w[1] or any(n % heads for n in sizes):
            raise ShapeError(f"the weights' {w[1]} columns must split as Q, K, V hidden sizes {list(sizes)}, "
                             f"each a multiple of the {heads} heads, Q's and K's equal")
        if "bias" in s and tuple(s["bias"]) != (w[1],):
            raise ShapeError(f"bias must be ({w[1]},), got {tuple(s['bias'])}")
        d = dict(B=x[0], Hq=heads, Hk=heads, Sq=x[1], Skv=x[1], D=sizes[0] // heads, Dv=sizes[2] // heads,
                 sizes=sizes, past=0)
        if "past" in s:
            d["past"] = s["past"][3] if len(s["past"]) == 5 else -1
            if tuple(s["past"]) != (2, x[0], heads, d["past"], d["D"]) or d["D"] != d["Dv"]:
                raise ShapeError(f"past must be (2, {x[0]}, {heads}, past, {d['D']}) with Q, K and V of one "
                                 f"hidden size; got {tuple(s['past'])}")
            if "attention_bias" in s:
                raise ShapeError("past and attention_bias cannot be given together (onnxruntime refuses them)")
        d["Sk"] = d["past"] + x[1]
        check_extra(s.get("attention_bias"), d)
        return d

    def infer(self, node, ins):
        d = self.layout(node, {k: v.shape for k, v in given(self.names, ins).items()})
        return [((d["B"], d["Sq"], d["Hq"] * d["Dv"]), ins[0].dtype),
                ((2, d["B"], d["Hk"], d["Sk"], d["D"]), ins[0].dtype)]

    def decompose(self, b, node):
        t = given(self.names, node.inputs)
        d = self.layout(node, {k: tuple(b.shape(v)) for k, v in t.items()})
        batch, heads, seq, size = d["B"], d["Hq"], d["Sq"], d["D"]
        qkv = b.op("MatMul", t["input"], t["weights"])
        if "bias" in t:
            qkv = b.op("Add", qkv, t["bias"])
        cuts = np.cumsum([0, *d["sizes"]]).tolist()
        q, k, v = (heads_first(b, b.op("Slice", qkv, starts=[cuts[n]], ends=[cuts[n + 1]], axes=[2]), batch, seq,
                               heads, (size, size, d["Dv"])[n]) for n in range(3))
        present = None
        if "past" in t:
            past_k, past_v = (b.op("Squeeze", b.op("Slice", t["past"], starts=[n], ends=[n + 1], axes=[0]), axes=[0])
                              for n in range(2))
            k, v = b.op("Concat", past_k, k, axis=2), b.op("Concat", past_v, v, axis=2)
            present = b.op("Concat", *(b.op("Unsqueeze", x, axes=[0]) for x in (k, v)), axis=0)
        elif wants(node, 1):
            present = b.op("Concat", *(b.op("Unsqueeze", x, axes=[0]) for x in (k, v)), axis=0)
        q = self.widen(b, node, q)
        like = self.like(b, node, q)
        bias = scores_bias(b, node, d, t.get("mask_index"), t.get("attention_bias") and
                           self.widen(b, node, t["attention_bias"]), self.attr(node, "mask_filter_value"), like)
        kt = b.op("Transpose", self.widen(b, node, k), perm=[0, 1, 3, 2])
        y, _ = attend(b, q, kt, self.widen(b, node, v), d, self.attr(node, "scale") or 1 / math.sqrt(size), like,
                      bias=bias, sqrt_scale=False)
        return [self.finish(b, node, y, d), present if wants(node, 1) else None]


@schema("GroupQueryAttention", domain=DOMAIN)
class GroupQueryAttention(ContribAttention):
    """GroupQueryAttention (LLaMA-style decoding): query (B, S, N H) with key and value (B, S, Nkv H),
    or packed (B, S, (N + 2 Nkv) H); past_key and past_value (B, Nkv, P, H), each batch's first
    seqlens_k + 1 - S of them valid (none in the first prompt, S = total_sequence_length), written
    with the new keys into present (B, Nkv, max(total, P), H), zeros past them; causal (offset by the
    past) within local_window_size keys; rotary embedding of Q and K (do_rotary) at the tokens' positions;
    scale, softcap. seqlens_k and total_sequence_length must be known when planning (they fix the
    shapes and masks)."""

    names = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
             "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
             "k_norm_weight", "query_seqlens")
    attr_inputs = (("seqlens_k", 5, 1), ("total_sequence_length", 6, 1))
    defaults = {"scale": None, "softcap": 0.0, "local_window_size": -1,
                "do_rotary": 0, "rotary_interleaved": 0, "causal": 1, "smooth_softmax": -1, "qk_output": 0}
    types = (("T", "T", "T", "T", "T", "M", "M", "T", "T", "I"),
             {"T": FLOATS - {"tensor(double)"}, "M": INT32, "I": frozenset({"tensor(int64)"})})

    def layout(self, node, s):
        refuse_given(node, self.names, inputs=range(10, 17), attrs=(("qk_output", 0), ("sliding_window_cache", 0),
                                                                      ("kv_cache_bit_width", None)))
        if node.attrs.get("smooth_softmax", -1) not in (-1, 0):
            raise ShapeError("attribute smooth_softmax=1 is not supported")
        heads, kv_heads = self.attr(node, "num_heads"), self.attr(node, "kv_num_heads")
        q, k, v = s["query"], s.get("key"), s.get("value")
        packed = k is None
        if len(q) != 3 or heads % kv_heads or (k is None) != (v is None):
            raise ShapeError(f"query must be 3-D with key and value or packed, num_heads {heads} a multiple of "
                             f"kv_num_heads {kv_heads}; got query {tuple(q)}")
        size = q[2] // (heads + 2 * kv_heads if packed else heads)
        if not packed and (tuple(k) != (q[0], q[1], kv_heads * size) or tuple(v) != tuple(k)):
            raise ShapeError(f"key and value must be ({q[0]}, {q[1]}, {kv_heads * size}), got {tuple(k)} and {tuple(v)}")
        lengths = [int(n) + 1 for n in np.ravel(self.attr(node, "seqlens_k"))]
        total = int(np.ravel(self.attr(node, "total_sequence_length"))[0])
        cache = s["past_key"][2] if "past_key" in s else 0
        if ("past_key" in s) != ("past_value" in s) or any(
                tuple(s[n]) != (q[0], kv_heads, cache, size) for n in ("past_key", "past_value") if n in s):
            raise ShapeError(f"past_key and past_value must both be ({q[0]}, {kv_heads}, past, {size})")
        seq = q[1]
        past = [0] * q[0] if seq == total else [n - seq for n in lengths]
        present = max(total, cache)
        if len(lengths) != q[0] or min(past, default=0) < 0 or max(past, default=0) > cache or \
                max(past, default=0) + seq > present:
            raise ShapeError(f"seqlens_k {[n - 1 for n in lengths]} and total_sequence_length {total} do not fit "
                             f"{seq} new tokens after a past of {cache}")
        d = dict(B=q[0], Hq=heads, Hk=kv_heads, Sq=seq, Skv=seq, Sk=present, D=size, Dv=size, past=past,
                 lengths=lengths, packed=packed)
        if self.attr(node, "do_rotary"):
            cos = s.get("cos_cache")
            if cos is None or tuple(s.get("sin_cache", ())) != tuple(cos) or len(cos) != 2 or 2 * cos[1] > size:
                raise ShapeError("do_rotary needs cos_cache and sin_cache of one shape (positions, at most head size / 2)")
        return d

    def infer(self, node, ins):
        d = self.layout(node, {k: v.shape for k, v in given(self.names, ins).items()})
        dtype = ins[0].dtype
        return [((d["B"], d["Sq"], d["Hq"] * d["D"]), dtype)] + [((d["B"], d["Hk"], d["Sk"], d["D"]), dtype)] * 2

    def decompose(self, b, node):
        t = given(self.names, node.inputs)
        d = self.layout(node, {k: tuple(b.shape(v)) for k, v in t.items()})
        batch, heads, kv_heads, seq, size = d["B"], d["Hq"], d["Hk"], d["Sq"], d["D"]
        if d["packed"]:
            cuts = np.cumsum([0, heads * size, kv_heads * size, kv_heads * size]).tolist()
            parts = [b.op("Slice", t["query"], starts=[cuts[n]], ends=[cuts[n + 1]], axes=[2]) for n in range(3)]
        else:
            parts = [t["query"], t["key"], t["value"]]
        q, k, v = (heads_first(b, x, batch, seq, n, size) for x, n in zip(parts, (heads, kv_heads, kv_heads)))
        if self.attr(node, "do_rotary"):
            q, k = self.rotated(b, node, t, d, q, k)
        k, v = (self.cached(b, t.get(name), x, d) for name, x in (("past_key", k), ("past_value", v)))
        q = self.widen(b, node, q)
        like = self.like(b, node, q)
        bias, guard = self.bias(b, node, d, like)
        kt = b.op("Transpose", self.widen(b, node, k), perm=[0, 1, 3, 2])
        y, _ = attend(b, q, kt, self.widen(b, node, v), d, self.attr(node, "scale") or 1 / math.sqrt(size), like,
                      softcap=self.attr(node, "softcap"), bias=bias, guard=guard, sqrt_scale=False)
        return [self.finish(b, node, y, d), k if wants(node, 1) else None, v if wants(node, 2) else None]

    def rotated(self, b, node, t, d, q, k):
        """Q and K rotated at position_ids, or at each token's place after its batch's past."""
        positions = t.get("position_ids")
        if positions is None:
            places = np.array(d["past"])[:, None] + np.arange(d["Sq"])
            positions = b.op("Cast", b.const(places, t["query"]), to=to_onnx(np.int64))  # folded when planning
        cos, sin = (b.op("Gather", self.widen(b, node, t[n]), positions, axis=0) for n in ("cos_cache", "sin_cache"))
        dim = 2 * b.shape(t["cos_cache"])[1]
        interleaved = self.attr(node, "rotary_interleaved")
        shapes = [(d["B"], n, d["Sq"], d["D"]) for n in (d["Hq"], d["Hk"])]
        return [self.narrowed(b, node, rotary(b, self.widen(b, node, x), shape, shape[1], cos, sin, dim, interleaved))
                for x, shape in zip((q, k), shapes)]

    def narrowed(self, b, node, name):
        """`name` back in the input dtype where it was widened."""
        dtype = b.dtype(node.inputs[0])
        return b.cast(name, dtype) if self.accumulation(dtype) != dtype else name

    def cached(self, b, past, new, d):
        """present (B, Nkv, T, H): each batch's valid past, its new tokens, then zeros."""
        rows = sorted(set(d["past"])) or [0]  # an empty batch: its empty past and new tokens as one
        if len(rows) == 1:
            chunks = [[past, new]]
            valid = rows
        else:
            chunks = [[b.op("Slice", x, starts=[n], ends=[n + 1], axes=[0]) for x in (past, new)] for n in range(d["B"])]
            valid = d["past"]
        parts = []
        for (p, x), kept in zip(chunks, valid):
            pieces = ([b.op("Slice", p, starts=[0], ends=[kept], axes=[2])] if kept else []) + [x]
            joined = b.op("Concat", *pieces, axis=2) if len(pieces) > 1 else x
            rest = d["Sk"] - kept - d["Sq"]
            parts.append(b.op("Pad", joined, pads=[0, rest], axes=[2]) if rest else joined)
        return b.op("Concat", *parts, axis=0) if len(parts) > 1 else parts[0]

    def bias(self, b, node, d, like):
        """The -inf bias outside each query's keys: up to its own place (causal), the last
        local_window_size of those (itself included, as onnxruntime counts), before its batch's total
        length; and whether a row has no key at all."""
        keys = np.arange(d["Sk"])[None, None, None]  # (1, 1, 1, T), the scores' (B, N, S, T)
        place = np.array(d["past"])[:, None, None, None] + np.arange(d["Sq"])[:, None]  # (B, 1, S, 1)
        highs = [np.array(d["lengths"])[:, None, None, None] - 1] + [place] * bool(self.attr(node, "causal"))
        window = self.attr(node, "local_window_size")
        allowed, values = within(b, like, keys, lows=[place - window + 1] * (window > 0), highs=highs)
        values = np.broadcast_to(values, (d["B"], 1, d["Sq"], d["Sk"]))
        if values.all():
            return None, False
        return additive(b, allowed, like), not values.any(axis=-1).all()
