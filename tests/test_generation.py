"""Generation from a static KV cache (planner.Generation, executor.Generator) on tiny transformers LMs exported with
a cache: greedy tokens equal to transformers' own over 64 new tokens (a left-padded prompt beside a full one),
the cache's bytes exact, prefill and decode sharing their weights and cache in one arena, the cache written in
place, and no allocation per token."""
import tracemalloc

import numpy as np
import onnx
import pytest

import planner
from executor import FeedError
from planner.errors import ModelError, PlanError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from executor.generator import Generator  # noqa: E402
from generation_exports import FAMILIES, export, greedy, tiny  # noqa: E402

pytestmark = pytest.mark.torch
LENGTH, PROMPT, NEW = 80, 8, 64
PROMPTS = [[5, 7, 9, 11, 13, 2, 3, 4], [1, 2, 3]]
BOUND = 64 << 10
"""Bytes a decoded token may allocate: Python objects, views, never an array of the model's."""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{family: (lm, config, path)}, each exported once."""
    made = {}

    def get(family):
        if family not in made:
            lm, config = tiny(family)
            path = tmp_path_factory.mktemp(family) / "model.onnx"
            export(lm, config, path)
            made[family] = lm, config, str(path)
        return made[family]
    return get


def served(path, batch=2, **options):
    return planner.compile(path, generation=planner.Generation(batch=batch, max_length=LENGTH, prompt=PROMPT), **options)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_equal_transformers(exported, family):
    lm, _, path = exported(family)
    plan = served(path)
    assert plan.prefill.tensors[plan.prefill.outputs[0]].shape == (2, 1, lm.config.vocab_size)  # last_logits
    tokens = Generator(plan, "numpy", poison=True).generate(PROMPTS, NEW)
    for prompt, row in zip(PROMPTS, tokens):
        np.testing.assert_array_equal(row, greedy(lm, prompt, NEW))


@pytest.mark.parametrize("precision, itemsize", [("fp32", 4), ("fp16", 2)])
def test_cache_bytes_are_exactly_the_cache(exported, precision, itemsize):
    """2 x layers x kv heads x head size x bytes x batch x positions, each layer's keys and values one state."""
    _, config, path = exported("llama")
    plan = served(path, batch=3, precision=precision)
    expected = 2 * config.num_hidden_layers * config.num_key_value_heads * 8 * itemsize * 3 * LENGTH
    assert plan.cache_bytes == expected
    states = [t for t in plan.decode.tensors.values() if t.kind == "state"]
    assert len(states) == 2 * config.num_hidden_layers and all(t.role == "cache" for t in states)
    assert plan.decode.breakdown["kv_cache"] >= expected


def test_steps_share_weights_and_cache_and_write_it_in_place(exported):
    _, config, path = exported("llama")
    plan = served(path)
    shared = {n: (t.offset, t.nbytes) for n, t in plan.prefill.tensors.items() if t.kind in ("param", "const", "state")}
    assert shared == {n: (t.offset, t.nbytes) for n, t in plan.decode.tensors.items()
                      if t.kind in ("param", "const", "state")}
    assert plan.arena_bytes == max(plan.prefill.arena_bytes, plan.decode.arena_bytes)
    for step in (plan.prefill, plan.decode):
        writes = [s for s in step.steps if s.op == "CacheWrite"]
        assert len(writes) == 2 * config.num_hidden_layers
        assert all(step.tensors[s.outputs[0]].alias_of == s.inputs[0] for s in writes)
        assert not any(s.op in ("Concat", "Expand") and set(s.inputs) & {w.outputs[0] for w in writes}
                       for s in step.steps)
        attention = [s for s in step.steps if s.op == "ScaledDotProductAttention"]
        assert all(s.inputs[1] in {w.outputs[0] for w in writes} for s in attention)  # kv heads read in place


def test_a_decoded_token_allocates_nothing(exported):
    _, _, path = exported("llama")
    gen = Generator(served(path), "numpy", jit=False)
    gen.generate(PROMPTS, 4)
    tracemalloc.start()
    try:
        gen._step("decode", PROMPT + 4, gen.chosen[:, None])
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for t in range(5, 9):
            gen._step("decode", PROMPT + t, gen.chosen[:, None])
        grown = tracemalloc.get_traced_memory()[1] - held
    finally:
        tracemalloc.stop()
    assert grown < BOUND


def test_what_generation_refuses(exported, tmp_path):
    _, _, path = exported("llama")
    gen = Generator(served(path), "numpy")
    with pytest.raises(FeedError, match="prompt 0 holds 9 tokens"):
        gen.generate([list(range(9))], 2)
    with pytest.raises(FeedError, match="serves 1 to 2 prompts"):
        gen.generate([[1]] * 3, 2)
    with pytest.raises(FeedError, match="max_new_tokens must be from 1 to 73"):
        gen.generate([[1]], 74)
    with pytest.raises(FeedError, match="max_new_tokens must be from 1 to 73"):
        gen.generate([[1]], 2.5)
    for bad in ([[1.5, 2.0]], [1, 2, 3]):
        with pytest.raises(FeedError, match="prompts must be rows of token ids"):
            gen.generate(bad, 2)
    with pytest.raises(PlanError, match="leaves no room"):
        planner.Generation(max_length=8, prompt=8)
    with pytest.raises(PlanError, match="takes its input shapes from the Generation"):
        planner.compile(path, {"input_ids": (1, 1)}, generation=planner.Generation())
    with pytest.raises(PlanError, match="inference plan on one device"):
        planner.compile(path, generation=planner.Generation(), training=True)
    model = onnx.load(path)
    del model.graph.output[1:]
    onnx.save(model, tmp_path / "no_cache.onnx")
    with pytest.raises(ModelError, match="no cache to generate with"):
        served(str(tmp_path / "no_cache.onnx"))


def test_grouped_query_attention_reads_its_kv_heads_in_place(exported):
    """fold_repeat_kv: the export's repeat_kv copies are gone, and the step computes what onnxruntime does."""
    import onnxruntime as ort
    _, config, path = exported("qwen2")
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 64, (2, 3)), "attention_mask": np.ones((2, 8), np.int64),
             "position_ids": np.tile(np.arange(5, 8), (2, 1)),
             **{i.name: rng.standard_normal((2, 2, 5, 8)).astype(np.float32) for i in onnx.load(path).graph.input[3:]}}
    plan = planner.compile(path, {k: v.shape for k, v in feeds.items()})
    attention = [s for s in plan.steps if s.op == "ScaledDotProductAttention"]
    assert attention and all(plan.tensors[s.inputs[1]].shape[1] == config.num_key_value_heads for s in attention)
    assert not any(s.op == "Expand" and len(plan.tensors[s.outputs[0]].shape) == 5 for s in plan.steps)  # repeat_kv
    from executor import Executor
    got = Executor(plan, "numpy", poison=True).run(feeds)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, value in zip(plan.outputs, want):
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


def test_report_serve_gives_each_precision_its_weights_cache_and_steps(exported, capsys):
    import json
    from planner import cli
    _, config, path = exported("llama")
    assert cli.main(["report", path, "--serve", "--batch", "2", "--context", str(LENGTH), "--prompt", str(PROMPT),
                     "--precision", "all", "--lengths", "5,40,80", "--json"]) == 0
    rows = {r["precision"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * 8
    for precision, itemsize in (("fp32", 4), ("fp16", 2), ("bf16", 2)):
        r = rows[precision]
        assert r["kv_cache_bytes"] == per_token * itemsize * 2 * LENGTH
        assert r["kv_cache_fp8_bytes"] == per_token * 2 * LENGTH
        assert r["paged_kv_bytes"] == (16 + 48 + 80) * per_token * itemsize
        assert r["static_kv_bytes"] == 3 * LENGTH * per_token * itemsize
        assert r["arena_bytes"] == max(r["prefill_arena_bytes"], r["decode_arena_bytes"])
        assert r["decode_arena_bytes"] >= r["weights_bytes"] + r["kv_cache_bytes"]
    assert rows["fp32"]["weights_bytes"] * 0.5 <= rows["fp16"]["weights_bytes"] < rows["fp32"]["weights_bytes"] * 0.55


def test_max_batch_serve_finds_the_most_sequences_that_fit(exported, capsys):
    import json
    from planner import cli
    _, _, path = exported("llama")
    three = planner.compile(path, generation=planner.Generation(batch=3, max_length=LENGTH, prompt=PROMPT))
    assert cli.main(["max-batch", path, "--serve", "--context", str(LENGTH), "--prompt", str(PROMPT),
                     "--budget", str(three.arena_bytes), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert (row["max_sequences"], row["arena_bytes"]) == (3, three.arena_bytes)
    assert cli.main(["report", path, "--context", "80"]) == 2
    assert "give --serve too" in capsys.readouterr().err


def test_memplan_generate_prints_the_generators_tokens(exported, capsys):
    from planner import cli
    lm, _, path = exported("mistral")
    assert cli.main(["generate", path, "--ids", ",".join(map(str, PROMPTS[0])), "--ids", ",".join(map(str, PROMPTS[1])),
                     "--max-new-tokens", "20", "--backend", "numpy"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for k, prompt in enumerate(PROMPTS):
        assert lines[1 + k] == f"{k}: " + ",".join(map(str, greedy(lm, prompt, 20)))
    assert cli.main(["generate", path, "--max-new-tokens", "2"]) == 2
    assert "needs a prompt" in capsys.readouterr().err


def test_a_config_is_served_without_its_weights(tmp_path, monkeypatch):
    """A transformers config.json: each step exported with a cache on the meta device, the cache exact, the weights
    the model's parameters (and its small tables), the dynamo export's repeat_kv and K^T copies gone."""
    import json
    pytest.importorskip("onnxscript")
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path / "cache"))
    lm, config = tiny("llama")
    doc = {**config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    plan = planner.compile(str(tmp_path / "config.json"), weights=False,
                           generation=planner.Generation(batch=2, max_length=LENGTH, prompt=PROMPT))
    assert plan.cache_bytes == 2 * config.num_hidden_layers * config.num_key_value_heads * 8 * 4 * 2 * LENGTH
    params = 4 * sum(p.numel() for p in lm.parameters())
    assert params <= plan.weights_bytes < 1.1 * params
    for step in (plan.prefill, plan.decode):
        writes = {s.outputs[0] for s in step.steps if s.op == "CacheWrite"}
        assert all(s.inputs[1] in writes for s in step.steps if s.op == "ScaledDotProductAttention")
        assert not any(s.op in ("Expand", "Transpose") and len(step.tensors[s.outputs[0]].shape) >= 4
                       and step.tensors[s.outputs[0]].shape[-2] == LENGTH for s in step.steps)


def _banded_lm(window):
    """A one-layer toy LM whose attention is memplan's with a causal band and `window` (attributes, not a mask), its
    keys and values concatenated to a past: the band a static cache must roll."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    weights = {"embed": rng.standard_normal((16, 8)), "positions": rng.standard_normal((64, 8)),
               "wq": rng.standard_normal((8, 8)), "wk": rng.standard_normal((8, 8)), "wv": rng.standard_normal((8, 8)),
               "head": rng.standard_normal((8, 16)), "heads": np.array([0, 0, 2, 4]), "merged": np.array([0, 0, 8])}
    n = helper.make_node
    nodes = [n("Gather", ["embed", "input_ids"], ["e"]), n("Gather", ["positions", "position_ids"], ["p"]),
             n("Add", ["e", "p"], ["x"])]
    for name in ("q", "k", "v"):
        nodes += [n("MatMul", ["x", f"w{name}"], [f"{name}2"]), n("Reshape", [f"{name}2", "heads"], [f"{name}3"]),
                  n("Transpose", [f"{name}3"], [f"{name}4"], perm=[0, 2, 1, 3])]
    nodes += [n("Concat", ["past_k", "k4"], ["present_k"], axis=2), n("Concat", ["past_v", "v4"], ["present_v"], axis=2),
              n("ScaledDotProductAttention", ["q4", "present_k", "present_v"], ["a"], domain="memplan", causal=1,
                window=window),
              n("Transpose", ["a"], ["a2"], perm=[0, 2, 1, 3]), n("Reshape", ["a2", "merged"], ["a3"]),
              n("MatMul", ["a3", "head"], ["logits"])]
    ints = [helper.make_tensor_value_info(i, TensorProto.INT64, ["b", "s"]) for i in ("input_ids", "position_ids")]
    pasts = [helper.make_tensor_value_info(i, TensorProto.FLOAT, ["b", 2, "past", 4]) for i in ("past_k", "past_v")]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("logits", "present_k", "present_v")]
    inits = [numpy_helper.from_array(v.astype(np.float32) if v.dtype.kind == "f" else v, k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "banded", ints + pasts, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("memplan", 1)])


@pytest.mark.parametrize("window", [0, 3])
def test_a_causal_band_and_its_window_roll_with_the_cache(window):
    """The fused attention's own band (causal, window) is rolled to the cache's slots: the tokens are those of the
    export planned anew for each step over its growing past."""
    from executor import Executor
    model = _banded_lm(window)
    prompt = [3, 1, 4, 1, 5]
    plan = planner.compile(model, generation=planner.Generation(batch=1, max_length=16, prompt=5))
    assert any(s.op == "Gather" and s.inputs[0].startswith("kv_cache/band") for s in plan.decode.steps)
    ours = Generator(plan, "numpy", poison=True).generate([prompt], 10)[0]
    ids, past, want = np.array([prompt]), np.zeros((2, 1, 2, 0, 4), np.float32), []
    for _ in range(10):
        total = past.shape[3] + ids.shape[1]
        feeds = {"input_ids": ids, "position_ids": np.arange(past.shape[3], total)[None], "past_k": past[0],
                 "past_v": past[1]}
        step = planner.compile(model, {k: v.shape for k, v in feeds.items()})
        out = Executor(step, "numpy").run(feeds)
        want.append(int(out["logits"][0, -1].argmax()))
        ids, past = np.array([[want[-1]]]), np.stack([out["present_k"], out["present_v"]])
    np.testing.assert_array_equal(ours, want)


def test_a_sequence_that_ends_gives_the_pad_token(exported):
    """After eos_token_id a sequence gives pad_token_id, as transformers pads a finished sequence; all stop when
    all have ended."""
    _, _, path = exported("llama")
    gen = Generator(served(path), "numpy")
    free = gen.generate(PROMPTS, 12)
    eos = int(free[0, 3])
    ended = gen.generate(PROMPTS, 12, eos_token_id=eos, pad_token_id=7)
    for row, whole in zip(ended, free):
        stop = list(whole).index(eos) + 1 if eos in whole else len(whole)
        np.testing.assert_array_equal(row[:stop], whole[:stop])
        assert (row[stop:] == 7).all()


@pytest.mark.gpu
def test_generation_on_cupy_is_numpys_and_a_token_allocates_nothing(exported, cupy):
    """On a GPU: the tokens NumPy's Generator gives, and a decoded token's kernels and read-back under an allocator
    that raises."""
    from zoo_cases import assert_program_allocates_nothing
    lm, _, path = exported("llama")
    plan = served(path)
    gen = Generator(plan, "cupy")
    np.testing.assert_array_equal(gen.generate(PROMPTS, NEW), Generator(plan, "numpy").generate(PROMPTS, NEW))
    assert_program_allocates_nothing(cupy, gen.decode)
    with cupy.cuda.using_allocator(lambda size: (_ for _ in ()).throw(AssertionError(f"allocated {size} bytes"))):
        gen._step("decode", PROMPT + 4, gen.chosen[:, None])
