"""Tensor-parallel training plans (planner/passes/tensor_parallel.py): the transformer blocks' linear layers and
attention heads split over tp ranks as Megatron splits them, found in the exported graph; run in 2 and 4 CPU
processes over torch.distributed's gloo (with data parallelism beside it), the ranks train as one process."""
import json
from functools import partial

import numpy as np
import pytest

import planner
from executor import Executor
from planner import cli
from planner.compiler import split
from planner.errors import ConfigError
from planner.parallel import joined, piece
from gloo import spawned
from parallel_cases import BATCH, batches, compiled, export_rank, exported, trained_alone
from zoo_cases import input_shapes, small_model


def test_pieces_join_back_into_the_value():
    value = np.arange(4 * 12, dtype=np.float32).reshape(4, 12)
    for dim, blocks in ((0, 1), (1, 1), (1, 3)):
        pieces = [piece(value, dim, blocks, rank, 2) for rank in range(2)]
        assert pieces[0].shape[dim] == value.shape[dim] // 2
        np.testing.assert_array_equal(joined(pieces, dim, blocks), value)
    q, k, v = np.split(value, 3, axis=1)  # a fused QKV weight: each rank holds its half of each of the three
    np.testing.assert_array_equal(piece(value, 1, 3, 1, 2), np.concatenate([q[:, 2:], k[:, 2:], v[:, 2:]], axis=1))
    q, k, v = np.split(value, [6, 8], axis=1)  # grouped-query: k and v narrower than q
    np.testing.assert_array_equal(piece(value, 1, [6, 2, 4], 1, 2),
                                  np.concatenate([q[:, 3:], k[:, 1:], v[:, 2:]], axis=1))
    np.testing.assert_array_equal(joined([piece(value, 1, [6, 2, 4], r, 2) for r in range(2)], 1, [6, 2, 4]), value)


@pytest.mark.parametrize("model, columns, rows", [("gpt2_small", 4, 4), ("bert_base", 8, 4)])
def test_each_block_splits_as_megatron_splits_it(model, columns, rows):
    """Column-parallel QKV and MLP-up weights (with their biases), row-parallel output projections; the
    embeddings, norms and the LM head whole; one all-reduce after each row-parallel layer and one of each
    region input's gradient."""
    plain, plan = compiled(model, 2, optimizer="adam"), compiled(model, 2, planner.Parallel(tp=2), "adam")
    facts = plan.training["tensor_parallel"]
    assert (facts["column_layers"], facts["row_layers"]) == (columns, rows)
    for name, (dim, blocks) in facts["split"].items():
        whole, mine = plain.tensors[name].shape, plan.tensors[name].shape
        assert mine[dim] * 2 == whole[dim] and len(mine) == len(whole)
        assert blocks == (3 if "c_attn" in name else 1)
        for suffix in ("exp_avg", "exp_avg_sq"):
            assert plan.tensors[f"{name}/{suffix}"].shape == mine
    names = set(facts["split"])
    assert not any("wte" in n or "ln_" in n or "LayerNorm" in n or "embeddings" in n for n in names)
    assert any(n.endswith("c_proj.bias") or n.endswith("output.bias") for n in plain.training["params"])
    assert not any(n.endswith("c_proj.bias") or n.endswith("output.bias") for n in names)  # added once reduced
    reduces = [s for s in plan.steps if s.op == "AllReduce"]
    forward = [s for s in reduces if s.phase == ""]
    assert len(forward) == rows and all(s.attrs["group"] == "tp" for s in reduces)
    assert len(reduces) == 2 * rows  # each block: its attention input's gradient and its MLP input's
    assert plan.arena_bytes < plain.arena_bytes
    assert plan.training["parallel"]["collective_bytes_by_group"]["tp"] > 0


def test_sizes_tp_does_not_divide_are_refused():
    with pytest.raises(ConfigError, match="cannot split .* evenly"):
        compiled("gpt2_small", 2, planner.Parallel(tp=3))
    with pytest.raises(ConfigError, match="fewer attention heads than ranks"):
        compiled("gpt2_small", 2, planner.Parallel(tp=8))
    with pytest.raises(ConfigError, match="tensor parallelism found no linear layers to split"):
        compiled("resnet18", 2, planner.Parallel(tp=2))
    with pytest.raises(ConfigError, match="parallel tp must be an int >= 1"):
        planner.Parallel(tp=0)


def _rank(rank, port, results, model, dp, tp, zero, precision="fp32"):
    """One rank of a gloo group of dp * tp: STEPS training steps on its data rank's share of each batch."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=dp * tp)
    try:
        plan = compiled(model, BATCH // dp, planner.Parallel(dp=dp, tp=tp, zero=zero), "momentum", precision=precision)
        ex = Executor(plan, backend="numpy", poison=True)
        share = slice(rank // tp * BATCH // dp, (rank // tp + 1) * BATCH // dp)
        losses = [ex.train_step({k: v[share] for k, v in feeds.items()}) for feeds in batches(model)]
        results.put((rank, losses, ex.parameters(), plan.training, plan.arena_bytes, ex.arena.buffer.nbytes))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.parametrize("model, dp, tp, zero, precision", [
    ("gpt2_small", 1, 2, 0, "fp32"), ("bert_base", 1, 2, 0, "fp32"), ("gpt2_small", 2, 2, 1, "fp32"),
    ("bert_base", 2, 2, 3, "fp32"), ("gpt2_small", 1, 4, 0, "fp32"), ("gpt2_small", 1, 2, 0, "amp-bf16")])
def test_ranks_train_as_one_process(model, dp, tp, zero, precision):
    """After STEPS momentum steps the ranks' pieces of each param join into the single process's param,
    and the data ranks' mean loss is its loss; under amp-bf16 (each weight's bfloat16 copy cut with it) within
    bfloat16's rounding, as the ranks sum partial products the single process does not. (Not adam: the key
    bias's gradient is zero but for rounding, which adam's normalization makes whole steps of either sign.)"""
    got = spawned(partial(_rank, model=model, dp=dp, tp=tp, zero=zero, precision=precision), dp * tp)
    single = Executor(compiled(model, BATCH, optimizer="momentum", precision=precision), backend="numpy")
    losses = [single.train_step(feeds) for feeds in batches(model)]
    rtol, atol = (1e-5, 1e-5) if precision == "fp32" else (2e-2, 2e-3)
    np.testing.assert_allclose(np.mean([g[1] for g in got], axis=0), losses, rtol=rtol)
    for _, _, _, _, planned, held in got:
        assert held == planned, "the rank's arena is the bytes its plan says"
    split, sharded = got[0][3]["tensor_parallel"]["split"], got[0][3]["parallel"]["sharded"]
    for name, value in single.parameters().items():
        for d in range(dp):
            ranks = [got[d * tp + t][2][name] for t in range(tp)]
            if name in sharded:  # ZeRO-3: each data rank holds its shard of its tensor rank's piece
                shape = list(value.shape)
                if name in split:
                    shape[split[name][0]] //= tp
                ranks = [np.concatenate([got[e * tp + t][2][name] for e in range(dp)])[:np.prod(shape)].reshape(shape)
                         for t in range(tp)]
            param = joined(ranks, *split[name]) if name in split else ranks[0]
            np.testing.assert_allclose(param, value, rtol=10 * rtol, atol=atol, err_msg=f"data rank {d}: {name}")


def test_the_report_and_fit_plan_tensor_parallel_ranks(tmp_path, capsys):
    """`report --tp` describes the rank's split; `fit` tries tensor parallelism over 2 and 4 of 4 devices
    (ZeRO-1 over the rest), each row's per-rank batch the largest whose rank plan fits, and says why a model
    with nothing to split has no such rows."""
    import json

    import onnx

    from planner import cli
    path = tmp_path / "gpt2.onnx"
    onnx.save(small_model("gpt2_small"), path)
    common = [str(path), "--input", "input_ids:2x16", "--training", "--optimizer", "adam"]
    assert cli.main(["report", *common, "--tp", "2", "--dp", "2", "--strategy", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert "one of 2 data-parallel ranks, ZeRO-0 (its own share of the batch), and of 2 tensor-parallel ranks" in out
    assert "splits 4 of the model's linear layers by columns and 4 by rows: 12 params split" in out
    assert cli.main(["fit", *common[:3], "--optimizer", "adam", "--gpus", "4", "--memory", "2MiB", "--json"]) == 0
    rows = {r["layout"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for tp in (2, 4):
        zero = 1 if tp < 4 else 0  # ZeRO-1 over the data ranks beside the tensor-parallel ones, where there are some
        row = rows[f"dp {4 // tp} x tp {tp}, ZeRO-{zero}"]
        assert row["global_batch"] == row["batch_per_rank"] * (4 // tp)

        def arena(batch):
            return planner.compile(str(path), {"input_ids": (batch, 16)}, training=True, optimizer="adam",
                                   parallel=planner.Parallel(dp=4 // tp, tp=tp, zero=zero)).arena_bytes
        assert arena(row["batch_per_rank"]) == row["arena_bytes"] <= 2 << 20 < arena(row["batch_per_rank"] + 1)
    from planner import fit
    cnn = small_model("resnet18")
    tps, pps, notes = fit.model_parallel_sizes(
        lambda batch, **o: planner.compile(cnn, input_shapes(cnn, batch), training=True, **o), 4)
    assert tps == [] and pps == [2, 4]
    assert notes == ["no tp 2, 4: tensor parallelism found no linear layers to split: it splits MatMuls and Gemms "
                     "of 2-D weights whose outputs reach another one's contraction (transformer blocks' attention "
                     "and MLPs)"]

    def unplanned(batch, **o):  # the same answers from the passes alone (planner.compiler.split), as the CLI asks
        raise AssertionError("a split is told without planning")
    unplanned.splits = lambda batch, **o: split(cnn, input_shapes(cnn, batch), training=True, **o)
    assert fit.model_parallel_sizes(unplanned, 4) == (tps, pps, notes)


@pytest.mark.torch
@pytest.mark.parametrize("build", ["gpt2", "qwen2"])
def test_transformers_exports_train_in_two_tensor_parallel_ranks_as_one_process(build, tmp_path):
    """transformers' GPT-2 (Conv1D layers as Gemms, a fused QKV projection viewed back to 3-D) and Qwen2
    (rotary embeddings sliced per head, grouped-query heads expanded and merged with the batch): every block
    splits, biases the exporter shares among equal ones are read through each rank's piece, and the ranks
    train as one process."""
    path, feeds = exported(build, tmp_path)
    got = spawned(partial(export_rank, path=path, feeds=feeds, parallel=planner.Parallel(tp=2)), 2)
    facts = got[0][3]["tensor_parallel"]
    assert facts["row_layers"] == 4 and facts["column_layers"] == {"gpt2": 4, "qwen2": 10}[build]
    _train_as_one_process(got, facts, path, feeds)


def _train_as_one_process(got, facts, path, feeds):
    """The ranks' losses are the single process's, and their pieces of each param join into its param."""
    losses, values = trained_alone(path, feeds)
    np.testing.assert_allclose(got[0][1], losses, rtol=1e-5)
    for name, value in values.items():
        ranks = [g[2][name] for g in got]
        param = joined(ranks, *facts["split"][name]) if name in facts["split"] else ranks[0]
        np.testing.assert_allclose(param, value, rtol=1e-4, atol=1e-5, err_msg=name)


def export_legacy_gpt2(path):
    """transformers' GPT-2 exported by the TorchScript exporter, as a user of the older export API would: eager
    attention, a mask of ones (transformers' packed-sequence check uses aten::diff, which that exporter lacks).
    Its QKV biases, all zero, become one initializer that every block reads."""
    transformers = pytest.importorskip("transformers")
    import warnings

    import torch
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, use_cache=False)
    config._attn_implementation = "eager"
    torch.manual_seed(0)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.GPT2LMHeadModel(config)

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LM().eval(), (torch.zeros(2, 16, dtype=torch.int64),), str(path), dynamo=False,
                          input_names=["input_ids"], output_names=["logits"], opset_version=17,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}})


@pytest.mark.torch
def test_a_legacy_gpt2_export_plans_fits_and_trains_in_two_tensor_parallel_ranks(tmp_path, capsys):
    """The TorchScript export's one QKV bias initializer is read by every block through this rank's piece of
    it, made by nodes of names of their own (they once collided: `duplicate node names: ...Reshape/3`), so
    `report --tp 2` and `fit` plan it, and two tensor-parallel ranks train as one process."""
    import onnx

    from planner import cli, fit
    path = tmp_path / "gpt2.onnx"
    export_legacy_gpt2(path)
    biases = [i.name for i in onnx.load(str(path)).graph.initializer if i.name.endswith("c_attn.bias")]
    assert len(biases) == 1, "the export shares one initializer among the blocks' QKV biases"
    assert cli.main(["report", str(path), "--input", "input_ids:2x16", "--training", "--tp", "2", "--strategy",
                     "bestfit"]) == 0
    assert "splits 4 of the model's linear layers by columns and 4 by rows" in capsys.readouterr().out
    plan = planner.compile(str(path), {"input_ids": (2, 16)}, training=True, parallel=planner.Parallel(tp=2))
    names = [s.name for s in plan.steps]
    assert len(names) == len(set(names)) and any("/tensor_parallel/blocks/" in n for n in names)
    tps, _, notes = fit.model_parallel_sizes(
        lambda batch, **o: planner.compile(str(path), {"input_ids": (batch, 16)}, training=True, **o), 8)
    assert tps == [2, 4] and notes[0].startswith("no tp 8: tensor parallelism over 8 ranks cannot split")
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 64, (2, 16)), "labels": rng.integers(0, 64, (2, 16))} for _ in range(3)]
    got = spawned(partial(export_rank, path=str(path), feeds=feeds, parallel=planner.Parallel(tp=2)), 2)
    split = got[0][3]["tensor_parallel"]["split"]
    losses, values = trained_alone(str(path), feeds)
    np.testing.assert_allclose(got[0][1], losses, rtol=1e-5)
    for name, value in values.items():
        ranks = [g[2][name] for g in got]
        param = joined(ranks, *split[name]) if name in split else ranks[0]
        np.testing.assert_allclose(param, value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_rewrites_never_take_a_name_the_model_uses():
    """A model's node named as a rewrite would name one of its own (tensor parallelism's, the backward pass's,
    the optimizer's) keeps its name, and the rewrite takes another: every step's name stays its own."""
    import copy

    m = small_model("gpt2_small")
    made = [s.name for s in compiled("gpt2_small", 2, planner.Parallel(tp=2)).steps
            if s.name.startswith(("tensor_parallel/", "grad/", "optimizer/"))]
    kept = {s.name for s in compiled("gpt2_small", 2, planner.Parallel(tp=2)).steps}
    taken = copy.deepcopy(m)
    picked = [made[0], next(n for n in made if n.startswith("grad/")), next(n for n in made if "optimizer/" in n)]
    for node, name in zip((n for n in taken.graph.node if n.name in kept), picked):  # nodes that stay in the plan
        node.name = name
    plan = planner.compile(taken, input_shapes(taken, 2), training=True, optimizer="momentum",
                           parallel=planner.Parallel(tp=2))
    names = [s.name for s in plan.steps]
    assert len(picked) == 3 and set(picked) <= set(names) and len(names) == len(set(names))


def phi3():
    """transformers' Phi-3: one qkv_proj whose output is sliced into q, then the narrower k and v (grouped-query),
    one gate_up_proj chunked in two."""
    import torch
    import transformers
    from exports import Output
    config = transformers.Phi3Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     pad_token_id=0, use_cache=False)
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    return Output(transformers.Phi3ForCausalLM(config), ["input_ids"], "logits", use_cache=False), {"input_ids": ids}


@pytest.fixture(scope="module")
def phi3_export(tmp_path_factory):
    pytest.importorskip("transformers")
    return exported(phi3, tmp_path_factory.mktemp("phi3"))


@pytest.mark.torch
def test_phi3_fused_projections_train_in_two_tensor_parallel_ranks_as_one_process(phi3_export):
    """Phi-3's qkv_proj is cut block by block (each rank its q heads and its k and v heads), its gate_up_proj in
    its two halves, and the ranks train as one process."""
    path, feeds = phi3_export
    got = spawned(partial(export_rank, path=path, feeds=feeds, parallel=planner.Parallel(tp=2)), 2)
    facts = got[0][3]["tensor_parallel"]
    assert (facts["column_layers"], facts["row_layers"]) == (4, 4)
    assert sorted(map(str, facts["split"].values())) == ["[0, 1]"] * 4 + ["[1, 2]"] * 2 + ["[1, [64, 32, 32]]"] * 2
    _train_as_one_process(got, facts, path, feeds)


@pytest.mark.torch
def test_phi3_key_and_value_heads_fewer_than_ranks_are_refused(phi3_export):
    with pytest.raises(ConfigError, match="fewer attention heads than ranks"):
        planner.compile(phi3_export[0], {"input_ids": (2, 8)}, training=True, parallel=planner.Parallel(tp=4))


def fused(ranges):
    """y = sum of each block's product by a weight of its own, the blocks cut from a fused projection of x
    ((2, 4, 16) -> 24 features) by one Slice each of `ranges` ((start, end, step) of the last axis), and from a
    second one's by a Split into 12, 6 and 6; both projections add one shared bias (read through each rank's
    piece of it)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    params = {"w1": rng.standard_normal((16, 24)), "w2": rng.standard_normal((16, 24)), "b": rng.standard_normal(24)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b"], ["h1"]),
             helper.make_node("MatMul", ["x", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b"], ["h2"]),
             helper.make_node("Split", ["h2", "sizes"], ["s0", "s1", "s2"], axis=-1)]
    ints = {"sizes": [12, 6, 6], "axis": [-1]}
    blocks = []
    for j, (start, end, step) in enumerate(ranges):
        ints.update({f"start{j}": [start], f"end{j}": [end], f"step{j}": [step]})
        nodes.append(helper.make_node("Slice", ["h1", f"start{j}", f"end{j}", "axis", f"step{j}"], [f"t{j}"]))
        blocks.append((f"t{j}", len(range(start, end, step))))
    blocks += [("s0", 12), ("s1", 6), ("s2", 6)]
    for j, (name, width) in enumerate(blocks):
        params[f"r{j}"] = rng.standard_normal((width, 16)) / width
        nodes.append(helper.make_node("MatMul", [name, f"r{j}"], [f"p{j}"]))
        nodes.append(helper.make_node("Add", [f"y{j - 1}" if j else "p0", f"p{j}"], [f"y{j}"]) if j else
                     helper.make_node("Identity", ["p0"], ["y0"]))
    nodes.append(helper.make_node("Identity", [f"y{len(blocks) - 1}"], ["y"]))
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in params.items()]
    inits += [numpy_helper.from_array(np.asarray(v, np.int64), n) for n, v in ints.items()]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


BLOCKS = [(0, 12, 1), (12, 18, 1), (18, 24, 1)]


def _fused_rank(rank, port, results, model, feeds):
    """One rank of two tensor-parallel ones training `model` (see `fused`) on `feeds`."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        plan = planner.compile(model, {"x": (2, 4, 16)}, training=True, loss="mse", optimizer="momentum",
                               parallel=planner.Parallel(tp=2))
        ex = Executor(plan, backend="numpy", poison=True)
        results.put((rank, [ex.train_step(f) for f in feeds], ex.parameters(), plan.training))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
def test_a_fused_projection_sliced_in_unequal_blocks_trains_in_two_ranks_as_one_process():
    """Slices and a Split into blocks of 12, 6 and 6 features: each weight cut block by block, the shared bias read
    through the rank's piece of its blocks, and the ranks train as one process."""
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 4, 16)).astype(np.float32),
              "targets": rng.standard_normal((2, 4, 16)).astype(np.float32)} for _ in range(3)]
    model = fused(BLOCKS)
    got = spawned(partial(_fused_rank, model=model, feeds=feeds), 2)
    split = got[0][3]["tensor_parallel"]["split"]
    assert split == {"r0": [0, 1], "r1": [0, 1], "r2": [0, 1], "r3": [0, 1], "r4": [0, 1], "r5": [0, 1],
                     "w1": [1, [12, 6, 6]], "w2": [1, [12, 6, 6]]}
    single = Executor(planner.compile(model, {"x": (2, 4, 16)}, training=True, loss="mse", optimizer="momentum"),
                      backend="numpy")
    np.testing.assert_allclose(got[0][1], [single.train_step(f) for f in feeds], rtol=1e-5)
    for name, value in single.parameters().items():
        ranks = [g[2][name] for g in got]
        param = joined(ranks, *split[name]) if name in split else ranks[0]
        np.testing.assert_allclose(param, value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_unequal_blocks_tp_does_not_divide_are_refused():
    with pytest.raises(ConfigError, match="cuts 24 features into blocks of 12, 6, 6, and 4 ranks do not split each"):
        planner.compile(fused(BLOCKS), {"x": (2, 4, 16)}, training=True, loss="mse", parallel=planner.Parallel(tp=4))


@pytest.mark.parametrize("ranges", [[(0, 12, 1), (8, 18, 1), (18, 24, 1)], [(0, 24, 2), (1, 24, 2)],
                                    [(0, 12, 1), (14, 18, 1), (18, 24, 1)]], ids=["overlapping", "strided", "gap"])
def test_slices_other_than_consecutive_blocks_leave_the_region_whole(ranges):
    """The sliced projection and the products of its slices stay whole on every rank; the Split one beside it
    splits."""
    plan = planner.compile(fused(ranges), {"x": (2, 4, 16)}, training=True, loss="mse",
                           parallel=planner.Parallel(tp=2))
    facts = plan.training["tensor_parallel"]
    assert set(facts["split"]) == {"w2", *(f"r{len(ranges) + j}" for j in range(3))}  # the Split's blocks' rows
    assert facts["split"]["w2"] == [1, [12, 6, 6]]
    assert plan.tensors["w1"].shape == (16, 24)


def _inference_rank(rank, port, results, model, feeds, tp):
    """One rank of a gloo group of `tp`: its inference plan of `model` (a zoo name or an export's path) run on
    `feeds`; its outputs, facts and arena."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    try:
        source = small_model(model) if model in ("gpt2_small", "bert_base") else model
        plan = planner.compile(source, {k: v.shape for k, v in feeds.items()}, parallel=planner.Parallel(tp=tp))
        ex = Executor(plan, backend="numpy", poison=True)
        results.put((rank, ex.run(feeds), plan.training, plan.arena_bytes))
    finally:
        dist.destroy_process_group()


def _inference_feeds(model):
    return {k: v for k, v in batches(model)[0].items() if k != "labels"}


@pytest.mark.torch
@pytest.mark.parametrize("model, tp", [("gpt2_small", 2), ("bert_base", 2), ("gpt2_small", 4), ("phi3", 2)])
def test_inference_ranks_give_the_single_process_outputs(model, tp, request):
    """An inference plan of one of tp tensor-parallel ranks (Parallel(tp=N) without training): the blocks split
    as for training, each rank's arena smaller than the whole model's, and every rank's outputs those of the
    single process."""
    if model == "phi3":
        path, train_feeds = request.getfixturevalue("phi3_export")
        model, feeds = path, {"input_ids": train_feeds[0]["input_ids"]}
    else:
        feeds = _inference_feeds(model)
    got = spawned(partial(_inference_rank, model=model, feeds=feeds, tp=tp), tp)
    source = small_model(model) if model in ("gpt2_small", "bert_base") else model
    single = planner.compile(source, {k: v.shape for k, v in feeds.items()})
    want = Executor(single, backend="numpy").run(feeds)
    for rank, outputs, facts, arena in got:
        assert set(facts) == {"tensor_parallel"} and facts["tensor_parallel"]["tp"] == tp
        assert arena < single.arena_bytes
        for name, value in want.items():
            np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-5, err_msg=f"rank {rank}: {name}")


def test_inference_takes_tensor_parallelism_alone():
    m = small_model("gpt2_small")
    for parallel in (planner.Parallel(dp=2), planner.Parallel(tp=2, pp=2), planner.Parallel(tp=2, sequence_parallel=True)):
        with pytest.raises(planner.PlanError, match="inference plan takes tensor parallelism alone"):
            planner.compile(m, input_shapes(m, 2), parallel=parallel)


def test_the_report_plans_an_inference_rank(capsys):
    """`report --tp N` without --training: one rank's inference arena beside one device's, and what it sends."""
    assert cli.main(["report", "zoo:gpt2_small", "--input", "input_ids:1x32", "--tp", "2", "--strategy", "bestfit",
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    tp = doc["tensor_parallel"]
    assert tp["tp"] == 2 and "training" not in doc
    bestfit = next(r["arena_bytes"] for r in doc["rows"] if r["strategy"] == "bestfit")
    assert bestfit < tp["unsharded_arena_bytes"] and tp["collective_bytes"] > 0
    assert cli.main(["report", "zoo:gpt2_small", "--input", "input_ids:1x32", "--tp", "2", "--strategy", "bestfit"]) == 0
    assert "one of 2 tensor-parallel ranks" in capsys.readouterr().out
    assert cli.main(["report", "zoo:gpt2_small", "--input", "input_ids:1x32", "--tp", "2", "--pp", "2"]) == 2
    capsys.readouterr()
    assert cli.main(["max-batch", "zoo:gpt2_small", "--input", "input_ids:1x32", "--tp", "2", "--budget", "4MiB",
                     "--strategy", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert "the largest batch whose plan fits" in out and "mirror" not in out
