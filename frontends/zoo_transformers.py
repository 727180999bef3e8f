"""The zoo's transformers, bert_base and gpt2_small, as PyTorch's exporter writes Hugging Face's."""
import numpy as np

from .zoo_builder import FLOAT, INT64, NEG, require


def bert_base(b, layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, max_positions=512, pooler=False):
    require(hidden % heads == 0, f"bert_base: hidden {hidden} is not a multiple of heads {heads}")
    ids = b.input("input_ids", INT64, ["batch", "seq"])
    mask = b.input("attention_mask", INT64, ["batch", "seq"])
    with b.scope("embeddings"):
        words = b.scoped("word_embeddings", b.embedding, b.weights((vocab, hidden), 0.02), ids)
        types = b.scoped("token_type_embeddings", b.embedding, b.weights((2, hidden), 0.02),
                         b.fill(b.op("Shape", ids), np.int64(0)))
        places = b.scoped("position_embeddings", b.embedding, b.weights((max_positions, hidden), 0.02),
                          b.positions(ids))
        x = b.scoped("LayerNorm", b.layer_norm, b.op("Add", b.op("Add", words, types), places), hidden, 1e-12)
    extended = b.op("Cast", b.unsqueeze(b.unsqueeze(mask, 1), 2), to=FLOAT)
    extended = b.op("Mul", b.op("Sub", b.const(1.0, np.float32), extended), b.const(NEG, np.float32))
    for i in range(layers):
        with b.scope("encoder", "layer", i):
            with b.scope("attention"):
                q, k, v = (b.scoped(name, b.linear, x, hidden, hidden) for name in ("query", "key", "value"))
                context = b.attention(q, k, v, heads, hidden // heads, mask=extended)
                with b.scope("output"):
                    y = b.op("Add", b.linear(context, hidden, hidden), x)
                    x = b.scoped("LayerNorm", b.layer_norm, y, hidden, 1e-12)
            with b.scope("intermediate"):
                y = b.gelu_erf(b.linear(x, hidden, intermediate))
            with b.scope("output"):
                y = b.op("Add", b.linear(y, intermediate, hidden), x)
                x = b.scoped("LayerNorm", b.layer_norm, y, hidden, 1e-12)
    x = b.output(x, "last_hidden_state", FLOAT, ["batch", "seq", hidden])
    if pooler:
        with b.scope("pooler"):
            pooled = b.op("Tanh", b.gemm(b.op("Gather", x, b.const(0), axis=1), hidden, hidden, gain=1.0))
        b.output(pooled, "pooler_output", FLOAT, ["batch", hidden])


def gpt2_small(b, layers=12, hidden=768, heads=12, vocab=50257, max_positions=1024):
    require(hidden % heads == 0, f"gpt2_small: hidden {hidden} is not a multiple of heads {heads}")
    ids = b.input("input_ids", INT64, ["batch", "seq"])
    residual_gain = 1 / (2 * layers)
    wte = b.weights((vocab, hidden), 0.02)
    with b.scope("transformer"):
        tokens = b.scoped("wte", b.embedding, wte, ids)
        places = b.scoped("wpe", b.embedding, b.weights((max_positions, hidden), 0.01), b.positions(ids))
        x = b.op("Add", tokens, places)
        seq = b.unsqueeze(b.dim(ids, 1), 0)
        keep = b.op("Trilu", b.fill(b.op("Concat", seq, seq, axis=0), np.bool_(True)), upper=0)
        for i in range(layers):
            with b.scope("h", i):
                y = b.scoped("ln_1", b.layer_norm, x, hidden, 1e-5)
                with b.scope("attn"):
                    qkv = b.scoped("c_attn", b.linear, y, hidden, 3 * hidden)
                    q, k, v = b.op("Split", qkv, b.const([hidden] * 3), axis=2, outputs=3)
                    context = b.attention(q, k, v, heads, hidden // heads, keep=keep)
                    x = b.op("Add", x, b.scoped("c_proj", b.linear, context, hidden, hidden, residual_gain))
                y = b.scoped("ln_2", b.layer_norm, x, hidden, 1e-5)
                with b.scope("mlp"):
                    y = b.gelu_tanh(b.scoped("c_fc", b.linear, y, hidden, 4 * hidden))
                    x = b.op("Add", x, b.scoped("c_proj", b.linear, y, 4 * hidden, hidden, residual_gain))
        x = b.scoped("ln_f", b.layer_norm, x, hidden, 1e-5)
    logits = b.op("MatMul", x, b.param("lm_head.weight", np.ascontiguousarray(wte.T)))  # the tied weight, transposed
    b.output(logits, "logits", FLOAT, ["batch", "seq", vocab])
