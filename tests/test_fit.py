"""planner.fit.search in worker processes: the same rows as one process, each layout's progress reported, a
layout that cannot be planned left out with a note (every one failing raised in the caller), a worker that
dies named."""
import os
from types import SimpleNamespace

import pytest

import planner
from planner import fit
from planner.errors import InfeasibleBudgetError, MemplanError

MEMORY = 8 << 20


def compile_at(batch, **options):
    return planner.compile("zoo:mlp", {"input": (batch, 784)}, training=True, optimizer="adam", **options)


def test_workers_find_what_one_process_finds():
    seen = []
    alone, notes = fit.search(compile_at, MEMORY, fit.candidates(2))
    shared = fit.search(compile_at, MEMORY, fit.candidates(2), lambda label, batch: seen.append(label), workers=2)
    assert shared == (alone, notes) and len(alone) == 8 and notes == []
    assert {label for label, _ in fit.candidates(2)} == set(seen)
    assert all(arena <= MEMORY for _, batch, _, arena, _ in alone if batch)
    assert all(cost["flops"] > 0 and cost["sent_bytes"] > 0 for *_, cost in alone if cost)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_layout_that_cannot_be_planned_is_left_out_with_a_note(workers):
    """A layout whose plan fails (a MemplanError other than no fit) drops its row, never the whole table;
    when every layout fails, the first one's error is raised in the caller."""
    def refusing(batch, **options):
        if options["parallel"].zero == 3:
            raise MemplanError("no ZeRO-3 here")
        return compile_at(batch, **options)
    rows, notes = fit.search(refusing, MEMORY, fit.candidates(2), workers=workers)
    assert [label for label, *_ in rows if "ZeRO-3" in label] == [] and len(rows) == 6
    assert notes == ["left out dp 2, ZeRO-3; dp 2, ZeRO-3, sublinear: no ZeRO-3 here"]

    def failing(batch, **options):
        raise MemplanError(f"no ZeRO-{options['parallel'].zero} here")
    with pytest.raises(MemplanError, match="no layout could be planned: no ZeRO-0 here"):
        fit.search(failing, MEMORY, fit.candidates(2), workers=workers)


def test_a_worker_that_dies_is_named():
    def dying(batch, **options):
        if options["remat"]:
            os._exit(3)
        return compile_at(batch, **options)
    with pytest.raises(MemplanError, match=r"a fit worker process died \(exit code 3\)"):
        fit.search(dying, MEMORY, fit.candidates(2), workers=2)


def test_a_layout_that_fits_no_batch_gets_zero():
    def nothing_fits(batch, **options):
        raise InfeasibleBudgetError(MEMORY, MEMORY + 1)
    rows, _ = fit.search(nothing_fits, MEMORY, fit.candidates(2), workers=2)
    assert {row[1:] for row in rows} == {(0, 0, None, None)}


def test_a_plan_whose_load_is_over_the_memory_is_not_placed():
    """A rank plan that its LOAD alone rules out is not placed (compile's arena_limit): the row says the least its
    arena can be (fit.AtLeast), at most the arena planned in full, and the command marks it '>='."""
    memory = 300_000
    rows, _ = fit.search(compile_at, memory, fit.candidates(2))
    assert all(batch == 0 and isinstance(arena, fit.AtLeast) for _, batch, _, arena, _ in rows)
    for label, options in fit.candidates(2):
        (arena,) = [a for row_label, _, _, a, _ in rows if row_label == label]
        assert memory < arena <= compile_at(1, **options).arena_bytes
    with pytest.raises(planner.AboveLimitError, match="its LOAD"):
        compile_at(1, arena_limit=memory)

    from planner import cli
    out = cli_output(cli, ["fit", "zoo:mlp", "--batch", "4", "--gpus", "2", "--memory", "3MB", "--workers", "1"])
    assert ">= " in out and "'>=' the least any placement" in out


def cli_output(cli, argv):
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert cli.main(argv) == 0
    return out.getvalue()


def test_an_error_that_does_not_cross_processes_still_says_what_it_was():
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(f"{a} and {b}")

    def odd(batch, **options):
        raise Odd(1, 2)
    with pytest.raises(MemplanError, match="Odd: 1 and 2"):
        fit.search(odd, MEMORY, fit.candidates(2), workers=2)


def test_each_layout_takes_the_rules_that_apply_to_its_stage():
    """Shards from ZeRO-1 on, gathers ahead at ZeRO-3, gradient buckets at every stage: a rule given for the
    search reaches each layout it applies to and no other (Parallel refuses it elsewhere)."""
    layouts = fit.candidates(4, shard="dim0", prefetch=2, bucket_bytes=1 << 20, tps=(2, 4), pps=(2,))
    assert {(o["parallel"].tp, o["parallel"].pp, o["parallel"].dp) for _, o in layouts} >= {(2, 1, 2), (4, 1, 1),
                                                                                           (1, 2, 2)}
    for _, options in layouts:
        p = options["parallel"]
        assert p.shard == ("dim0" if p.zero else "flat") and p.prefetch == (2 if p.zero == 3 else 0)
        assert p.bucket_bytes == (1 << 20 if p.dp > 1 else 0)
        assert p.microbatches == (2 * p.pp if p.pp > 1 else 1)


def test_a_pipeline_plans_the_stage_that_was_fullest_first():
    """The last stage is the fullest here: after a layout's first batch it is planned first, and a batch too
    large is told by it alone."""
    calls = []

    def staged(batch, parallel, remat, arena_limit):
        if parallel.pp > 1:
            calls.append((remat, batch, parallel.stage))
        return SimpleNamespace(arena_bytes=batch * (2 if parallel.stage == parallel.pp - 1 else 1) * 1000, training={},
                               stats={}, host_arena_bytes=0)

    rows = {label: batch for label, batch, *_ in fit.search(staged, 100_000, fit.candidates(2, pps=(2,)))[0]}
    assert rows["dp 1 x pp 2, ZeRO-0, 4 microbatches"] == 50
    for remat in fit.REMATS:
        batches = list(dict.fromkeys(batch for r, batch, _ in calls if r == remat))
        stages = [[stage for r, b, stage in calls if (r, b) == (remat, batch)] for batch in batches]
        assert stages[0] == [0, 1] and all(s[0] == 1 for s in stages[1:])
        assert any(batch > 50 for batch in batches[1:])
        assert all(s == [1] for batch, s in zip(batches[1:], stages[1:]) if batch > 50)


def test_fit_draws_one_progress_line_for_the_whole_search(capfd, monkeypatch):
    """On a terminal, `fit` draws one line, rewritten in place, for every layout of both worker processes: the
    sublinear searches inside the workers show on it rather than draw lines of their own."""
    import sys

    from planner import cli
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(["fit", "zoo:mlp", "--batch", "4", "--gpus", "2", "--memory", "8MiB", "--workers", "2"]) == 0
    err = capfd.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert "\rmemplan fit, layouts: 16/16 [" in err and "(sublinear search " in err
    assert "memplan: sublinear search" not in err


@pytest.mark.parametrize("layout", [dict(dp=4), dict(dp=4, zero=1), dict(dp=4, zero=3), dict(dp=2, tp=2, zero=1),
                                    dict(dp=2, tp=2, zero=3), dict(tp=2, pp=2, microbatches=4),
                                    dict(dp=2, pp=2, zero=1, microbatches=4)])
def test_least_states_is_a_lower_bound_of_every_rank_plan(layout):
    """What `least_states` says a rank holds at least is at most the params and optimizer state the fullest stage's
    rank plan holds (and not far below: the bound prunes only layouts that cannot fit)."""
    import math

    from zoo_cases import input_shapes, small_model
    m = small_model("gpt2_small")
    graph = planner.load(m, input_shapes(m, 2))
    params = [(math.prod(t.shape), t.dtype.itemsize, t.name not in graph.buffers) for t in graph.params()]
    parallel = planner.Parallel(**layout)
    plans = planner.compile_stages(m, input_shapes(m, 2), training=True, optimizer="adam", parallel=parallel)
    held = max(p.breakdown["params"] + p.breakdown["optimizer"] for p in plans)
    assert 0.5 * held <= fit.least_states(params, 2)(parallel) <= held


def test_a_layout_whose_states_cannot_fit_is_not_planned():
    planned = []

    def counting(batch, **options):
        planned.append(options["parallel"].zero)
        return compile_at(batch, **options)
    rows, notes = fit.search(counting, MEMORY, fit.candidates(2), least=lambda p, offload=None: MEMORY + 1 if p.zero < 3 else 0)
    assert set(planned) == {3}
    assert {label: batch for label, batch, *_ in rows if "ZeRO-3" not in label} == \
        {label: 0 for label, _ in fit.candidates(2) if "ZeRO-3" not in label}
    assert notes == ["not planned, fitting no batch: 6 layout(s) whose params and optimizer state alone need more "
                     "than 8.00 MiB a rank (at least 8.00 MiB)"]


def test_a_transformer_gets_pipelines_of_tensor_parallel_ranks_and_megatrons_recomputation():
    layouts = fit.candidates(8, tps=(2, 4), pps=(2, 4, 8), remats=fit.LAYER_REMATS)
    shapes = {(o["parallel"].dp, o["parallel"].tp, o["parallel"].pp, o["parallel"].zero) for _, o in layouts}
    assert {(2, 2, 2, 1), (1, 2, 4, 0), (1, 4, 2, 0), (4, 2, 1, 3), (2, 4, 1, 3), (1, 1, 8, 0)} <= shapes
    assert {o["remat"] for _, o in layouts} == {None, "full"}


def test_a_model_parallel_size_whose_layouts_cannot_hold_the_states_is_not_probed():
    probed = []

    def probing(batch, parallel, remat):
        probed.append((parallel.tp, parallel.pp))
        return SimpleNamespace(arena_bytes=1, training={}, stats={})
    tps, pps, notes = fit.model_parallel_sizes(probing, 8, (2, 4, 8), (2, 4, 8), fits=lambda p: 8 in (p.tp, p.pp))
    assert (tps, pps) == ([8], [8]) and probed == [(8, 1), (1, 8)]
    assert notes == ["no tp 2, 4: no layout of it holds the params and optimizer state",
                     "no pp 2, 4: no layout of it holds the params and optimizer state"]


def test_a_layout_fitting_no_batch_shows_what_batch_1_needs():
    rows, _ = fit.search(compile_at, 4096, fit.candidates(2))
    assert rows and all(batch == 0 and arena > 4096 and cost is None for _, batch, _, arena, cost in rows)
    assert {arena for *_, arena, _ in rows} >= {compile_at(1, parallel=planner.Parallel(dp=2)).arena_bytes}
