"""What serving a causal LM takes (`memplan report --serve`, `memplan max-batch --serve`): per precision, the
weights, the KV cache and each step's arena of a GenerationPlan (planner.generation); the cache in fp8 beside it;
and the cache a paged allocator would hold for sequences of given lengths (vLLM's blocks of 16 tokens)."""
import math
from dataclasses import dataclass, field

from .units import format_bytes

BLOCK = 16
"""Tokens per block of a paged KV cache (vLLM's default block size)."""
FP8 = 1
"""Bytes of an fp8 cache's element (float8_e4m3 or e5m2, as vLLM's kv_cache_dtype="fp8")."""


@dataclass
class ServingRow:
    """One precision's GenerationPlan, as bytes: weights, KV cache (and the same cache in fp8), each step's arena."""

    precision: str
    weights: int
    cache: int
    cache_fp8: int
    prefill: int
    decode: int
    arena: int

    @classmethod
    def of(cls, precision, plan):
        elements = sum(math.prod(t.shape) for t in plan.decode.tensors.values() if t.role == "cache")
        return cls(precision, plan.weights_bytes, plan.cache_bytes, elements * FP8, plan.prefill.arena_bytes,
                   plan.decode.arena_bytes, plan.arena_bytes)

    def per_token(self, generation):
        """The cache's bytes per position of one sequence."""
        return self.cache // (generation.batch * generation.max_length)


@dataclass
class Serving:
    """The rows of `memplan report --serve` for one model and Generation; `lengths`, sequence lengths for the
    paged cache's account."""

    model: str
    generation: object
    rows: list
    lengths: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def paged(self, row):
        """(bytes of a paged cache holding `lengths`, in blocks of BLOCK tokens, bytes of the static cache holding
        them: one max_length slot each)."""
        blocks = sum(-(-n // BLOCK) for n in self.lengths)
        per_token = row.per_token(self.generation)
        return blocks * BLOCK * per_token, len(self.lengths) * self.generation.max_length * per_token

    def as_dict(self):
        g = self.generation
        rows = []
        for r in self.rows:
            d = {"precision": r.precision, "weights_bytes": r.weights, "kv_cache_bytes": r.cache,
                 "kv_cache_fp8_bytes": r.cache_fp8, "prefill_arena_bytes": r.prefill, "decode_arena_bytes": r.decode,
                 "arena_bytes": r.arena, "kv_bytes_per_token": r.per_token(g)}
            if self.lengths:
                d["paged_kv_bytes"], d["static_kv_bytes"] = self.paged(r)
            rows.append(d)
        return {"model": self.model, "batch": g.batch, "context": g.max_length, "prompt": g.prompt,
                "lengths": self.lengths, "rows": rows, "notes": self.notes}

    def csv_rows(self):
        return self.as_dict()["rows"]

    def table(self):
        g = self.generation
        lines = [f"{self.model}: serving {g.batch} sequence{'s' * (g.batch > 1)} of {g.max_length} positions, "
                 f"prefill of {g.prompt} tokens, decode of 1, in one arena",
                 f"{'precision':<10} {'weights':>12} {'KV cache':>12} {'KV fp8':>12} {'prefill':>12} {'decode':>12}"
                 f" {'arena':>12}"]
        for r in self.rows:
            lines.append(f"{r.precision:<10} {format_bytes(r.weights):>12} {format_bytes(r.cache):>12} "
                         f"{format_bytes(r.cache_fp8):>12} {format_bytes(r.prefill):>12} {format_bytes(r.decode):>12} "
                         f"{format_bytes(r.arena):>12}")
        lines.append("prefill and decode: each step's arena (weights and cache included); arena: both steps' one")
        for r in self.rows if self.lengths else ():
            paged, static = self.paged(r)
            lines.append(f"{r.precision}: {len(self.lengths)} sequences of {', '.join(map(str, self.lengths))} "
                         f"positions hold {format_bytes(paged)} of KV cache in blocks of {BLOCK} tokens "
                         f"({format_bytes(static)} in slots of {g.max_length})")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)
