"""The memplan command line: each command on a small model, and user mistakes as one line, exit 2."""
import json

import pytest

from planner import Plan, cli

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
    for row in ("naive", "inplace", "share ", "share (auto search)", "bestfit", "optimal", "LOAD (lower bound)"):
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


def test_run_on_numpy(capsys):
    assert cli.main(["run", *MLP, "--backend", "numpy", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "bestfit on numpy: median" in out and "arena" in out and "RSS grew" in out


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
