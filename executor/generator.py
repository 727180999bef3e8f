"""Greedy generation from one arena: a GenerationPlan's prefill and decode steps (planner.generation) run by two
Executors over the same bytes, the weights and the KV cache loaded once. Each token is fed from host buffers made
once and read back into them, so a token allocates nothing.

The plans see the cache as the export does, the step's tokens last (planner/passes/kv_cache.py): the attention
mask is given in those coordinates, the step's `length - tokens - position` positions of the past shifted to the
end. Prompts are padded on the left, as transformers' generate pads them, and positions count the real tokens."""
import numpy as np

from planner.generation import IDS, MASK, POSITION, POSITIONS
from planner.passes.next_token import NEXT

from . import Executor, FeedError


class Generator:
    """Runs a GenerationPlan on `backend` ("numpy", "cupy" or "auto"): `generate(prompts, max_new_tokens)` decodes
    greedily (the most likely token each step, as transformers' generate(do_sample=False)). Executor's options
    (`poison`, `config`, `threads`, `jit`) apply to both steps."""

    def __init__(self, plan, backend="auto", **options):
        self.plan, self.generation = plan, plan.generation
        first, second = sorted(("prefill", "decode"), key=plan.peak, reverse=True)
        runs = {first: Executor(getattr(plan, first), backend, **options)}
        runs[second] = Executor(getattr(plan, second), backend, arena=runs[first].arena, **options)
        self.prefill, self.decode = runs["prefill"], runs["decode"]
        g = self.generation
        self.masked = MASK in plan.decode.inputs
        self.length = g.max_length
        self.feeds = {entry: _buffers(getattr(plan, entry), self.masked) for entry in ("prefill", "decode")}
        self.valid = np.zeros((g.batch, g.max_length), np.int64)
        self.positions = np.zeros((g.batch, g.max_length), np.int64)
        self.next = {entry: getattr(self, entry).view(NEXT)[:, 0] for entry in ("prefill", "decode")}
        self.chosen = np.zeros(g.batch, np.int64)

    def generate(self, prompts, max_new_tokens, eos_token_id=None, pad_token_id=0):
        """(len(prompts), max_new_tokens) int64 of the tokens chosen after each prompt (a list of token lists, or an
        int array of rows). A sequence that emits `eos_token_id` emits `pad_token_id` after it, as transformers
        pads; all stop when all have."""
        g = self.generation
        rows = _rows(prompts, g)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or \
                not 1 <= max_new_tokens <= g.max_length - g.prompt + 1:
            raise FeedError(f"max_new_tokens must be from 1 to {g.max_length - g.prompt + 1} (the cache holds "
                            f"{g.max_length} positions, the prompt {g.prompt}), got {max_new_tokens}")
        ids = self._prompt(rows)
        out = np.full((len(rows), max_new_tokens), pad_token_id, np.int64)
        done, hit = np.zeros(g.batch, bool), np.zeros(g.batch, bool)
        self._step("prefill", 0, ids)
        for t in range(max_new_tokens):
            if eos_token_id is not None:
                np.putmask(self.chosen, done, pad_token_id)
                np.logical_or(done, np.equal(self.chosen, eos_token_id, out=hit), out=done)
            out[:, t] = self.chosen[:len(rows)]
            if t + 1 == max_new_tokens or done[:len(rows)].all():
                break
            self._step("decode", g.prompt + t, self.chosen[:, None])
        return out

    def _prompt(self, rows):
        """The prompts as the prefill's (batch, prompt) ids, padded on the left (a missing row repeats the first),
        with the cache's valid slots and each slot's position set for them."""
        g = self.generation
        ids = np.zeros((g.batch, g.prompt), np.int64)
        self.valid[:] = 1
        self.valid[:, :g.prompt] = 0
        for b in range(g.batch):
            row = rows[b] if b < len(rows) else rows[0]
            ids[b, g.prompt - len(row):] = row
            self.valid[b, g.prompt - len(row):g.prompt] = 1
        np.cumsum(self.valid, axis=1, out=self.positions)
        self.positions -= 1
        self.positions[self.valid == 0] = 1
        return ids

    def _step(self, entry, start, ids):
        """Run `entry` on `ids` written at cache slots [start, start + tokens); self.chosen takes each row's next
        token (the plan's NEXT output)."""
        feeds, tokens = self.feeds[entry], ids.shape[1]
        feeds[IDS][...] = ids
        feeds[POSITIONS][...] = self.positions[:, start:start + tokens]
        feeds[POSITION][...] = start
        if self.masked:
            shift = self.length - tokens - start
            feeds[MASK][:, :shift] = 0
            feeds[MASK][:, shift:] = self.valid[:, :start + tokens]
        getattr(self, entry).run_in_place(feeds)
        chosen = self.next[entry]
        if isinstance(chosen, np.ndarray):
            np.copyto(self.chosen, chosen)
        else:
            chosen.get(out=self.chosen)


def _buffers(plan, masked):
    """{input: host array} of a step's feeds, made once."""
    names = (IDS, POSITIONS, POSITION, *((MASK,) if masked else ()))
    return {n: np.zeros(plan.tensors[n].shape, np.dtype(plan.tensors[n].dtype)) for n in names}


def _rows(prompts, generation):
    """The prompts as lists of token ids, checked against what the plan serves."""
    arrays = [np.asarray(p) for p in prompts]
    if any(a.dtype.kind not in "iu" or a.ndim != 1 for a in arrays):
        raise FeedError("prompts must be rows of token ids: a list of lists of ints or an int array of rows (one "
                        "prompt is [ids])")
    rows = [list(a.reshape(-1)) for a in arrays]
    if not 1 <= len(rows) <= generation.batch:
        raise FeedError(f"the plan serves 1 to {generation.batch} prompts at once, got {len(rows)}")
    for k, row in enumerate(rows):
        if not 1 <= len(row) <= generation.prompt:
            raise FeedError(f"prompt {k} holds {len(row)} tokens; the plan takes 1 to {generation.prompt}")
    return rows

