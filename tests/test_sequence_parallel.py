"""Sequence parallelism (planner/passes/sequence_parallel.py, Megatron-LM's, Korthikanti et al. 2022): the norms,
residual adds and dropouts tensor parallelism leaves whole run on 1/tp of the sequence on each rank, between
all-gathers and reduce-scatters of the sequence; run in CPU processes over torch.distributed's gloo, the ranks
train as one process, and the plan holds a rank's share of the tokens where Megatron does."""
import warnings
from functools import partial

import numpy as np
import parallel_cases as cases
import pytest
from gloo import spawned

import planner
from executor import Executor
from planner.errors import ConfigError
from planner.parallel import joined

SP = planner.Parallel(tp=2, sequence_parallel=True)


def _check_joined(got, values, tp, dp=1):
    """Each param the ranks hold, tensor-parallel pieces joined, is the one process's `values` (a norm's scale too,
    whose gradient each rank makes a part of, summed over the ranks)."""
    split = got[0][3]["tensor_parallel"]["split"]
    for name, value in values.items():
        for d in range(dp):
            ranks = [got[d * tp + t][2][name] for t in range(tp)]
            param = joined(ranks, *split[name]) if name in split else ranks[0]
            np.testing.assert_allclose(param, value, rtol=1e-4, atol=1e-5, err_msg=f"data rank {d}: {name}")


@pytest.mark.torch
@pytest.mark.parametrize("build", [cases.gpt2, "qwen2"], ids=["gpt2", "qwen2"])
def test_transformers_exports_train_in_two_sequence_parallel_ranks_as_one_process(build, tmp_path):
    """transformers' GPT-2 (its Conv1D layers Gemms of (batch * sequence, features) views, so that the collectives
    cut each batch row's run of that merged dim) and Qwen2 (RMSNorm, grouped-query heads): every row-parallel
    product is reduce-scattered and every column-parallel input all-gathered, and two ranks train as one process."""
    path, feeds = cases.exported(build, tmp_path)
    got = spawned(partial(cases.export_rank, path=path, feeds=feeds, parallel=SP), 2)
    facts = got[0][3]["sequence_parallel"]
    assert (facts["reduce_scatters"], facts["all_gathers"], facts["all_reduces_kept"], facts["inputs_kept"]) == \
        (4, 4, 0, 0)
    assert (facts["batch"], facts["sequence"]) == feeds[0]["input_ids"].shape
    losses, values = cases.trained_alone(path, feeds)
    np.testing.assert_allclose(got[0][1], losses, rtol=1e-5)
    np.testing.assert_allclose(got[1][1], losses, rtol=1e-5)
    _check_joined(got, values, 2)


def _zoo_rank(rank, port, results, parallel):
    """One rank of a gloo group of parallel.world training the zoo's gpt2_small on its data rank's share of each
    batch."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=parallel.world)
    try:
        plan = cases.compiled("gpt2_small", cases.BATCH // parallel.dp, parallel)
        ex = Executor(plan, backend="numpy", poison=True)
        mine = rank // parallel.tp
        share = slice(mine * cases.BATCH // parallel.dp, (mine + 1) * cases.BATCH // parallel.dp)
        losses = [ex.train_step({k: v[share] for k, v in feeds.items()}) for feeds in cases.batches("gpt2_small")]
        results.put((rank, losses, ex.parameters(), plan.training, plan.arena_bytes, ex.arena.buffer.nbytes))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
def test_data_and_sequence_parallel_ranks_train_as_one_process():
    """The zoo's gpt2_small over 2 data-parallel x 2 tensor-parallel ranks (ZeRO-1), the sequence sharded: the data
    ranks' mean loss is the one process's, the params its params, each rank's arena the bytes its plan says."""
    parallel = planner.Parallel(dp=2, tp=2, zero=1, sequence_parallel=True)
    got = spawned(partial(_zoo_rank, parallel=parallel), 4)
    single = Executor(cases.compiled("gpt2_small", cases.BATCH), backend="numpy")
    losses = [single.train_step(feeds) for feeds in cases.batches("gpt2_small")]
    np.testing.assert_allclose(np.mean([g[1] for g in got], axis=0), losses, rtol=1e-5)
    assert all(held == planned for *_, planned, held in got)
    _check_joined(got, single.parameters(), 2, dp=2)


@pytest.fixture(scope="module")
def gpt2_dropouts(tmp_path_factory):
    """transformers' GPT-2 (`gpt2`) exported in training mode, its dropouts (after the embeddings and after each
    attention and MLP block, ratio 0.1) kept."""
    pytest.importorskip("onnxscript")
    import torch
    torch.manual_seed(0)
    model, inputs = cases.gpt2()
    path = str(tmp_path_factory.mktemp("gpt2") / "gpt2_train.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.train(), tuple(inputs.values()), path, input_names=list(inputs), output_names=["out"],
                          dynamo=True)
    return path


def _planned(path, parallel, precision="fp32"):
    return planner.compile(path, {"input_ids": (2, 16)}, training=True, optimizer="momentum", parallel=parallel,
                           precision=precision)


@pytest.mark.torch
def test_norm_inputs_and_dropout_masks_hold_a_ranks_share_of_the_sequence(gpt2_dropouts):
    """Batch 2 x 16 tokens x 64 float32 features: each norm's inputs (the residual stream and the blocks' outputs)
    plan 8192 bytes a tensor under tensor parallelism alone and 4096 with the sequence sharded over 2 ranks; each
    dropout mask 2048 and 1024. The column-parallel layers' gathered inputs are gathered again in backward, not
    kept, and the rank's dropouts draw from a counter of their own."""
    whole, plan = _planned(gpt2_dropouts, planner.Parallel(tp=2)), _planned(gpt2_dropouts, SP)
    forward = [s for s in plan.steps if s.phase == ""]
    norms = [s for s in forward if s.op in ("LayerNormalization", "AddLayerNormalization")]
    inputs = sorted({i for s in norms for i in s.inputs[:1 + (s.op == "AddLayerNormalization")]})
    masks = [s.outputs[1] for s in forward if s.op == "Dropout"]
    assert len(norms) == 5 and len(masks) == 5  # 2 layers of 2 norms and the final one; a dropout after each block
    assert len(inputs) == 8  # the norms' 9 reads: the embeddings' dropped sum read by a layer's two norms
    assert {(whole.tensors[n].nbytes, plan.tensors[n].nbytes) for n in inputs} == {(8192, 4096)}
    assert {(whole.tensors[n].nbytes, plan.tensors[n].nbytes) for n in masks} == {(2048, 1024)}
    assert {plan.tensors[n].shape for n in inputs + masks} == {(2, 8, 64)}
    gathered = [s.outputs[0] for s in forward if s.op == "AllGather" and s.attrs.get("partial")]
    assert len(gathered) == 4 and set(gathered) <= set(plan.training["remat"]["recomputed"])
    assert {plan.tensors[s.inputs[0]].shape for s in forward if s.op == "AllGather"} == {(16, 64), (2, 8, 64)}
    counters = {s.inputs[1] for s in forward if s.op == "Dropout"}
    assert counters.isdisjoint(plan.inputs), "a sharded dropout draws from the rank's own counter"
    assert plan.arena_bytes < whole.arena_bytes


def _saved(plan):
    """The bytes of the buffers the forward pass fills that the backward pass reads."""
    def base(name):
        while plan.tensors[name].alias_of:
            name = plan.tensors[name].alias_of
        return name
    read = {i for s in plan.steps if s.phase != "" for i in s.inputs}
    kept = {base(o) for s in plan.steps if s.phase == "" for o in s.outputs if o in read}
    return sum(plan.tensors[n].nbytes for n in kept if plan.tensors[n].kind == "activation")


@pytest.mark.torch
def test_the_layers_keep_what_megatron_keeps(gpt2_dropouts):
    """At 16 bits a layer keeps sbh(10 + 24/t) bytes for backward under tensor parallelism and (sbh/t)(34) with the
    sequence sharded (Korthikanti et al.'s counts, bar the attention scores memplan's fused attention never holds):
    10sbh(1 - 1/t) less, 10240 bytes at s 16, b 2, h 64, t 2 (the norms' inputs, the column-parallel layers' and the
    dropout masks), in each of 2 layers; and half of the embeddings' dropped sum and its mask and of the LM head's
    input, 5sbh, outside them."""
    sbh, t = 16 * 2 * 64, 2
    whole, plan = (_planned(gpt2_dropouts, planner.Parallel(tp=t, sequence_parallel=sp), "bf16")
                   for sp in (False, True))
    assert _saved(whole) - _saved(plan) == 2 * 10 * sbh * (1 - 1 / t) + 5 * sbh * (1 - 1 / t) == 25600


def test_every_pass_ensures_what_it_says_under_zero3():
    """Under ZeRO-3 beside it (the norms' scales read through ParallelInput are gathered shards), each pass holds
    what it ensures, and the sequence-parallel pass's did not hold before it: an all-reduce whose sum the norms read."""
    from test_pipeline_passes import stepwise
    from zoo_cases import input_shapes, small_model

    from planner import CompileOptions, Config
    model = small_model("gpt2_small")
    options = CompileOptions(config=Config(), training=True, parallel=planner.Parallel(dp=2, zero=3, tp=2,
                                                                                     sequence_parallel=True))
    for step, before, graph, facts, properties in stepwise(options, model, input_shapes(model, 2)):
        assert all(p.holds(graph, facts) for p in properties | step.ensures), step.name
        if step.name == "sequence_parallel":
            assert not all(p.holds(before, facts) for p in step.ensures)
    assert facts["sequence_parallel"]["reduce_scatters"] == 4 and facts["parallel"]["sharded"]


def test_sequence_parallelism_needs_tensor_parallel_ranks_that_divide_the_sequence():
    with pytest.raises(ConfigError, match="sequence_parallel shards the sequence among the tensor-parallel ranks"):
        planner.Parallel(dp=2, sequence_parallel=True)
    with pytest.raises(ConfigError, match="sequence_parallel must be True or False"):
        planner.Parallel(tp=2, sequence_parallel=1)
    from zoo_cases import small_model
    with pytest.raises(ConfigError, match="splits the sequence evenly: 15 tokens is not a multiple of 2"):
        planner.compile(small_model("gpt2_small"), {"input_ids": (2, 15)}, training=True, parallel=SP)
    with pytest.raises(ConfigError, match="splits the sequence evenly: 18 tokens is not a multiple of 4"):
        planner.compile(small_model("gpt2_small"), {"input_ids": (2, 18)}, training=True,
                        parallel=planner.Parallel(tp=4, sequence_parallel=True))


def test_the_cli_plans_sequence_parallel_ranks(tmp_path, capsys):
    """`--sequence-parallel` goes with `--tp N`, which it needs."""
    import onnx
    from zoo_cases import small_model

    from planner import cli
    path = tmp_path / "gpt2.onnx"
    onnx.save(small_model("gpt2_small"), path)
    common = [str(path), "--input", "input_ids:2x16", "--training", "--strategy", "bestfit"]
    assert cli.main(["plan", *common, "--tp", "2", "--sequence-parallel", "-o", str(tmp_path / "p.json")]) == 0
    assert planner.Plan.from_json(str(tmp_path / "p.json")).training["sequence_parallel"]["reduce_scatters"] == 4
    assert cli.main(["report", *common, "--sequence-parallel"]) == 2
    assert "--sequence-parallel shards the sequence among the ranks of --tp N" in capsys.readouterr().err
