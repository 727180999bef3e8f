"""The README and docs/ say what the code does today: every figure in the README is printed by a command shown
beside it, the Quick start is CI's, each doc's links lead somewhere, and the tables of settings, keywords,
flags and zoo models are the code's."""
import ast
import contextlib
import doctest
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from planner import cli
from planner.config import ENV, Config
from planner.options import CompileOptions
from planner.units import parse_bytes

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md",
                                                                          *sorted((ROOT / "docs").glob("*.md"))]}
USAGE = DOCS["docs/USAGE.md"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```$", re.M | re.S)
FIGURE = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)? ?(?:B|KiB|MiB|GiB|TiB)\b|(?<![\w.,])\d+(?:\.\d+)?%")
MEASURED = {"7 GiB": "du -sh", "230 MiB": "du -sh"}
"""Figures of the machine rather than of memplan (what `make test` and `make demo` install), with the command
the README shows beside them."""
SESSIONS = "\n\n".join(block for block in FENCE.findall(README) if block.startswith(">>>"))
"""The README's Python sessions, which run as doctests."""


def _commands():
    """[(argv, the output the README quotes)] of each fenced block that starts with `$ memplan ...`."""
    blocks = []
    for block in FENCE.findall(README):
        first, _, rest = block.partition("\n")
        if first.startswith("$ memplan"):
            blocks.append((shlex.split(first[2:])[1:], rest))
    return blocks


def _same(text):
    """Lines with the planning-time column (`plan s`, the one figure that depends on the machine) masked and
    runs of spaces made one."""
    return [" ".join(re.sub(r"(\d%) +\d+\.\d\d\b", r"\1 <s>", line).split()) for line in text.strip().splitlines()]


@pytest.fixture(scope="module")
def printed():
    """What each of the README's commands prints, under the default settings."""
    outputs = []
    with pytest.MonkeyPatch.context() as mp:
        for var in ENV.values():
            mp.delenv(var, raising=False)
        for argv, _ in _commands():
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert cli.main(argv) == 0, argv
            outputs.append(out.getvalue())
    return outputs


def test_the_readme_is_a_guide_not_a_changelog():
    assert len(README.splitlines()) <= 300
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\bfell from\b|\bbefore that day\b", README)


def test_the_quick_start_is_what_ci_runs():
    quick = README.split("## Quick start", 1)[1]
    commands = [line.split("#")[0].strip() for line in FENCE.search(quick).group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert all(re.search(rf"^{c}\b", ci, re.M) and re.search(rf"^{c.split()[1]}:", makefile, re.M) for c in commands)
    assert "$(PY) -m planner.cli report\n" in makefile, "make demo runs `memplan report` with no model"


def test_each_quoted_output_is_what_its_command_prints(printed):
    blocks = _commands()
    assert blocks and blocks[0][0] == ["report"], "the first quoted output is the default model's report"
    for (argv, quoted), out in zip(blocks, printed):
        assert _same(quoted) == _same(out), f"`memplan {' '.join(argv)}` now prints:\n{out}"


def test_the_python_examples_run_as_shown():
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    test = parser.get_doctest(SESSIONS, {}, "README.md", str(ROOT / "README.md"), 0)
    assert len(test.examples) >= 3
    report = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for var in ENV.values():
            mp.delenv(var, raising=False)
        runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()


def test_every_figure_in_the_readme_is_printed_by_its_commands(printed):
    examples = doctest.DocTestParser().get_examples(SESSIONS)
    shown = " ".join(" ".join(out.split()) for out in [*printed, *(e.want for e in examples)])
    prose = re.sub(r"`[^`\n]*`", "", FENCE.sub("", README))
    figures = set(FIGURE.findall(prose))
    assert figures, "the prose quotes no figure: is FIGURE still right?"
    stale = sorted(f for f in figures - set(MEASURED) if f not in shown)
    assert not stale, f"figures in README.md that no command beside them prints: {stale}"
    assert all(command in README for command in MEASURED.values())


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_links_lead_somewhere(doc):
    base = (ROOT / doc).parent
    for target in re.findall(r"\]\(([^)\s]+)\)", DOCS[doc]):
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z]+:", path):
            continue
        page = (base / path).resolve() if path else ROOT / doc
        assert page.exists(), f"{doc}: {target}"
        if anchor and page.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{doc}: no heading #{anchor} in {path or doc}"


def test_flags_named_in_the_docs_are_the_commands():
    parser = cli.build_parser()
    flags = {name: set(re.findall(r"--[\w-]+", p.format_help())) for name, p in parser.commands.items()}
    everywhere = set().union(*flags.values())
    for doc, text in DOCS.items():
        for command, rest in re.findall(rf"memplan ({'|'.join(flags)})\b([^`\n]*)", text):
            unknown = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", rest)) - flags[command]
            assert not unknown, f"{doc}: memplan {command} has no {sorted(unknown)}"
        unknown = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text)) - everywhere
        assert not unknown, f"{doc}: no command takes {sorted(unknown)}"


def _table(text, heading):
    """The rows of the first table under `heading`, as lists of cells with their backticks removed."""
    section = text.split(f"\n{heading}\n", 1)[1]
    rows = re.findall(r"^\|(.+)\|$", section.split("\n\n#", 1)[0], re.M)[2:]
    return [[cell.strip().strip("`") for cell in row.split("|")] for row in rows]


def _stated(field, text):
    """A default as the settings table writes it, in the field's type."""
    if field.type is bool:
        return {"true": True, "false": False}[text]
    if field.name in ("workspace_limit", "pool_round_size"):
        return parse_bytes(text.replace(" ", ""))
    return field.type(text)


def test_the_settings_table_is_the_configs():
    from dataclasses import fields
    rows = {cells[0]: cells for cells in _table(USAGE, "## Settings")}
    assert list(rows) == [f.name for f in fields(Config)]
    for f in fields(Config):
        _, var, default, _ = rows[f.name]
        assert var == ENV[f.name], f.name
        if f.name == "sublinear_workers":
            assert default == "cores / 2" and Config().sublinear_workers == max(1, (os.cpu_count() or 2) // 2)
        else:
            assert _stated(f, default) == f.default, f.name


def test_the_keywords_table_is_compile_options():
    defaults = CompileOptions()
    rows = _table(USAGE, "### Planning")
    assert len(rows) >= 5
    for keyword, default, _ in rows:
        value = getattr(defaults, keyword)
        assert ast.literal_eval(default) in (value, str(value)), keyword


def test_the_zoo_listed_is_the_zoo():
    from frontends import zoo
    listed = USAGE.split("## Model zoo", 1)[1]
    assert all(re.search(rf"\b{name}\b", listed) for name in zoo.NAMES)
