"""The memplan command line: each command on a small model, and user mistakes as one line, exit 2."""
import json

import pytest

from planner import Plan, cli

MLP = ["zoo:mlp", "--batch", "4"]


def test_inspect(capsys):
    assert cli.main(["inspect", *MLP]) == 0
    assert "output: (4, 10) float32" in capsys.readouterr().out


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
