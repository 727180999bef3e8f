"""Tensor parallelism through a mixture of experts (planner/tensor_split.py's Einsum rules): each expert's grouped
GEMM split as Megatron splits a dense MLP, its gate/up projection by columns (the gate and up halves each cut over
the ranks) and its down projection by rows, all-reduced; the router stays whole. Exported from transformers'
Mixtral and Qwen2-MoE with memplan's static experts forward (frontends/hf_experts.py), trained in two ranks as one
process."""
from functools import partial

import pytest

import planner
from gloo import spawned
from parallel_cases import export_rank, exported
from test_tensor_parallel import _train_as_one_process

pytestmark = pytest.mark.torch
EXPERTS, LAYERS = 4, 2


def _moe(family):
    """A builder of transformers' tiny `family` model ("mixtral", "qwen2_moe") with memplan's experts forward."""
    def build():
        import torch
        import transformers
        from exports import Output
        from frontends import hf_experts
        hf_experts.register()
        common = dict(vocab_size=100, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
        if family == "mixtral":
            config = transformers.MixtralConfig(**common, intermediate_size=128, num_local_experts=EXPERTS,
                                                num_experts_per_tok=2)
        else:
            config = transformers.Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                                                 shared_expert_intermediate_size=64, num_experts=EXPERTS,
                                                 num_experts_per_tok=2, decoder_sparse_step=1)
        config._experts_implementation = hf_experts.NAME
        ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
        model = getattr(transformers, "MixtralForCausalLM" if family == "mixtral" else "Qwen2MoeForCausalLM")(config)
        return Output(model, ["input_ids"], "logits", use_cache=False), {"input_ids": ids}
    build.__name__ = family
    return build


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe"])
def moe_export(request, tmp_path_factory):
    pytest.importorskip("transformers")
    return request.param, exported(_moe(request.param), tmp_path_factory.mktemp(request.param))


def test_experts_split_and_train_in_two_tensor_parallel_ranks_as_one_process(moe_export):
    """Every expert weight is split: gate/up (E, 2I, H) on its features in two blocks, down (E, H, I) on its
    contracted features; with attention's q/k/v/o and (Qwen2-MoE) the shared expert's MLP. The ranks train as one."""
    family, (path, feeds) = moe_export
    got = spawned(partial(export_rank, path=path, feeds=feeds, parallel=planner.Parallel(tp=2)), 2)
    facts = got[0][3]["tensor_parallel"]
    experts = {name: split for name, split in facts["split"].items() if "experts" in name}
    assert sorted(map(str, experts.values())) == ["[1, 2]"] * LAYERS + ["[2, 1]"] * LAYERS, facts["split"]
    # a layer's columns: q, k, v, the experts' gate/up, the shared expert's gate and up; rows: o, the experts' down,
    # the shared expert's down (its router and the shared expert's gate, one feature, stay whole)
    columns, rows = {"mixtral": (4, 2), "qwen2_moe": (6, 3)}[family]
    assert (facts["column_layers"], facts["row_layers"]) == (LAYERS * columns, LAYERS * rows)
    _train_as_one_process(got, facts, path, feeds)


def test_a_rank_holds_its_share_of_the_experts(moe_export):
    """At tp 2 a rank's expert weights (and their optimizer state) are half the whole model's."""
    _, (path, feeds) = moe_export
    shape = {"input_ids": feeds[0]["input_ids"].shape}
    whole = planner.compile(path, shape, training=True, optimizer="adam")
    rank = planner.compile(path, shape, training=True, optimizer="adam", parallel=planner.Parallel(tp=2))
    experts = [name for name in rank.training["tensor_parallel"]["split"] if "experts" in name]
    assert experts and all(2 * rank.tensors[n].nbytes == whole.tensors[n].nbytes for n in experts)
