"""Optimizer offload (planner/passes/offload.py, ZeRO-Offload): the optimizer's state, master weights and update in
the host arena; a step trains as the plan that keeps them on the device (bit for bit where the master has the
param's type), alone and under every ZeRO stage, and the device holds the params alone of the model states."""
import math
import re
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

import planner
from executor import Executor
from executor.collectives import cut
from planner.errors import ConfigError, PlanError
from planner.units import format_bytes
from gloo import spawned
import parallel_cases
from test_data_parallel import BATCH, batches
from zoo_cases import feeds, input_shapes, small_model

STEPS = 2
LOW = {"fp16": "float16", "bf16": "bfloat16"}


def compiled(case, batch=4, **kw):
    m = small_model(case)
    return planner.compile(m, input_shapes(m, batch), training=True, optimizer=kw.pop("optimizer", "adam"), **kw)


def trained(plan, case, batch=4):
    ex = Executor(plan, backend="numpy", poison=True)
    data = dict(feeds(small_model(case), batch))
    labels = plan.tensors[plan.training["labels"]]
    data[plan.training["labels"]] = np.random.default_rng(0).integers(0, 4, labels.shape)
    return [ex.train_step(data) for _ in range(STEPS)], ex.parameters(), ex


@pytest.mark.parametrize("case, precision, optimizer", [("mlp", "fp32", "adam"), ("resnet18", "fp32", "momentum"),
                                                        ("gpt2_small", "amp-bf16", "adamw"),
                                                        ("mlp", "amp-fp16", "momentum"), ("bert_base", "fp32", "adam")])
def test_an_offloaded_step_trains_exactly_as_one_on_the_device(case, precision, optimizer):
    base = compiled(case, precision=precision, optimizer=optimizer)
    plan = compiled(case, precision=precision, optimizer=optimizer, offload="optimizer")
    assert plan.breakdown["optimizer"] <= 512 < base.breakdown["optimizer"]  # amp-fp16's loss scale stays
    assert plan.arena_bytes < base.arena_bytes and plan.host_arena_bytes >= plan.training["offload"]["host_bytes"]
    host = {s.name: s for s in plan.steps if all(plan.tensors[n].host for n in (*s.inputs, *s.outputs) if n)}
    assert {s.op for s in host.values()} >= {"Adam" if "adam" in optimizer else "SGD"}
    losses, params, _ = trained(plan, case)
    base_losses, base_params, _ = trained(base, case)
    assert losses == base_losses
    assert all(np.array_equal(params[k], base_params[k]) for k in base_params)


def test_amp_holds_a_param_read_through_one_cast_in_16_bits_alone():
    base = compiled("gpt2_small", precision="amp-fp16")
    plan = compiled("gpt2_small", precision="amp-fp16", offload="optimizer")
    low = plan.training["offload"]["low"]
    assert "transformer.h.0.mlp.c_fc.weight" in low and "transformer.wte.weight" not in low  # Gather reads fp32
    assert all(plan.tensors[p].dtype == "float16" and plan.tensors[p + "/master"].dtype == "float32" for p in low)
    assert not any(s.op == "Cast" and s.inputs[0] in low for s in plan.steps)
    assert plan.breakdown["params"] == base.breakdown["params"] - sum(plan.tensors[p].nbytes for p in low)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_16_bit_params_update_float32_master_weights_on_the_host(precision):
    """ZeRO-Offload's mixed precision: the device holds the 16-bit params alone, the host float32 masters and
    state; after each step the device's param is its master cast down."""
    plan = compiled("mlp", precision=precision, offload="optimizer")
    masters = plan.training["offload"]["masters"]
    assert all(plan.tensors[m].dtype == "float32" and plan.tensors[p].dtype == LOW[precision]
               for p, m in masters.items())
    losses, params, ex = trained(plan, "mlp")
    fp32_losses, _, _ = trained(compiled("mlp"), "mlp")
    np.testing.assert_allclose(losses, fp32_losses, rtol=2e-2)
    for name, master in params.items():
        assert master.dtype == np.float32
        assert np.array_equal(ex.arena.view(name), master.astype(ex.arena.view(name).dtype))


def test_the_device_holds_the_zero_offload_papers_model_states():
    """Ren et al. 2021: with mixed precision the device holds the 2-byte params (2M bytes for M values) and the
    host the 12M of float32 masters, momentum and variance; gradients leave as they are made."""
    plan = compiled("gpt2_small", precision="fp16", offload="optimizer")
    values = sum(math.prod(plan.tensors[p].shape) for p in plan.training["params"])
    assert sum(plan.tensors[p].nbytes for p in plan.training["params"]) == 2 * values
    assert not any(t.kind == "state" and not t.host for t in plan.tensors.values())
    assert plan.breakdown["optimizer"] == 0
    assert plan.training["offload"]["host_bytes"] == 12 * values
    assert plan.training["offload"]["link_bytes"] == 2 * values


def _rank(rank, port, results, model, parallel, offload, precision="fp32"):
    """One rank of a gloo group: STEPS of adam (an mlp) or momentum (a transformer) on its data rank's share."""
    import torch.distributed as dist
    world = parallel.dp * parallel.tp
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        if model == "mlp":
            plan = compiled("mlp", BATCH // parallel.dp, parallel=parallel, offload=offload, precision=precision)
            data = batches()
        else:
            plan = parallel_cases.compiled(model, parallel_cases.BATCH // parallel.dp, parallel, offload=offload)
            data = parallel_cases.batches(model)
        ex = Executor(plan, backend="numpy", poison=True)
        d, rows = rank // parallel.tp, len(data[0]["labels"]) // parallel.dp
        losses = [ex.train_step({k: v[d * rows:(d + 1) * rows] for k, v in f.items()}) for f in data]
        results.put((rank, losses, ex.parameters(), plan.breakdown["optimizer"], plan.host_arena_bytes))
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.parametrize("model, parallel, precision", [("mlp", planner.Parallel(dp=2, zero=0), "fp32"),
                                                        ("mlp", planner.Parallel(dp=2, zero=1), "amp-bf16"),
                                                        ("mlp", planner.Parallel(dp=2, zero=2, bucket_bytes=600), "fp32"),
                                                        ("mlp", planner.Parallel(dp=2, zero=2), "amp-fp16"),
                                                        ("mlp", planner.Parallel(dp=2, zero=3, shard="dim0"), "fp32"),
                                                        ("mlp", planner.Parallel(dp=2, zero=3), "amp-bf16"),
                                                        ("bert_base", planner.Parallel(dp=2, tp=2, zero=3), "fp32")])
def test_every_zero_stage_and_tensor_parallel_rank_offloads_and_trains_as_on_the_device(model, parallel, precision):
    world = parallel.dp * parallel.tp
    got = spawned(partial(_rank, model=model, parallel=parallel, offload="optimizer", precision=precision), world)
    base = spawned(partial(_rank, model=model, parallel=parallel, offload=None, precision=precision), world)
    for (rank, losses, params, device_state, host), (_, base_losses, base_params, base_state, _) in zip(got, base):
        assert losses == base_losses and device_state <= 512 < base_state and host > 0  # amp-fp16's scale stays
        for name, value in base_params.items():  # amp's 16-bit params give their masters: the rank's shard
            if params[name].shape != value.shape:
                value = cut(value.reshape(-1), rank // parallel.tp, np.empty_like(params[name]))
            assert np.array_equal(params[name], value), f"rank {rank}: {name}"


def test_offload_options_are_checked():
    with pytest.raises(PlanError, match="unknown offload 'params'"):
        compiled("mlp", offload="params")
    with pytest.raises(PlanError, match="apply to training=True"):
        planner.compile(small_model("mlp"), input_shapes(small_model("mlp"), 2), offload="optimizer")
    with pytest.raises(ConfigError, match="in place"):
        compiled("mlp", offload="optimizer", config=planner.Config(inplace_update=False))


def test_set_parameters_writes_the_master_weights_too():
    plan = compiled("mlp", precision="amp-bf16", offload="optimizer")
    ex = Executor(plan, backend="numpy")
    value = np.full(plan.tensors["layers.0.weight"].shape, 0.1, np.float32)
    ex.set_parameters({"layers.0.weight": value})
    assert np.array_equal(ex.parameters()["layers.0.weight"], value)
    assert np.array_equal(ex.arena.view("layers.0.weight"), value.astype(ex.arena.view("layers.0.weight").dtype))


def test_max_batch_and_fit_search_with_the_optimizer_offloaded(capsys):
    import json

    from planner import cli
    assert cli.main(["max-batch", "zoo:mlp", "--budget", "6MiB", "--training", "--optimizer", "adam", "--json"]) == 0
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["auto + offload"]["max_batch"] > rows["auto"]["max_batch"]  # adam's 2 states of the params left
    assert rows["auto + offload + swap"]["max_batch"] >= rows["auto + offload"]["max_batch"]
    assert cli.main(["fit", "zoo:mlp", "--batch", "4", "--gpus", "2", "--memory", "6MiB", "--optimizer", "adam",
                     "--workers", "1", "--json"]) == 0
    layouts = {r["layout"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for zero in range(4):
        offloaded, kept = layouts[f"dp 2, ZeRO-{zero}, offload"], layouts[f"dp 2, ZeRO-{zero}"]
        assert offloaded["batch_per_rank"] >= kept["batch_per_rank"] and offloaded["host_arena_bytes"] > 0
        assert not kept["host_arena_bytes"]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_the_timeline_draws_the_host_arena_under_the_device_one(tmp_path):
    from planner import viz
    plan = compiled("mlp", offload="optimizer")
    svg = Path(viz.timeline(plan, tmp_path / "t.svg")).read_text()
    assert "host arena " + format_bytes(plan.host_arena_bytes) in svg
    ys = {}
    for name in ("layers.0.weight", "layers.0.weight/master", "layers.0.weight/exp_avg"):
        box = re.search(rf'<g id="t:{re.escape(name)}".*?points="([^"]+)"', svg, re.S)
        ys[name] = max(float(p.split(",")[1]) for p in box.group(1).split())
    assert ys["layers.0.weight/master"] > ys["layers.0.weight"] and ys["layers.0.weight/exp_avg"] > ys["layers.0.weight"]


@pytest.mark.parametrize("remat", ["swap", "hybrid"])
def test_swapping_and_offloading_together_train_as_keeping_everything(remat):
    """The swap planner orders its copies on the offloaded plan's schedule, whose host updates no longer read the
    device's param: each update is put back after the param's readers before the copies are placed."""
    base = compiled("resnet_deep", optimizer="adam")
    plan = compiled("resnet_deep", optimizer="adam", offload="optimizer", remat=remat,
                    memory_budget=int(base.arena_bytes * 0.6))
    assert plan.arena_bytes <= base.arena_bytes * 0.6 and plan.training["offload"]["masters"]
    losses, params, _ = trained(plan, "resnet_deep")
    base_losses, base_params, _ = trained(base, "resnet_deep")
    assert losses == base_losses
    assert all(np.array_equal(params[k], base_params[k]) for k in base_params)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_an_offloaded_step_on_cupy_trains_like_numpy(precision):
    """On CuPy the host's steps run NumPy's kernels on the pinned host arena, after the device's copies into it."""
    plan = compiled("resnet_deep", precision=precision, offload="optimizer")
    ex = Executor(plan, backend="cupy")
    data = dict(feeds(small_model("resnet_deep"), 4))
    data[plan.training["labels"]] = np.random.default_rng(0).integers(0, 4, plan.tensors[plan.training["labels"]].shape)
    losses = [ex.train_step(data) for _ in range(STEPS)]
    numpy_losses, params, _ = trained(plan, "resnet_deep")
    np.testing.assert_allclose(losses, numpy_losses, rtol=1e-4)
    for name, value in ex.parameters().items():
        np.testing.assert_allclose(value, params[name], rtol=1e-3, atol=1e-5)


def test_the_host_updates_beside_a_gpu_and_in_its_time_on_the_host(tmp_path):
    """The time model runs an offloaded update on a lane of its own beside a GPU's compute, and in the compute's
    time where the device is the host's own cores (DeviceModel.on_host: the `cpu` model, a NumPy calibration)."""
    from dataclasses import replace

    from planner import timing
    from planner.errors import ConfigError
    replace(timing.PROFILES["cpu"], name="beside", on_host=False).to_json(tmp_path / "beside.json")
    times = {name: compiled("resnet18", offload="optimizer", config=planner.Config(device_model=name))
             .training["offload"]["time"] for name in ("cpu", str(tmp_path / "beside.json"))}
    on_host, beside = times["cpu"], times[str(tmp_path / "beside.json")]
    assert beside["seconds"] < on_host["seconds"] and beside["compute_seconds"] < on_host["compute_seconds"]
    with pytest.raises(ConfigError, match="on_host must be true or false"):
        replace(timing.PROFILES["cpu"], on_host=1)
    assert timing.PROFILES["cpu"].on_host and not timing.PROFILES["h100"].on_host
