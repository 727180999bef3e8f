"""MXNet's dynamic pools replayed on a plan's schedule, the keep-everything estimate, and both in the report."""
import pytest

import planner
from planner import Config, ConfigError, Plan, PlannedTensor, pools
from planner.report import report
from zoo_cases import input_shapes, small_model

KiB, MiB = 1 << 10, 1 << 20
CONFIG = Config.from_env({}, time_limit=1.0)


def transient(*buffers, persistent=0):
    """A plan of activations (nbytes, first step, last step) each in its own buffer, over `persistent` bytes."""
    tensors = {f"t{k}": PlannedTensor(f"t{k}", (n,), "uint8", "activation", n, 0, (first, last))
               for k, (n, first, last) in enumerate(buffers)}
    return Plan("bestfit", "file", 0, 0, {}, tensors, (), (), (), stats={"persistent_bytes": persistent})


def test_naive_reuses_a_freed_block_of_the_same_size():
    # a chain of four 10000-byte activations, each read by the next step: two 12 KiB blocks take turns
    chain = transient(*((10000, k, k + 1) for k in range(4)), persistent=256)
    run = pools.simulate(chain, "naive", CONFIG)
    assert run == pools.PoolRun("naive", 2 * 12 * KiB + 256, 2 * 12 * KiB + 256, 2)


def test_naive_needs_the_exact_size_and_round_shares_a_power_of_two():
    # 16 KiB, then 9000 bytes: Naive caches the 16 KiB block but cannot hand it out for a 12 KiB request;
    # Round serves both from one 16 KiB block
    plan = transient((16 * KiB, 0, 0), (9000, 1, 1))
    assert pools.simulate(plan, "naive", CONFIG) == pools.PoolRun("naive", 28 * KiB, 16 * KiB, 2)
    assert pools.simulate(plan, "round", CONFIG) == pools.PoolRun("round", 16 * KiB, 16 * KiB, 1)


@pytest.mark.parametrize("nbytes, naive, rounded", [
    (1, 4 * KiB, 4 * KiB),
    (4 * KiB + 1, 8 * KiB, 8 * KiB),
    (40 * KiB, 40 * KiB, 64 * KiB),
    (2 * MiB, 2 * MiB, 2 * MiB),
    (2 * MiB + 1, 4 * MiB, 4 * MiB),
    (5 * MiB, 6 * MiB, 8 * MiB),
    (16 * MiB, 16 * MiB, 16 * MiB),
    (16 * MiB + 1, 18 * MiB, 32 * MiB),
    (40 * MiB, 40 * MiB, 48 * MiB),
])
def test_block_sizes_follow_mxnet(nbytes, naive, rounded):
    assert pools.naive_block(nbytes, CONFIG) == naive
    assert pools.round_block(nbytes, CONFIG) == rounded


def test_pool_settings_come_from_mxnet_variables():
    config = Config.from_env({"MXNET_GPU_MEM_POOL_TYPE": "Round", "MXNET_GPU_MEM_POOL_PAGE_SIZE": "1024",
                              "MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE": str(MiB),
                              "MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF": "20"})
    assert pools.simulate(transient((1, 0, 0)), config=config).pool == "round"
    assert pools.round_block(1, config) == KiB and pools.round_block(3 * MiB - 1, config) == 3 * MiB
    assert pools.naive_block(MiB + 1, config) == 2 * MiB


@pytest.mark.parametrize("env, message", [
    ({"MXNET_GPU_MEM_POOL_TYPE": "Unpooled"}, "pool_type.*Naive"),
    ({"MXNET_GPU_MEM_POOL_PAGE_SIZE": "3000"}, "pool_page_size.*power of two"),
    ({"MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF": "40"}, "pool_round_linear_cutoff.*20, 34"),
    ({"MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE": "2MiB"}, "MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE='2MiB'"),
])
def test_bad_pool_settings(env, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_env(env)


@pytest.mark.parametrize("case, training", [("resnet18", False), ("bert_base", False), ("mobilenet_v2", True),
                                            ("gpt2_small", True)])
def test_the_bestfit_arena_never_needs_more_than_a_pool(case, training):
    model = small_model(case)
    plan = planner.compile(model, input_shapes(model, 3), training=training, config=CONFIG)
    for pool in pools.POOLS:
        run = pools.simulate(plan, pool, CONFIG)
        assert run.reserved_bytes >= run.in_use_bytes >= plan.lower_bound_bytes
        assert run.reserved_bytes >= plan.arena_bytes
    naive = planner.compile(model, input_shapes(model, 3), training=training, strategy="naive", config=CONFIG)
    assert naive.arena_bytes >= plan.arena_bytes


def test_the_report_lists_the_baselines():
    model = small_model("mlp")
    graph = planner.load(model, input_shapes(model, 4))
    result = report(graph, CONFIG, strategies=["bestfit"])
    baselines = result.as_dict()["baselines"]
    assert baselines["naive"]["reserved_bytes"] >= result.plan("bestfit").arena_bytes
    assert baselines["round"]["pool"] == "round"
    table = result.table().splitlines()
    line = next(t for t in table if t.startswith("dynamic pools"))
    assert line.startswith("dynamic pools on the same schedule: Naive ") and "against Naive" in line
