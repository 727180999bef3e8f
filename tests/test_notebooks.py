"""Every notebook says in its first cell what it runs on, and its code cells run top to bottom on just that:
the optional packages it does not name cannot be imported, and where it says its pictures need Graphviz's
programs, it also runs without them."""
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
OPTIONAL = ("onnxruntime", "ortools", "numba", "tbb", "mkl", "cupy", "nvmath", "torch", "transformers", "onnxscript",
            "hypothesis", "IPython")
"""The top-level modules of memplan's extras and of the test tools, which a plain `pip install memplan` lacks."""
DRAWN = [path for path in NOTEBOOKS if "Graphviz" in "".join(json.loads(path.read_text())["cells"][0]["source"])]


def needs(cells):
    """The optional modules the first cell names (in backticks): those it runs on or uses where installed."""
    first = "".join(cells[0]["source"])
    assert cells[0]["cell_type"] == "markdown" and "**Runs on**" in first, "the first cell says what it runs on"
    return {name for name in re.findall(r"`([\w.]+)`", first) if name in OPTIONAL}


@pytest.mark.parametrize("path, graphviz", [*((p, True) for p in NOTEBOOKS), *((p, False) for p in DRAWN)],
                         ids=lambda v: v.name if isinstance(v, Path) else "graphviz" if v else "no-graphviz")
def test_notebook_runs_on_what_it_says(path, graphviz, monkeypatch, capsys):
    cells = json.loads(path.read_text())["cells"]
    allowed = needs(cells)
    for name in list(sys.modules):
        if name.split(".")[0] in OPTIONAL and name.split(".")[0] not in allowed:
            monkeypatch.setitem(sys.modules, name, None)
    for name in set(OPTIONAL) - allowed:
        monkeypatch.setitem(sys.modules, name, None)
    if not graphviz:
        which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name in ("dot", "neato") else which(name))
    scope = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), scope)
    if not graphviz:
        assert "pictures need Graphviz's programs dot and neato" in capsys.readouterr().out
