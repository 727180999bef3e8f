"""The README's op-coverage table is the one the registries give today."""
from pathlib import Path

from executor import coverage


def test_readme_table_is_current():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert coverage.BEGIN in readme and coverage.END in readme, "README.md lacks the op-coverage markers"
    assert coverage.spliced(readme) == readme, "regenerate it: python -m executor.coverage README.md"


def test_every_op_runs_or_is_inlined():
    assert all(runs != "no" for _, _, runs, _ in coverage.rows())
