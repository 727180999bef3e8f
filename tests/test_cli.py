"""The memplan command line: each command on a small model, and user mistakes as one line, exit 2."""
import json
import os
import sys
from types import SimpleNamespace

import pytest

import planner
from planner import Plan, cli
from planner.units import format_bytes
from executor import mkl

MLP = ["zoo:mlp", "--batch", "4"]


def test_inspect(capsys):
    assert cli.main(["inspect", *MLP]) == 0
    assert "output: (4, 10) float32" in capsys.readouterr().out


def test_report_keeps_the_rows_asked_for(capsys):
    assert cli.main(["report", *MLP, "--strategy", "share", "--json"]) == 0
    rows = [r["strategy"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert rows == ["naive", "share", "share (auto search)", "bestfit"]


def test_report_table_and_json(capsys):
    assert cli.main(["report", *MLP, "--time-limit", "1"]) == 0
    table = capsys.readouterr().out
    for row in ("naive", "inplace", "share ", "share (auto search)", "bestfit", "auto", "optimal",
                "LOAD (lower bound)"):
        assert row in table
    assert cli.main(["report", *MLP, "--time-limit", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in doc["rows"]][0] == "naive"
    assert all(r["arena_bytes"] >= doc["lower_bound_bytes"] for r in doc["rows"])


def test_plan_writes_a_verified_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *MLP, "--strategy", "share", "-o", str(out)]) == 0
    plan = Plan.from_json(out).verify()
    assert plan.strategy == "share" and plan.data


@pytest.mark.parametrize("argv, message", [
    (["report", "missing.onnx"], "missing.onnx"),
    (["report", "zoo:mlp", "--input", "input:4by8"], "NAME:DIMS"),
    (["plan", "zoo:nope", "-o", "x.json"], "nope"),
])
def test_user_errors_are_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_run_on_numpy(capsys, monkeypatch):
    monkeypatch.setattr(mkl, "available", lambda: False)
    assert cli.main(["run", *MLP, "--backend", "numpy", "--repeat", "2", "--no-jit"]) == 0
    out = capsys.readouterr().out
    assert "auto on numpy: median" in out and "arena" in out and "RSS grew" in out


@pytest.mark.parametrize("backend, device", [("numpy", "any"), ("cupy", "cuda")])
def test_run_plans_for_the_device_of_its_backend(monkeypatch, backend, device):
    """On the cupy backend `run` plans for CUDA, without the rewrites made for the CPU's kernels (mobilenet_v2's
    InvertedResidual walks row tiles from the host)."""
    from executor import backends

    class Planned(Exception):
        pass

    def planned(args, graph, device="any"):
        raise Planned(device)
    monkeypatch.setattr(backends, "get", lambda name: SimpleNamespace(NAME=name))
    monkeypatch.setattr(cli, "compile_args", planned)
    with pytest.raises(Planned, match=f"^{device}$"):
        cli.main(["run", *MLP, "--backend", backend])


def test_run_says_when_the_compiled_kernels_and_mkl_run(capsys):
    pytest.importorskip("numba")
    assert cli.main(["run", *MLP, "--backend", "numpy", "--repeat", "2"]) == 0
    engine = "compiled kernels and MKL's GEMMs" if mkl.available() else "compiled kernels"
    assert f"auto on numpy with {engine}: median" in capsys.readouterr().out


def test_run_profile_lists_time_per_op_type_and_the_slowest_steps(capsys):
    """Every timed step is in the per-type rows; the slowest steps come in falling order."""
    assert cli.main(["run", "zoo:lenet", "--batch", "2", "--backend", "numpy", "--repeat", "2", "--profile",
                     "--top", "3"]) == 0
    out = capsys.readouterr().out
    per_type, slowest = out.split("the 3 slowest steps:")
    counts = [int(line.split()[1]) for line in per_type.splitlines() if line.split()[:1] in (["Conv"], ["Gemm"], ["Relu"])]
    plan = planner.compile("zoo:lenet", {"input": (2, 1, 28, 28)})
    assert sum(counts) == sum(s.op in ("Conv", "Gemm", "Relu") for s in plan.steps)
    ms = [float(line.split()[2]) for line in slowest.strip().splitlines()[1:]]
    assert len(ms) == 3 and ms == sorted(ms, reverse=True)


def test_a_profiling_executor_times_each_kernel_once_per_run():
    from executor import Executor, random_feeds
    plan = planner.compile("zoo:mlp", {"input": (4, 784)})
    ex = Executor(plan, backend="numpy", profile=True)
    for _ in range(3):
        ex.run(random_feeds(plan))
    assert {len(times) for times in ex.profile.seconds.values()} == {3}
    assert set(ex.profile.per_step()) == {k for k, bound in enumerate(ex.program) if bound is not None}
    assert Executor(plan, backend="numpy").profile is None


def memplan(*argv, cwd=None):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_every_command_end_to_end_in_a_subprocess(tmp_path):
    import csv
    lenet = ["zoo:lenet", "--batch", "4"]
    done = memplan("report", *lenet, "--time-limit", "0.5", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["model"] and {r["strategy"] for r in doc["rows"]} >= {"naive", "bestfit", "optimal"}
    done = memplan("report", *lenet, "--time-limit", "0.5", "--csv", "-o", str(tmp_path / "r.csv"))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert [r["strategy"] for r in rows] == [r["strategy"] for r in doc["rows"]]
    assert memplan("plan", *lenet, "--training", "--optimizer", "adam", "-o", str(tmp_path / "p.json")).returncode == 0
    assert Plan.from_json(tmp_path / "p.json").verify().training
    done = memplan("run", *lenet, "--backend", "numpy", "--repeat", "1")
    assert done.returncode == 0 and "median" in done.stdout, done.stderr
    done = memplan("inspect", *lenet)
    assert done.returncode == 0 and "largest activations" in done.stdout


@pytest.mark.parametrize("argv, message", [
    (["report", "zoo:mlp", "--frobnicate"], "unrecognized arguments"),
    (["report", "zoo:mlp", "--strategy", "fastest"], "invalid choice: 'fastest'"),
    (["plan", "zoo:mlp", "--strategy", "magic", "-o", "p.json"], "invalid choice: 'magic'"),
    (["report", "zoo:mlp", "--json", "--csv"], "not allowed with"),
    (["report", "zoo:mlp", "--batch", "2", "--training", "--budget", "2 furlongs"], "--budget '2 furlongs'"),
    (["run", "zoo:mlp", "--batch", "two"], "invalid int value"),
    ([], "the following arguments are required"),
])
def test_mistakes_print_one_line_and_exit_2(argv, message, tmp_path):
    done = memplan(*argv, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def block_ortools(monkeypatch):
    """Make OR-Tools unimportable, as on a machine with only `pip install memplan`."""
    for name in ("ortools", "ortools.sat", "ortools.sat.python", "ortools.sat.python.cp_model"):
        monkeypatch.setitem(sys.modules, name, None)


def test_report_without_or_tools_keeps_the_optimal_rows(monkeypatch, capsys):
    """The exact search needs no OR-Tools (CP-SAT is its second opinion), so a plain install has every row."""
    block_ortools(monkeypatch)
    assert cli.main(["report", *MLP]) == 0
    out = capsys.readouterr().out
    assert "\noptimal " in out and "bestfit " in out and "note:" not in out
    assert cli.main(["report", *MLP, "--training", "--budget", "4MiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["strategy"] for r in doc["rows"]][-1] == "optimal" and doc["notes"] == []


def test_viz_without_graphviz_programs_says_how_to_install_them(monkeypatch, capsys, tmp_path):
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert cli.main(["viz", *MLP, "-o", str(tmp_path / "t.svg")]) == 2
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "brew install graphviz" in err and err.count("\n") == 1


def test_sizes_scale_their_unit(capsys):
    assert cli.main(["report", "zoo:mlp", "--batch", "1", "--strategy", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert " KiB" in out and "0.00 MiB" not in out
    assert "LOAD is the least memory any placement of these buffers needs" in out


def test_report_csv_has_flat_columns(tmp_path):
    assert cli.main(["report", *MLP, "--strategy", "bestfit", "--training", "--csv", "-o", str(tmp_path / "r.csv")]) == 0
    import csv
    rows = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert {"strategy", "arena_bytes", "params_bytes", "saved_bytes", "free_bytes"} <= set(rows[0])
    assert all("{" not in value for row in rows for value in row.values())
    assert int(rows[0]["arena_bytes"]) == sum(int(v) for k, v in rows[0].items() if k.endswith("_bytes")
                                              and k != "arena_bytes")


def test_workspace_mode_flag(capsys, tmp_path):
    assert cli.main(["plan", *MLP, "--workspace-mode", "tensor", "-o", str(tmp_path / "p.json")]) == 0
    assert Plan.from_json(tmp_path / "p.json").stats["workspace"]["mode"] == "tensor"
    assert cli.main(["report", "zoo:lenet", "--batch", "8", "--strategy", "bestfit", "--workspace-mode", "tensor",
                     "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{"):])
    assert doc["rows"][-1]["arena_bytes"] == doc["workspace_modes"]["tensor"]["arena_bytes"]


def test_run_names_the_model_and_prints_the_loss_per_step(capsys):
    assert cli.main(["run", *MLP, "--backend", "numpy", "--repeat", "2", "--training"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("zoo:mlp: input (4, 784) float32") and "training step with sgd" in out[0]
    assert [line.split(":")[0] for line in out[1:4]] == ["step 1 (warm-up)", "step 2", "step 3"]
    assert "loss" in out[1] and "median" in out[-1]


def test_batch_that_binds_nothing_is_a_warning(capsys):
    assert cli.main(["inspect", "zoo:mlp", "--input", "input:2x784", "--batch", "8"]) == 0
    assert "warning: --batch 8 binds no input" in capsys.readouterr().err


def test_messages_speak_the_cli_language(capsys, tmp_path):
    assert cli.main(["plan", *MLP, "--training", "--remat", "budget", "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "--budget SIZE goes with --remat budget" in err and "memory_budget=" not in err
    with pytest.raises(planner.PlanError, match="memory_budget= goes with remat='budget'"):
        planner.compile("zoo:mlp", {"input": (4, 784)}, training=True, remat="budget")


UNWRITABLE = "/sys/kernel/notes"
"""A file even root cannot write."""


@pytest.mark.parametrize("argv, message", [
    (["plan", *MLP, "-o", "missing/plan.json"], "does not exist"),
    (["plan", *MLP, "-o", "."], "is a directory"),
    (["report", *MLP, "-o", "nowhere/r.txt"], "does not exist"),
    (["viz", *MLP, "-o", "nowhere/t.svg"], "does not exist"),
    (["viz", *MLP, "--graph", "."], "is a directory"),
    (["max-batch", *MLP, "--budget", "1MiB", "-o", "."], "is a directory"),
    (["max-batch", "zoo:mlp"], "max-batch needs the memory to fit: --budget SIZE"),
    (["run", *MLP, "--repeat", "0"], "0 is below 1"),
    (["run", *MLP, "--batch", "0"], "0 is below 1"),
    (["report", *MLP, "--time-limit", "-1"], "not a positive number of seconds"),
    (["inspect", "zoo:mlp", "--input", "input:2x784", "--input", "input:4x784"], "--input input is given twice"),
])
def test_more_mistakes_print_one_line_and_exit_2(argv, message, tmp_path):
    done = memplan(*argv, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.skipif(not os.path.exists(UNWRITABLE), reason="needs Linux sysfs")
@pytest.mark.parametrize("command", ["plan", "report"])
def test_an_unwritable_output_is_one_line(command, capsys):
    assert cli.main([command, *MLP, "--strategy", "bestfit", "-o", UNWRITABLE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memplan: error: -o {UNWRITABLE}") and err.count("\n") == 1


def test_training_choices_reach_the_plan(tmp_path, capsys):
    out = str(tmp_path / "p.json")
    assert cli.main(["plan", *MLP, "--training", "--class-axis", "-1", "--ignore-index", "none", "--frozen",
                     "layers.0.weight", "--frozen", "layers.0.bias", "--trainable", "layers.1.bias", "-o", out]) == 0
    training = Plan.from_json(out).training
    assert training["criterion"]["class_axis"] == 1 and training["criterion"]["rule"] == "given as class_axis"
    assert training["criterion"]["ignore_index"] is None
    assert training["constants"] == {"layers.0.weight": "frozen", "layers.0.bias": "frozen"}
    assert cli.main(["plan", *MLP, "--training", "--ignore-index", "3", "-o", out]) == 0
    assert Plan.from_json(out).training["criterion"]["ignore_index"] == 3
    assert cli.main(["report", *MLP, "--training", "--strategy", "bestfit", "--frozen", "layers.2.bias"]) == 0
    table = capsys.readouterr().out
    assert "initializers stay constants: 1 frozen (layers.2.bias)" in table and ", --ignore-index -100" in table


@pytest.mark.parametrize("argv, message", [
    (["--training", "--class-axis", "2"], "memplan: error: --class-axis 2 is not a dim of the logits 'output'"),
    (["--training", "--class-axis", "1", "--loss", "mse"], "memplan: error: --class-axis and --ignore-index apply to --loss cross_entropy"),
    (["--training", "--trainable", "layers.0.bias", "--frozen", "layers.0.bias"], "named both trainable and frozen"),
    (["--training", "--trainable", "nope"], "memplan: error: trainable names 'nope', which are not params"),
    (["--class-axis", "1"], "memplan: error: --loss, --optimizer, --lr, --remat, --offload, --budget, --trainable, --frozen, "
                            "--class-axis, --ignore-index, --dp, --zero, --pp, --microbatches, --stage, --shard, "
                            "--prefetch, --bucket, --sync-batchnorm and --sequence-parallel apply with --training"),
    (["--training", "--ignore-index", "x"], "argument --ignore-index: invalid value: 'x'; give an int or none"),
    (["--training", "--class-axis", "last"], "argument --class-axis: invalid int value: 'last'"),
])
def test_bad_training_choices_print_one_line_and_exit_2(argv, message, tmp_path):
    done = memplan("plan", *MLP, *argv, "-o", str(tmp_path / "p.json"), cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_report_puts_the_precisions_side_by_side(capsys):
    assert cli.main(["report", "zoo:lenet", "--batch", "8", "--strategy", "bestfit", "--precision", "all", "--json"]) == 0
    rows = {r["precision"]: r for r in json.loads(capsys.readouterr().out)["precisions"]}
    assert list(rows) == ["fp32", "fp16", "bf16", "amp-fp16", "amp-bf16"]
    assert rows["fp16"]["x_fp32"] < 0.55 and rows["bf16"]["arena_bytes"] == rows["fp16"]["arena_bytes"]
    assert cli.main(["report", "zoo:lenet", "--batch", "8", "--strategy", "bestfit", "--precision", "all"]) == 0
    assert "amp-bf16" in capsys.readouterr().out


def test_precision_reaches_every_command(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *MLP, "--precision", "bf16", "-o", str(out)]) == 0
    assert Plan.from_json(out).stats["precision"] == "bf16"
    assert cli.main(["run", "zoo:lenet", "--batch", "2", "--precision", "amp-bf16", "--training", "--repeat", "1"]) == 0
    assert cli.main(["max-batch", *MLP[:1], "--budget", "1MiB", "--precision", "fp16", "--json"]) == 0
    assert cli.main(["plan", *MLP, "--precision", "all", "-o", str(out)]) == 2
    assert "--precision all applies to report" in capsys.readouterr().err


def test_gpt2_small_training_step_report_and_max_batch(capsys):
    """The full-size zoo GPT-2 at sequence 16: report --training plans a language model's step (classes on
    the last dim of the logits); max-batch --training finds a batch whose step fits while one more does not."""
    gpt2 = ["zoo:gpt2_small", "--input", "input_ids:1x16", "--training"]
    assert cli.main(["report", *gpt2, "--strategy", "bestfit", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["criterion"]["class_axis"] == 2 and doc["trained_params"] == 149
    budget = dict((r["strategy"], r["arena_bytes"]) for r in doc["rows"])["bestfit"] + 16 * 2 ** 20
    assert cli.main(["max-batch", *gpt2, "--budget", str(budget), "--strategy", "bestfit", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]

    def arena(batch):
        return planner.compile("zoo:gpt2_small", {"input_ids": (batch, 16)}, training=True).arena_bytes
    assert row["strategy"] == "bestfit" and row["max_batch"] >= 2
    assert arena(row["max_batch"]) == row["arena_bytes"] <= budget < arena(row["max_batch"] + 1)


@pytest.mark.parametrize("argv, message", [
    (["max-batch", "zoo:mlp", "--budget", "16"], "--budget '16': a number without a unit counts bytes; give a unit "
                                                 "(B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB), e.g. 16GiB, or 16B"),
    (["fit", "zoo:mlp", "--gpus", "2", "--memory", "80"], "--memory '80': a number without a unit counts bytes"),
    (["report", *MLP, "--training", "--dp", "2", "--bucket", "0.5"], "--bucket '0.5': a number without a unit"),
])
def test_a_size_without_a_unit_below_1_kib_is_refused_naming_the_units(argv, message, capsys):
    from planner.units import parse_bytes
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert [parse_bytes(t) for t in ("16B", "1024", "0", "2KiB", "1.5 KB")] == [16, 1024, 0, 2048, 1500]


def test_batch_binds_the_first_dim_and_names_what_is_left(tmp_path, capsys):
    """--batch on an input of shape (batch, seq) binds batch, and the error names seq and the --input to give;
    max-batch without --input names the input and its shape; a misspelled --input lists the model's inputs."""
    import onnx
    from zoo_cases import small_model
    gpt2 = str(tmp_path / "gpt2.onnx")
    onnx.save(small_model("gpt2_small"), gpt2)
    assert cli.main(["inspect", gpt2, "--batch", "2"]) == 2
    assert capsys.readouterr().err == ("memplan: error: --batch 2 binds the first dim of input input_ids (batch, seq), "
                                       "but dim 'seq' stays unbound: give its whole shape with --input "
                                       "input_ids:2x128\n")
    assert cli.main(["max-batch", gpt2, "--budget", "1GiB"]) == 2
    assert "max-batch varies the first dim of input input_ids (batch, seq), but dim 'seq' stays unbound: give the " \
           "other dims with --input input_ids:1x128" in capsys.readouterr().err
    assert cli.main(["inspect", "zoo:mlp", "--input", "inptu:2x784"]) == 2
    assert "the model has no input 'inptu'; its inputs are input (batch, 784)" in capsys.readouterr().err
    assert cli.main(["inspect", gpt2, "--batch", "2", "--input", "input_ids:2x16"]) == 0


def test_each_command_shows_its_own_examples_and_a_misspelled_flag_gets_a_suggestion(capsys):
    from planner.cli_parser import EXAMPLES
    commands = cli.build_parser().commands
    assert set(commands) == set(EXAMPLES)
    for name, parser in commands.items():
        text = parser.format_help()
        assert all(line in text for line in EXAMPLES[name]), name
        assert not any(line in text for other, lines in EXAMPLES.items() if other != name for line in lines), name
    assert all(lines[0] in cli.build_parser().format_help() for lines in EXAMPLES.values())
    with pytest.raises(SystemExit):
        cli.main(["report", *MLP, "--budgt", "1GiB"])
    assert capsys.readouterr().err == ("memplan report: error: unrecognized arguments: --budgt 1GiB; did you mean "
                                       "--budget? (see memplan report --help)\n")
    with pytest.raises(SystemExit):
        cli.main(["max-batch", *MLP, "--budget", "1MiB", "--stratgy=bestfit"])
    assert "did you mean --strategy?" in capsys.readouterr().err


def test_the_time_limit_default_is_the_configs_in_help_and_readme():
    """One default for the optimal searches' seconds: Config.time_limit (MEMPLAN_TIME_LIMIT), which report's
    --time-limit help, the README and the settings table of docs/USAGE.md all state."""
    import re
    from pathlib import Path

    from planner.config import Config
    help_text = " ".join(cli.build_parser().commands["report"].format_help().split())
    assert f"(default MEMPLAN_TIME_LIMIT or {Config.time_limit:g})" in help_text
    root = Path(__file__).parent.parent
    for doc in ("README.md", "docs/USAGE.md"):
        text = (root / doc).read_text()
        stated = re.findall(r"time.limit`?[^|\n]*?(?:default[^|\n]*?| \| `MEMPLAN_TIME_LIMIT` \| )(\d+(?:\.\d+)?)", text)
        assert stated and {float(n) for n in stated} == {Config.time_limit}, (doc, stated)


def test_plan_names_the_values_it_writes_beside_the_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", *MLP, "-o", str(out)]) == 0
    first, second = capsys.readouterr().out.splitlines()
    size = (tmp_path / "plan.npz").stat().st_size
    assert first.startswith(f"{out}: ") and second.startswith(f"{tmp_path / 'plan.npz'}: the params' and consts' "
                                                               f"values, {format_bytes(size)}")


def test_the_remat_table_says_what_saved_counts(capsys):
    assert cli.main(["report", "zoo:lenet", "--batch", "8", "--training", "--strategy", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert "saved at peak  saved, most" in out
    assert "saved at peak: the forward values kept for the backward pass that the arena holds at its fullest " \
           "step" in out
    assert cli.main(["report", "zoo:lenet", "--batch", "8", "--training", "--strategy", "bestfit", "--json"]) == 0
    rows = {r["remat"]: r for r in json.loads(capsys.readouterr().out)["remat"]}
    assert rows["mirror"]["saved_bytes"] == 0 < rows["mirror"]["saved_most_bytes"]
    assert all(r["saved_most_bytes"] >= r["saved_bytes"] for r in rows.values())


def test_a_report_row_that_fails_is_left_out_with_a_note(monkeypatch, capsys):
    """A strategy or recomputation whose planning fails drops its row, with a note, never the whole table; the
    rows the others are measured against (naive, bestfit, no recomputation) still raise."""
    from planner import compiler
    from planner.errors import ConfigError
    real = compiler.compile

    def failing(graph, *args, **options):
        if options.get("strategy") == "share" or options.get("remat") == "mirror":
            raise ConfigError("not this one")
        return real(graph, *args, **options)
    monkeypatch.setattr(compiler, "compile", failing)
    assert cli.main(["report", *MLP, "--training", "--strategy", "share", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert "note: row 'share' left out: not this one" in out and "note: row 'remat mirror' left out" in out
    assert "\nbestfit " in out and "\nsublinear " in out and "\nshare " not in out
    monkeypatch.setattr(compiler, "compile", lambda graph, *a, **o: (_ for _ in ()).throw(ConfigError("never")))
    assert cli.main(["report", *MLP, "--strategy", "bestfit"]) == 2
