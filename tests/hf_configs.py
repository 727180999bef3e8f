"""Small configs of the transformers families memplan plans from a config alone, written as the Hub's
config.json files are (model_type, architectures and the family's own keys), at a few layers and a hidden
size of 64, so that each exports in seconds."""

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256}
"""The sizes the decoder-only families share (their config.json keys)."""

CONFIGS = {
    "llama2": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **SMALL, "rms_norm_eps": 1e-5},
    "llama3": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **SMALL, "rope_theta": 500000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 128}, "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], **SMALL, "sliding_window": 8},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **SMALL, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], **SMALL, "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **SMALL, "head_dim": 16},
    "qwen2_moe": {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], **SMALL, "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                  "decoder_sparse_step": 1},
    "phi3": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], **SMALL, "pad_token_id": 0},
    "gemma2": {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], **SMALL, "head_dim": 16,
               "sliding_window": 8, "query_pre_attn_scalar": 16},
    "gemma3": {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **SMALL, "head_dim": 16,
               "sliding_window": 8, "query_pre_attn_scalar": 16},
    "gpt_neox": {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], **SMALL},
    "falcon": {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "hidden_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128, "new_decoder_architecture": True, "num_kv_heads": 2},
    "olmo": {"model_type": "olmo", "architectures": ["OlmoForCausalLM"], **SMALL},
    "granite": {"model_type": "granite", "architectures": ["GraniteForCausalLM"], **SMALL, "residual_multiplier": 0.22,
                "embedding_multiplier": 12.0, "attention_multiplier": 0.0078125, "logits_scaling": 8.0},
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
             "vocab_size": 128, "n_positions": 256},
    "bert": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 256},
    "roberta": {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "hidden_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 128,
                "max_position_embeddings": 258, "pad_token_id": 1},
    "t5": {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 64, "d_ff": 128, "d_kv": 16,
           "num_layers": 2, "num_heads": 4, "vocab_size": 128},
}
