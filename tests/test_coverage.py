"""docs/OPS.md's op-coverage table is the one the registries give today."""
from pathlib import Path

from executor import coverage


def test_ops_table_is_current():
    text = (Path(__file__).parent.parent / "docs" / "OPS.md").read_text()
    assert coverage.BEGIN in text and coverage.END in text, "docs/OPS.md lacks the op-coverage markers"
    assert coverage.spliced(text) == text, "regenerate it: python -m executor.coverage docs/OPS.md"


def test_every_op_runs_or_is_inlined():
    assert all(runs != "no" for _, _, runs, _ in coverage.rows())
