"""A static-shape experts forward for transformers' mixture-of-experts models, registered as "memplan".

transformers' experts implementations route tokens with shapes that depend on the routing: 'eager' loops
over the experts hit (NonZero, Where), 'grouped_mm' splits rows at data-dependent offsets, and 'batched_mm'
gathers a whole expert weight per (token, expert) pair, (S*k, 2I, H), which no real trainer holds. memplan
plans static shapes only, so this forward writes the MoE as a dropless grouped GEMM at balanced routing:

- the S*k (token, expert) pairs are sorted by expert (stable: TopK of the unique keys expert * S*k + pair),
  their hidden states gathered ((S*k, H)), padded to E*C rows and viewed as (E, C, H), C = ceil(S*k/E);
- one batched product per projection: (E, C, H) @ (E, H, 2I) -> gate/activation -> @ (E, I, H), written
  as an Einsum over each weight in its stored layout (E, 2I, H): as a MatMul the export would transpose the
  weights first, which memplan plans as a copy of every expert weight, kept for the gradient too;
- the rows are put back in pair order, weighted by top_k_weights and summed over k.

What it assumes: routing balanced across the experts, so that each expert's rows are exactly C. Whatever the
routing, the activations it holds are those of a dropless grouped GEMM (Megatron's: S*k rows in all, plus
fewer than E padding rows), and its FLOPs are the same total, spread evenly over the experts. The values it
computes equal the eager forward's only where routing is balanced (each expert picked by exactly S*k/E
pairs); elsewhere rows meet the wrong expert's weights. It is for planning the memory of weightless models:
its results are not the model's outputs.

Select it with `register()` and then `config._experts_implementation = "memplan"` before the model is
built, `Model(config)` / `from_config(config, experts_implementation="memplan")`, or
`model.set_experts_implementation("memplan")` on a built model.
"""
import torch
from transformers.integrations.moe import ExpertsInterface, _default_apply_gate

NAME = "memplan"


def register():
    """Register `experts_forward` in transformers' ExpertsInterface as "memplan" (idempotent)."""
    ExpertsInterface.register(NAME, experts_forward)
    return NAME


def _project(self, x, name):
    """x (E, C, in) times each expert's `name` weight (and bias) -> (E, C, out): one Einsum, no weight copy."""
    weight = getattr(self, name)
    out = torch.einsum("eci,eio->eco" if self.is_transposed else "eci,eoi->eco", x, weight)
    if self.has_bias:
        out = out + getattr(self, name + "_bias").unsqueeze(1)
    return out


def _gate(self, x):
    """The class's gate on the gate/up projection x; transformers' default one by slices, as its chunk exports
    as SplitToSequence (with optimize=False), a sequence memplan does not plan."""
    if type(self)._apply_gate is not _default_apply_gate:
        return self._apply_gate(x)
    half = x.size(-1) // 2
    return self.act_fn(x[..., :half]) * x[..., half:]


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """The experts of `self` on hidden_states (S, H) routed by top_k_index / top_k_weights (S, k) -> (S, H),
    as a grouped GEMM of C = ceil(S*k/E) rows per expert (exact at balanced routing; see the module)."""
    if getattr(self, "_is_expert_parallel", False):
        raise NotImplementedError("the memplan experts forward does not take expert-parallel sentinels")
    tokens, hidden = hidden_states.shape
    top_k = top_k_index.size(-1)
    pairs, experts = tokens * top_k, self.num_experts
    rows = -(-pairs // experts)  # C

    # Sort the pairs by expert, stably: the keys are unique, so TopK's order is the one order.
    position = torch.arange(pairs, device=top_k_index.device)
    order = torch.topk(top_k_index.reshape(-1) * pairs + position, pairs, largest=False).indices
    inverse = torch.zeros_like(order).scatter(0, order, position)

    token_of_pair = torch.arange(tokens, device=order.device).unsqueeze(1).expand(tokens, top_k).reshape(-1)
    token = token_of_pair.index_select(0, order)
    x = hidden_states.index_select(0, token)  # (S*k, H), grouped by expert
    if experts * rows > pairs:
        x = torch.nn.functional.pad(x, (0, 0, 0, experts * rows - pairs))
    x = x.view(experts, rows, hidden)
    if self.has_gate:
        x = _gate(self, _project(self, x, "gate_up_proj"))
    else:
        x = self.act_fn(_project(self, x, "up_proj"))
    x = _project(self, x, "down_proj")
    if self.has_post_expert_norm:
        x = self.post_expert_norm(x)

    x = x.reshape(experts * rows, hidden).index_select(0, inverse)  # (S*k, H), in pair order
    weighted = x * top_k_weights.reshape(pairs, 1)
    return weighted.view(tokens, top_k, hidden).sum(dim=1).to(hidden_states.dtype)
