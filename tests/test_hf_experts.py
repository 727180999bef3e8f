"""frontends.hf_experts, the "memplan" experts implementation of transformers' MoE models: at balanced routing
it computes what the eager experts compute; on the meta device the models export (dynamo) to static shapes
that memplan plans for inference and a training step, with no NonZero and the experts as batched Einsums."""
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
import onnx
from exports import Output
from transformers.integrations.moe import batched_mm_experts_forward

import planner
from frontends import hf_experts

pytestmark = pytest.mark.torch
BATCH, SEQ, VOCAB, EXPERTS, TOP_K = 2, 16, 64, 4, 2
SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64, "use_cache": False, "num_experts_per_tok": TOP_K}
CONFIGS = {
    "mixtral": (lambda: transformers.MixtralConfig(**SMALL, intermediate_size=128, num_local_experts=EXPERTS),
                "MixtralForCausalLM"),
    "qwen2_moe": (lambda: transformers.Qwen2MoeConfig(**SMALL, intermediate_size=128, moe_intermediate_size=32,
                                                      shared_expert_intermediate_size=64, num_experts=EXPERTS),
                  "Qwen2MoeForCausalLM"),
    "qwen3_moe": (lambda: transformers.Qwen3MoeConfig(**SMALL, intermediate_size=128, moe_intermediate_size=32,
                                                      head_dim=16, num_experts=EXPERTS), "Qwen3MoeForCausalLM"),
}
MODELS = [pytest.param(name, marks=pytest.mark.skipif(not hasattr(transformers, cls), reason=f"no {cls}"))
          for name, (_, cls) in CONFIGS.items()]
EXPORTS = [*(pytest.param(*p.values, (BATCH, SEQ), marks=p.marks) for p in MODELS),
           pytest.param("mixtral", (1, 3), id="mixtral-padded")]  # 6 pairs: C = 2 rows an expert, 2 of them padding


def _model(name, implementation, device="cpu"):
    """The tiny model `name` built on `device` (random weights on the CPU) with that experts implementation."""
    hf_experts.register()
    config_of, cls = CONFIGS[name]
    config = config_of()
    config._experts_implementation = implementation
    torch.manual_seed(0)
    with torch.device(device):
        return getattr(transformers, cls)(config).eval()


def _ids():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))


def _balance(model):
    """Route token t of every MoE block to experts t, t+1, ... (mod E), keeping the router's probabilities
    for them as weights: each expert gets exactly S*k/E of the (token, expert) pairs."""
    for block in (m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")):
        router, forward = block.gate, block.gate.forward

        def routed(hidden_states, router=router, forward=forward):
            logits = forward(hidden_states)[0]
            index = (torch.arange(logits.size(0))[:, None] + torch.arange(router.top_k)) % router.num_experts
            return logits, logits.softmax(-1).gather(1, index), index

        router.forward = routed


def test_register_is_idempotent():
    assert hf_experts.register() == hf_experts.register() == "memplan"
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    assert ALL_EXPERTS_FUNCTIONS["memplan"] is hf_experts.experts_forward


@pytest.mark.parametrize("name", MODELS)
def test_balanced_routing_matches_eager(name):
    """With every expert given S*k/E pairs, the logits equal the eager experts' (same weights)."""
    model = _model(name, "eager")
    _balance(model)
    with torch.no_grad():
        eager = model(input_ids=_ids()).logits
        model.set_experts_implementation("memplan")
        assert model.config._experts_implementation == "memplan"
        ours = model(input_ids=_ids()).logits
    assert torch.allclose(ours, eager, rtol=1e-4, atol=1e-5), (ours - eager).abs().max()


def test_transposed_biased_experts_match_per_pair():
    """GPT-OSS's experts (weights stored (E, H, 2I), biases, its own interleaved gate) at balanced routing:
    the memplan forward equals batched_mm's, which applies each pair's own expert."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=32, num_local_experts=EXPERTS,
                                       num_experts_per_tok=TOP_K)
    torch.manual_seed(0)
    experts = gpt_oss.GptOssExperts(config)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.1)
    hidden, weights = torch.randn(8, 64), torch.rand(8, TOP_K)
    index = (torch.arange(8)[:, None] + torch.arange(TOP_K)) % EXPERTS
    ours = hf_experts.experts_forward(experts, hidden, index, weights)
    assert torch.allclose(ours, batched_mm_experts_forward(experts, hidden, index, weights), rtol=1e-4, atol=1e-5)


def test_unbalanced_routing_keeps_static_shapes():
    """S*k not a multiple of E and every pair sent to one expert: C = ceil(S*k/E) rows an expert, padded;
    the output keeps its shape but not the eager values, on the CPU and the meta device."""
    experts = _model("mixtral", "memplan").model.layers[0].mlp.experts
    hidden = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    index, weights = torch.zeros(3, TOP_K, dtype=torch.long), torch.full((3, TOP_K), 0.5)
    with torch.no_grad():
        out = experts(hidden, index, weights)
        assert out.shape == (3, 64) and torch.isfinite(out).all()
        assert not torch.allclose(out, batched_mm_experts_forward(experts, hidden, index, weights))
    meta = _model("mixtral", "memplan", "meta").model.layers[0].mlp.experts
    index = torch.zeros(3, TOP_K, dtype=torch.long, device="meta")
    assert meta(hidden.to("meta"), index, torch.ones(3, TOP_K, device="meta")).shape == (3, 64)


@pytest.mark.parametrize("name, shape", EXPORTS)
def test_meta_export_plans(name, shape, tmp_path):
    """The weightless model exports to static shapes (no NonZero) with each expert projection one Einsum over
    (E, C, .) rows, and memplan plans it for inference and for a training step with Adam."""
    model = _model(name, "memplan", "meta")
    path = str(tmp_path / f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(Output(model, ["input_ids"], "logits", use_cache=False),
                                    (torch.zeros(shape, dtype=torch.long, device="meta"),), dynamo=True, optimize=False,
                                    input_names=["input_ids"], output_names=["logits"])
    program.save(path, include_initializers=False, keep_initializers_as_inputs=True)
    assert "NonZero" not in {n.op_type for n in onnx.load(path).graph.node}

    rows = -(-shape[0] * shape[1] * TOP_K // EXPERTS)
    inner = model.model.layers[0].mlp.experts.intermediate_dim
    plan = planner.compile(path, {"input_ids": shape})
    einsums = {plan.tensors[s.outputs[0]].shape for s in plan.steps if s.op == "Einsum"}
    assert einsums == {(EXPERTS, rows, 2 * inner), (EXPERTS, rows, 64)}
    train = planner.compile(path, {"input_ids": shape}, training=True, loss="cross_entropy",
                            optimizer="adam")
    for p in (plan, train):
        assert p.weights_absent and "NonZero" not in {s.op for s in p.steps}
        p.verify()
    assert train.arena_bytes > plan.arena_bytes
