"""ONNX's LinearAttention and CausalConvWithState (opset 27), the recurrent attention of Gated DeltaNet,
RetNet and GLA and the causal convolution before it, as composites: planning replaces each by MatMul,
Mul, Exp, Conv, Concat, Split, Slice and Reshape, the recurrence unrolled over the (static) sequence,
so that they run and differentiate with nothing of their own. Narrow floats are computed in float32."""
import math

from .registry import schema
from .attention import output, widening
from .base import Schema, same_dtype
from .control_flow import check_unrolled
from .shape_ops import zeros
from ..errors import ShapeError

RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True), "gated_delta": (True, True)}
"""update_rule -> (whether the state decays by exp(decay), whether it takes the delta rule's correction)."""


def steps(b, x, count):
    """x (B, T, ...) as its T time steps (B, 1, ...), one Split."""
    return list(b.op("Split", x, outputs=count, axis=1, split=[1] * count)) if count > 1 else [x]


@schema("LinearAttention", since=27)
class LinearAttention(Schema):
    """LinearAttention: query (B, T, Hq dk), key (B, T, Hk dk), value (B, T, Hk dv), the state
    (B, Hk, dk, dv) carried from past_state (zeros without) and returned as present_state; decay
    (B, T, Hk) or (B, T, Hk dk) in log space for the gated rules, beta (B, T, Hk) or (B, T, 1) for the
    delta rules. Query head h reads the state of key head h // (Hq / Hk)."""

    defaults = {"chunk_size": 64, "kv_num_heads": None, "q_num_heads": None, "scale": 0.0,
                "update_rule": "gated_delta"}

    def dims(self, node, shapes):
        """{letter: size} of the op's dims from its inputs' shapes (None where omitted): B, T, Hq, Hk,
        G (query heads per key head), dk, dv, g (decay values per key head: 1 or dk), hb (beta's heads:
        Hk or 1); ShapeError where they disagree or an attribute is bad."""
        q, k, v, past, decay, beta = (list(shapes) + [None] * 6)[:6]
        rule = self.attr(node, "update_rule")
        if rule not in RULES:
            raise ShapeError(f"update_rule must be one of {', '.join(RULES)}, got {rule!r}")
        gated, delta = RULES[rule]
        for name, needed, shape in (("decay", gated, decay), ("beta", delta, beta)):
            if needed != (shape is not None):
                raise ShapeError(f"update_rule {rule!r} {'needs' if needed else 'takes no'} {name} input")
        hq, hk = self.attr(node, "q_num_heads"), self.attr(node, "kv_num_heads")
        if not hq or not hk or hq < 0 or hk < 0 or hq % hk:
            raise ShapeError(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hk})")
        if len(q) != 3 or len(k) != 3 or len(v) != 3:
            raise ShapeError(f"query, key and value must be 3-D (B, T, heads * size), got {tuple(q)}, "
                             f"{tuple(k)} and {tuple(v)}")
        if not q[:2] == k[:2] == v[:2]:
            raise ShapeError(f"query, key and value must have one batch size and sequence length, got "
                             f"{tuple(q)}, {tuple(k)} and {tuple(v)}")
        if q[1] < 1:
            raise ShapeError("the sequence must have at least one step")
        for name, size, heads in (("query", q[2], hq), ("value", v[2], hk)):
            if size % heads:
                raise ShapeError(f"{name}'s last dim {size} does not split into {heads} heads")
        if k[2] != hk * (q[2] // hq):
            raise ShapeError(f"key's last dim must be {hk} heads of the query's head size {q[2] // hq}, got {k[2]}")
        d = dict(B=q[0], T=q[1], Hq=hq, Hk=hk, G=hq // hk, dk=q[2] // hq, dv=v[2] // hk, g=1, hb=1)
        if decay is not None:
            if tuple(decay) not in ((d["B"], d["T"], hk), (d["B"], d["T"], hk * d["dk"])):
                raise ShapeError(f"decay must be (B, T, kv heads) or (B, T, kv heads * head size), got {tuple(decay)}")
            d["g"] = decay[2] // hk
        if beta is not None:
            if tuple(beta) not in ((d["B"], d["T"], hk), (d["B"], d["T"], 1)):
                raise ShapeError(f"beta must be (B, T, kv heads) or (B, T, 1), got {tuple(beta)}")
            d["hb"] = beta[2]
        state = (d["B"], hk, d["dk"], d["dv"])
        if past is not None and tuple(past) != state:
            raise ShapeError(f"past_state must be (B, kv heads, key size, value size) = {state}, got {tuple(past)}")
        return d

    def infer(self, node, ins):
        q, k, v, past, decay, beta = (list(ins) + [None] * 6)[:6]
        dtype = same_dtype([q, k, v, decay, beta])
        d = self.dims(node, [None if i is None else i.shape for i in ins])
        return [((d["B"], d["T"], d["Hq"] * d["dv"]), dtype),
                ((d["B"], d["Hk"], d["dk"], d["dv"]), dtype if past is None else past.dtype)]

    def decompose(self, b, node):
        """Per step t: S = exp(g_t) S (gated); v_t = beta_t (v_t - k_t S) (delta); S += k_t^T v_t; and
        o_t = scale q_t S, the query heads of one key head read together as one matmul's rows."""
        names = (list(node.inputs) + [""] * 6)[:6]
        d = self.dims(node, [b.shape(n) if n else None for n in names])
        dtype = b.dtype(names[0])
        wide = self.accumulation(dtype)
        q, k, v, state, decay, beta = (None if not n else b.cast(n, wide) if b.dtype(n) != wide else n
                                        for n in names)
        batch, count, hk = d["B"], d["T"], d["Hk"]
        check_unrolled(count, f"node {node.name!r} ({self.op}): unrolling it over {count:,} time steps makes at least")
        scale = self.attr(node, "scale") or 1 / math.sqrt(d["dk"])
        qs, ks, vs = (steps(b, x, count) for x in (b.op("Mul", q, b.const(scale, q)), k, v))
        gates = steps(b, b.op("Exp", decay), count) if decay else None
        betas = steps(b, beta, count) if beta else None
        ys = []
        for t in range(count):
            value = b.op("Reshape", vs[t], shape=[batch, hk, 1, d["dv"]])
            if gates and state:
                state = b.op("Mul", state, b.op("Reshape", gates[t], shape=[batch, hk, d["g"], 1]))
            if betas:
                if state:
                    row = b.op("Reshape", ks[t], shape=[batch, hk, 1, d["dk"]])
                    value = b.op("Sub", value, b.op("MatMul", row, state))
                value = b.op("Mul", value, b.op("Reshape", betas[t], shape=[batch, d["hb"], 1, 1]))
            write = b.op("Mul", b.op("Reshape", ks[t], shape=[batch, hk, d["dk"], 1]), value)
            state = b.op("Add", state, write) if state else write
            read = b.op("MatMul", b.op("Reshape", qs[t], shape=[batch, hk, d["G"], d["dk"]]), state)
            ys.append(b.op("Reshape", read, shape=[batch, 1, d["Hq"] * d["dv"]]))
        y = b.op("Concat", *ys, axis=1) if count > 1 else ys[0]
        present = b.dtype(names[3]) if names[3] else dtype
        return [b.cast(y, dtype) if wide != dtype else y,
                output(b, b.cast(state, present) if wide != present else state, node, 1)]


@schema("CausalConvWithState", since=27)
class CausalConvWithState(Schema):
    """CausalConvWithState: input (B, C, L) convolved channel by channel with weight (C, 1, k) over the
    past_state (B, C, k - 1) (zeros without) and itself, plus bias (C,), then SiLU where activation
    says; present_state is the last k - 1 positions of that padded sequence."""

    defaults = {"activation": "none"}

    def infer(self, node, ins):
        x, w, bias, past = (list(ins) + [None] * 4)[:4]
        if self.attr(node, "activation") not in ("none", "silu", "swish"):
            raise ShapeError(f"activation must be 'none', 'silu' or 'swish', got {self.attr(node, 'activation')!r}")
        if x.rank != 3 or w.rank != 3 or w.shape[:2] != (x.shape[1], 1):
            raise ShapeError(f"input must be (B, C, L) and weight (C, 1, k), got {x.shape} and {w.shape}")
        state = (x.shape[0], x.shape[1], w.shape[2] - 1)
        if bias is not None and bias.shape != (x.shape[1],):
            raise ShapeError(f"bias must be ({x.shape[1]},), one per channel, got {bias.shape}")
        if past is not None and past.shape != state:
            raise ShapeError(f"past_state must be (B, C, k - 1) = {state}, got {past.shape}")
        dtype = same_dtype([x, w, bias, past])
        return [(x.shape, dtype), (state, dtype)]

    def decompose(self, b, node):
        names = (list(node.inputs) + [""] * 4)[:4]
        (batch, channels, length), dtype = b.shape(names[0]), b.dtype(names[0])
        size = b.shape(names[1])[2]
        widen = widening(self, b, dtype)
        x, w, bias, past = (widen(n) if n else None for n in names)
        if size > 1 and past is None:
            past = zeros(b, (batch, channels, size - 1), b.dtype(x))
        padded = b.op("Concat", past, x, axis=2) if size > 1 else x
        y = b.op("Conv", padded, w, *[bias] * (bias is not None), group=channels, kernel_shape=[size])
        if self.attr(node, "activation") != "none":
            y = b.op("Mul", y, b.op("Sigmoid", y))
        present = b.op("Slice", padded, starts=[length], ends=[length + size - 1], axes=[2])
        narrow = (lambda n: b.cast(n, dtype)) if x != names[0] else (lambda n: n)
        return [narrow(y), output(b, narrow(present), node, 1)]
