"""Per-token decode latency on the CPU: memplan's Generator (a static cache in one arena, NumPy backend) against
onnxruntime running the same export (its present key/values fed back as the next past, the loop of Optimum's
ORTModelForCausalLM) and PyTorch (transformers' model with its DynamicCache), in turn, on one machine.

    python benchmarks/decode_latency.py [--families llama qwen2 ...] [--prompt 32] [--new 64] [--rounds 3]

Each family is a small config of transformers (hidden 512, 8 layers, 8 query and 2 kv heads, vocab 8,000),
exported with a cache as tests/generation_exports.py does. A row is the median over rounds of the mean time of
a decoded token (prefill left out), batch 1; the tokens of all three are checked equal. Run it on a quiet machine.
"""
import argparse
import os
import sys
import tempfile
import time

import planner  # first: it sets OpenBLAS's thread timeout before NumPy loads it
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import generation_exports as exports  # noqa: E402

SIZES = dict(vocab_size=8000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=1536,
             max_position_embeddings=512)


def bigger(family):
    """The family's config at SIZES (GPT-2's under its own names), its logits far from ties so that tokens compare."""
    if family == "gpt2":
        return exports.FAMILIES[family](vocab_size=8000, n_embd=512, n_layer=8, n_head=8, n_positions=512,
                                        initializer_range=0.1)
    return exports.FAMILIES[family](**SIZES, initializer_range=0.1, **({"head_dim": 64} if family == "gemma2" else {}))


def memplan_tokens(path, prompt, new, length):
    from executor.generator import Generator
    gen = Generator(planner.compile(path, generation=planner.Generation(1, length, len(prompt))), "numpy", jit=True)
    gen.generate([prompt], 2)
    start = time.perf_counter()
    gen.generate([prompt], 1)  # the prefill alone
    prefilled = time.perf_counter()
    tokens = gen.generate([prompt], new)[0]
    return tokens, (time.perf_counter() - prefilled - (prefilled - start)) / (new - 1)


def onnxruntime_tokens(path, names, prompt, new, heads, size):
    import onnxruntime as ort
    options = ort.SessionOptions()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    past = {n: np.zeros((1, heads, 0, size), np.float32) for n in names}
    ids, tokens, times = np.array([prompt]), [], []
    for t in range(new):
        start = time.perf_counter()
        total = len(prompt) + t
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.arange(total - ids.shape[1], total)[None], **past}
        logits, *present = session.run(None, feeds)
        ids = logits[:, -1].argmax(-1)[:, None]
        past = dict(zip(names, present))
        tokens.append(int(ids[0, 0]))
        times.append(time.perf_counter() - start)
    return np.array(tokens), float(np.mean(times[1:]))


def torch_tokens(lm, prompt, new):
    import torch
    import transformers
    cache, ids, tokens, times = transformers.DynamicCache(), torch.tensor([prompt]), [], []
    with torch.no_grad():
        for t in range(new):
            start = time.perf_counter()
            total = len(prompt) + t
            out = lm(input_ids=ids, attention_mask=torch.ones(1, total, dtype=torch.int64),
                     position_ids=torch.arange(total - ids.shape[1], total)[None], past_key_values=cache,
                     use_cache=True)
            ids = out.logits[:, -1].argmax(-1)[:, None]
            tokens.append(int(ids[0, 0]))
            times.append(time.perf_counter() - start)
    return np.array(tokens), float(np.mean(times[1:]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(exports.FAMILIES))
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(os.cpu_count())
    rng = np.random.default_rng(0)
    print(f"decode latency per token, batch 1, prompt {args.prompt}, {args.new} new tokens, {os.cpu_count()} cores")
    print(f"{'family':<9} {'memplan':>10} {'onnxruntime':>12} {'PyTorch':>10} {'/ ort':>7} {'/ torch':>8}  tokens")
    for family in args.families:
        config = bigger(family)
        lm = exports.build(config)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.onnx")
            names = exports.export(lm, config, path)
            heads, size = exports.cache_dims(config)
            prompt = [int(i) for i in rng.integers(3, 8000, args.prompt)]
            rounds = []
            for _ in range(args.rounds):
                ours, a = memplan_tokens(path, prompt, args.new, args.prompt + args.new)
                theirs, b = onnxruntime_tokens(path, names, prompt, args.new, heads, size)
                torch_made, c = torch_tokens(lm, prompt, args.new)
                rounds.append((a, b, c))
            a, b, c = np.median(np.array(rounds), axis=0)
            same = "equal" if (ours == theirs).all() and (ours == torch_made).all() else \
                f"ort {int((ours == theirs).sum())}/{args.new}, torch {int((ours == torch_made).sum())}/{args.new}"
            print(f"{family:<9} {a * 1e3:>8.2f}ms {b * 1e3:>10.2f}ms {c * 1e3:>8.2f}ms {a / b:>7.2f} {a / c:>8.2f}  {same}")


if __name__ == "__main__":
    main()
