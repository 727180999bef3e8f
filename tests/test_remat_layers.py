"""Megatron-LM's recomputations (remat="selective", "full"; planner/remat/layers.py) on a GPT-2 exported by
transformers in training mode (dropout on): the bytes backward keeps per layer against Korthikanti et al.'s
formulas, training bit for bit like the plan that keeps everything, alone and in tensor-, pipeline- and
data-parallel ranks, and the error where a step has no transformer layers."""
import warnings
from functools import partial

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from zoo_cases import input_shapes, small_model

import planner
from executor import Executor
from planner import ConfigError, Parallel, cli

BATCH, SEQ, HIDDEN, HEADS, VOCAB, LAYERS = 2, 16, 64, 4, 128, 2


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(path, buffers) of GPT-2's LM exported in training mode (attention, residual and embedding dropout at 0.1),
    its LM head untied."""
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    import onnx
    from exports import Output, folded_buffers, stored_params
    config = transformers.GPT2Config(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB, n_positions=64,
                                     use_cache=False, attn_implementation="eager", tie_word_embeddings=False)
    torch.manual_seed(0)
    module = Output(transformers.GPT2LMHeadModel(config), ["input_ids"], "logits", use_cache=False).train()
    with torch.no_grad():
        for p in module.parameters():  # apart, so that the exporter merges no equal parameters
            p.add_(0.02 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("gpt2") / "gpt2.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.ones((BATCH, SEQ), dtype=torch.int64),), str(path), input_names=["input_ids"],
                          output_names=["logits"], dynamo=True)
    return str(path), folded_buffers(path, stored_params(module, onnx.load(str(path))))


def compiled(gpt2, remat, **options):
    """The training step of the export (its buffers, the causal mask, frozen) under `remat`."""
    path, frozen = gpt2
    return planner.compile(path, {"input_ids": (BATCH, SEQ)}, training=True, loss="cross_entropy", optimizer="adam",
                           frozen=frozen, remat=remat, **options)


def saved(plan):
    """The bytes of the forward values backward reads (the role breakdown.py counts as 'saved')."""
    return sum(t.nbytes for t in plan.tensors.values() if t.role == "saved")


@pytest.mark.torch
@pytest.mark.parametrize("precision, f", [("fp32", 4), ("bf16", 2)])
def test_saved_bytes_per_layer_are_megatrons(gpt2, precision, f):
    """Unfused (as Megatron computes it: attention and residual Adds as exported), with f-byte floats and bool
    dropout masks, a layer keeps (16f + 2)sbh + (2f + 1)as²b bytes: in bf16 Megatron's 34sbh + 5as²b (16
    tensors of sbh floats, 2 masks; softmax, its dropout's output and mask). "selective" keeps (2f + 1)as²b
    less a layer, "full" only the layer's input, f·sbh (Megatron's 2sbh), beside what the embedding's and the
    LM head's gradients read: the ids and the embedding dropout's mask; the final norm's output, the float32
    logits (the graph's output type) and the labels."""
    s, b, h, a, v = SEQ, BATCH, HIDDEN, HEADS, VOCAB
    unfused = {"fuse_attention": False, "fuse_norm": False, "precision": precision}
    plans = {r: compiled(gpt2, r, **unfused) for r in (None, "selective", "full")}
    outside = (8 * s * b + s * b * h) + (f * s * b * h + 4 * s * b * v + 8 * s * b)
    final_norm_input = f * s * b * h  # the last layer's output, which "full" recomputes with the final norm
    layer = (16 * f + 2) * s * b * h + (2 * f + 1) * a * s * s * b
    assert saved(plans[None]) == LAYERS * layer + final_norm_input + outside
    assert saved(plans[None]) - saved(plans["selective"]) == LAYERS * (2 * f + 1) * a * s * s * b
    assert saved(plans["full"]) == LAYERS * f * s * b * h + outside
    decided = plans["full"].training["remat"]
    assert len(decided["layers"]) == LAYERS and all(len(inputs) == 1 for inputs in decided["layers"])
    clones = {r: [step.op for step in p.steps if "/recompute" in step.name] for r, p in plans.items()}
    assert sorted(clones["selective"]) == sorted(["MatMul", "Mul", "Add", "Softmax", "Dropout"] * LAYERS)
    assert {"Gemm", "LayerNormalization", "BiasActivation", "Dropout", "Softmax"} <= set(clones["full"])
    assert plans["full"].arena_bytes < plans["selective"].arena_bytes < plans[None].arena_bytes


@pytest.mark.torch
def test_full_recomputation_casts_the_weights_again_under_amp(gpt2):
    """Under amp-bf16 each layer's weights are cast to bf16 where they are read; "full" recomputes those casts
    with the layer, as Megatron's checkpointed layer does, so that a layer keeps its float32 input alone (4sbh),
    and none of its 16-bit weight copies (12h² x 2 bytes a layer before). Outside the layers: the ids and the
    embedding dropout's mask, the final norm's bf16 output, the float32 logits, the labels and the LM head's
    bf16 weight, which its gradient reads."""
    s, b, h, v = SEQ, BATCH, HIDDEN, VOCAB
    unfused = {"fuse_attention": False, "fuse_norm": False, "precision": "amp-bf16"}
    plans = {r: compiled(gpt2, r, **unfused) for r in (None, "full")}
    outside = (8 * s * b + s * b * h) + (2 * s * b * h + 4 * s * b * v + 8 * s * b) + 2 * h * v
    assert saved(plans["full"]) == LAYERS * 4 * s * b * h + outside
    casts = {t.name for t in plans["full"].tensors.values() if t.role == "recomputed" and t.dtype == "bfloat16"
             and t.shape in {(h, 3 * h), (h, h), (h, 4 * h), (4 * h, h)}}
    assert len(casts) == 4 * LAYERS
    assert plans["full"].arena_bytes < plans[None].arena_bytes


@pytest.mark.torch
def test_fused_attention_and_norms(gpt2):
    """The fused attention keeps no (s, s) tensor and its gradient op recomputes the scores, so "selective"
    leaves the plan as it is; "full" keeps, past the first layer, the fused residual Add and norm's two
    outputs (the stream and the next layer's normalised input), as no tensor holds the stream alone."""
    s, b, h, v = SEQ, BATCH, HIDDEN, VOCAB
    plans = {r: compiled(gpt2, r) for r in (None, "selective", "full")}
    assert plans["selective"].arena_bytes == plans[None].arena_bytes
    assert plans["selective"].stats["recompute_flops"] == 0
    decided = plans["selective"].training["remat"]
    assert (decided["attention"], decided["fused"], decided["recomputed"]) == (0, LAYERS, [])
    layers = plans["full"].training["remat"]["layers"]
    assert [len(inputs) for inputs in layers] == [1] + [2] * (LAYERS - 1)
    outside = (8 * s * b + s * b * h) + (4 * s * b * h + 4 * s * b * v + 8 * s * b)
    assert saved(plans["full"]) == (2 * LAYERS - 1) * 4 * s * b * h + outside


def trained(plan, steps=3):
    """The losses of `steps` steps of the plan on one batch (NumPy, poison on), and the params after them."""
    ex = Executor(plan, backend="numpy", poison=True)
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(1, VOCAB, (BATCH, SEQ)), "labels": rng.integers(0, VOCAB, (BATCH, SEQ))}
    return [ex.train_step(feeds) for _ in range(steps)], ex.parameters()


@pytest.mark.torch
@pytest.mark.parametrize("fuse_attention", [False, True])
def test_training_is_bit_for_bit_the_plan_that_keeps_everything(gpt2, fuse_attention):
    """Recomputed dropout draws the masks the forward pass drew (memplan.Dropout hashes seed, step and element)."""
    losses, params = trained(compiled(gpt2, None, fuse_attention=fuse_attention))
    for remat in ("selective", "full"):
        got, values = trained(compiled(gpt2, remat, fuse_attention=fuse_attention))
        assert got == losses, remat
        assert all(np.array_equal(values[k], params[k]) for k in params), remat


def _rank(rank, port, results, parallel):
    """One rank of a gloo group: the zoo's GPT-2 (unfused attention, so that "selective" has cores) trained by
    each recomputation's plan of its stage and ranks."""
    import dataclasses

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=parallel.world)
    try:
        m = small_model("gpt2_small")
        mine = dataclasses.replace(parallel, stage=rank // (parallel.dp * parallel.tp))
        rng = np.random.default_rng(rank // parallel.tp % parallel.dp)
        shape = input_shapes(m, 2)["input_ids"]
        feeds = [{"input_ids": rng.integers(0, 100, shape), "labels": rng.integers(0, 100, shape)} for _ in range(2)]
        runs = {}
        for remat in (None, "selective", "full"):  # the plan's inputs are a microbatch's
            plan = planner.compile(m, input_shapes(m, 2 // parallel.microbatches), training=True, optimizer="momentum",
                                   parallel=mine, remat=remat, fuse_attention=False)
            ex = Executor(plan, backend="numpy", poison=True)
            runs[remat] = ([ex.train_step(f) for f in feeds], ex.parameters(), plan.stats["recompute_flops"])
        results.put((rank, runs))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.parametrize("parallel", [Parallel(tp=2, pp=2, microbatches=2), Parallel(dp=2, zero=3)],
                         ids=["tp2-pp2", "dp2-zero3"])
def test_parallel_ranks_train_bit_for_bit_alike(parallel):
    """Each rank (a tensor-parallel piece of a pipeline stage's two microbatches, or a ZeRO-3 data rank) trains
    alike under every recomputation."""
    from gloo import spawned
    for rank, runs in spawned(partial(_rank, parallel=parallel), parallel.world):
        losses, params, _ = runs[None]
        for remat in ("selective", "full"):
            got, values, flops = runs[remat]
            assert got == losses and flops > 0, (rank, remat)
            assert all(np.array_equal(values[k], params[k]) for k in params), (rank, remat)


def attention_on_inputs():
    """softmax(Q K^T) V of the graph's inputs, then a projection: an attention core, but no activation entering it."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["scores"]), helper.make_node("Softmax", ["scores"], ["p"]),
             helper.make_node("MatMul", ["p", "v"], ["o"]), helper.make_node("MatMul", ["o", "w"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8, 8]) for n in ("q", "kt", "v")]
    y, w = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 8]), np.full((8, 8), 0.1, np.float32)
    graph = helper.make_graph(nodes, "attention", inputs, [y], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_steps_without_transformer_layers_are_refused(capsys, tmp_path):
    """A step without attention, or whose first layer no activation enters, is refused in one line naming the
    strategy as the API or the command line spells it."""
    mlp = small_model("mlp")
    for remat in ("selective", "full"):
        with pytest.raises(ConfigError, match=f"remat='{remat}' recomputes transformer layers .* has none"):
            planner.compile(mlp, input_shapes(mlp, 2), training=True, remat=remat)
    unfused = {"training": True, "loss": "mse", "fuse_attention": False}
    with pytest.raises(ConfigError, match="remat='full' found no activation entering the transformer layer"):
        planner.compile(attention_on_inputs(), remat="full", **unfused)
    assert planner.compile(attention_on_inputs(), remat="selective", **unfused).training["remat"]["attention"] == 1
    out = str(tmp_path / "plan.json")
    assert cli.main(["plan", "zoo:mlp", "--batch", "4", "--training", "--remat", "full", "-o", out]) == 2
    err = capsys.readouterr().err
    assert "--remat full recomputes transformer layers" in err and len(err.strip().splitlines()) == 1


def test_recomputation_never_receives_again():
    """What a pipeline stage receives is kept, not recomputed: a copy of its Recv would wait for a second send."""
    plan = planner.compile("zoo:bert_base", {"input_ids": (1, 32), "attention_mask": (1, 32)}, training=True,
                           remat="sublinear", parallel=planner.Parallel(pp=2, microbatches=2, stage=1))
    receives = [s for s in plan.steps if s.op == "Recv"]
    assert receives and not any("recompute" in s.name for s in receives)
