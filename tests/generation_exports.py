"""Tiny causal LMs of transformers exported with a cache (past key/values in, present key/values out, by the
TorchScript exporter, as Optimum's decoder-with-past), for the generation tests; and their own greedy tokens."""
import warnings

import numpy as np
import torch
import transformers

VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
FAMILIES = {
    "llama": lambda **o: transformers.LlamaConfig(**{**SMALL, "num_key_value_heads": 2, **o}),
    "qwen2": lambda **o: transformers.Qwen2Config(**{**SMALL, "num_key_value_heads": 2, **o}),
    "phi3": lambda **o: transformers.Phi3Config(**{**SMALL, "num_key_value_heads": 2, **o}),
    "mistral": lambda **o: transformers.MistralConfig(**{**SMALL, "num_key_value_heads": 2, "sliding_window": 12, **o}),
    "gemma2": lambda **o: transformers.Gemma2Config(**{**SMALL, "num_key_value_heads": 2, "head_dim": 8,
                                                       "sliding_window": 12, "attn_implementation": "eager", **o}),
    "gpt2": lambda **o: transformers.GPT2Config(**{"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4,
                                                   "n_positions": 256, "bos_token_id": 1, "eos_token_id": 2, **o}),
}
"""Each family's config (its fields overridden by keywords): grouped-query attention where it has it, sliding
windows shorter than a generation (Mistral's, and Gemma 2's on alternate layers with its soft-capped scores)."""


class WithCache(torch.nn.Module):
    """The LM called with its past as tensors, returning the logits and each layer's present key and value."""

    def __init__(self, lm, layers):
        super().__init__()
        self.lm, self.layers = lm, layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = transformers.DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=cache, use_cache=True)
        return (out.logits, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])


def tiny(family, seed=0):
    """(the LM in eval mode, its config) of a family, its weights drawn from `seed`."""
    config = FAMILIES[family]()
    return build(config, seed), config


def build(config, seed=0):
    """The causal LM of `config` in eval mode, its weights drawn from `seed`."""
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def cache_dims(config):
    """(kv heads, head size) of a config: each layer's cache is (batch, kv heads, positions, head size)."""
    heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    return heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def export(lm, config, path):
    """Export `lm` with a cache to `path`, traced at 3 new tokens over 5 past ones, batch, tokens and past
    positions dynamic; returns the past inputs' names."""
    layers = config.num_hidden_layers
    heads, size = cache_dims(config)
    pasts = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    presents = [n.replace("past_key_values", "present") for n in pasts]
    ids = torch.randint(0, VOCAB, (2, 3))
    past = [torch.randn(2, heads, 5, size) for _ in pasts]
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "position_ids": {0: "batch", 1: "tokens"},
            "attention_mask": {0: "batch", 1: "total"}, **{n: {0: "batch", 2: "past"} for n in pasts}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(WithCache(lm, layers).eval(), (ids, torch.ones(2, 8, dtype=torch.int64),
                                                   torch.arange(5, 8).repeat(2, 1), *past), str(path),
                          input_names=["input_ids", "attention_mask", "position_ids", *pasts],
                          output_names=["logits", *presents], dynamic_axes=axes, opset_version=17, dynamo=False)
    return pasts


def greedy(lm, prompt, new_tokens):
    """transformers' own greedy tokens after `prompt` (a list of ids), no end-of-sequence stop."""
    with torch.no_grad():
        out = lm.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return np.asarray(out[0, len(prompt):])
