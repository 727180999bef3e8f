"""The README's op-coverage table is the one the registries give today."""
from pathlib import Path

from executor import coverage

BEGIN, END = "<!-- op coverage: python -m executor.coverage -->\n", "<!-- end of op coverage -->\n"


def test_readme_table_is_current():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert BEGIN in readme and END in readme, "README.md lacks the op-coverage markers"
    shown = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    assert shown == coverage.markdown(), "regenerate it: python -m executor.coverage"


def test_every_op_runs_or_is_inlined():
    assert all(runs != "no" for _, _, runs, _ in coverage.rows())
