"""Pictures: the timeline SVG read back (one box per buffer, boxes of buffers alive at once never
overlap), PNG output, the graph view, and `memplan viz` / `memplan max-batch` end to end."""
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import planner
from planner import viz

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
pytest.importorskip("graphviz")

SVG = "{http://www.w3.org/2000/svg}"


def svg_boxes(path):
    """{tensor name: (x0, x1, y0, y1)} of every timeline box in an SVG."""
    out = {}
    for g in ET.parse(path).getroot().iter(SVG + "g"):
        if g.get("id", "").startswith("t:") and g.get("class") == "node":
            xs, ys = zip(*(map(float, p.split(",")) for p in g.find(f".//{SVG}polygon").get("points").split()))
            out[g.get("id")[2:]] = (min(xs), max(xs), min(ys), max(ys))
    return out


@pytest.fixture(scope="module")
def training_plan():
    return planner.compile("zoo:lenet", {"input": (8, 1, 28, 28)}, training=True, optimizer="adam")


def test_timeline_has_one_box_per_buffer_and_none_overlap(training_plan, tmp_path, monkeypatch):
    monkeypatch.setattr(viz, "MIN_HEIGHT", 0.0)
    path = viz.timeline(training_plan, tmp_path / "t.svg")
    drawn, buffers = svg_boxes(path), viz.boxes(training_plan)
    assert set(drawn) == {t.name for t, *_ in buffers}
    span = {t.name: (first, last) for t, first, last, _ in buffers}
    names = sorted(drawn)
    eps = 1.01  # graphviz rounds sizes to whole (zoomed) points
    for k, a in enumerate(names):
        for b in names[k + 1:]:
            (a0, a1), (b0, b1) = span[a], span[b]
            if a0 <= b1 and b0 <= a1:
                ya, yb = drawn[a][2:], drawn[b][2:]
                assert ya[1] <= yb[0] + eps or yb[1] <= ya[0] + eps, (a, b)
    text = open(path).read()
    for label in ("arena", "LOAD", "step", "arena offset", "activation saved for backward", "optimizer state"):
        assert label in text
    assert re.search(r'xlink:title="conv1.weight: \(6, 1, 5, 5\) float32, 600 bytes', text)


def test_tiny_buffers_are_summed_not_drawn(training_plan, tmp_path):
    path = viz.timeline(training_plan, tmp_path / "t.svg")
    drawn = svg_boxes(path)
    hidden = len(viz.boxes(training_plan)) - len(drawn)
    assert hidden > 0 and f"{hidden} buffers under" in open(path).read()


def test_png_and_graph_view(training_plan, tmp_path):
    png = viz.timeline(training_plan, tmp_path / "t.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    full = viz.graph_view(training_plan, tmp_path / "g.svg")
    nodes = [g for g in ET.parse(full).getroot().iter(SVG + "g") if g.get("class") == "node"]
    assert len(nodes) == len(training_plan.steps)
    collapsed = viz.graph_view(training_plan, tmp_path / "small.svg", max_nodes=10)
    nodes = [g for g in ET.parse(collapsed).getroot().iter(SVG + "g") if g.get("class") == "node"]
    assert len(nodes) <= 10 and "steps 0&#45;" in open(collapsed).read()


def test_recomputed_nodes_and_buffers_are_marked(tmp_path):
    plan = planner.compile("zoo:lenet", {"input": (8, 1, 28, 28)}, training=True, remat="mirror")
    assert "stroke-dasharray" in open(viz.graph_view(plan, tmp_path / "g.svg")).read()
    assert viz.CATEGORIES["recomputed"][0] in open(viz.timeline(plan, tmp_path / "t.svg")).read()


def test_unknown_picture_format_is_an_error(training_plan, tmp_path):
    with pytest.raises(planner.MemplanError, match=r"\.svg or \.png"):
        viz.timeline(training_plan, tmp_path / "t.jpg")


def memplan(*argv):
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, timeout=600)


def test_cli_viz_and_max_batch_end_to_end(tmp_path):
    done = memplan("viz", "zoo:lenet", "--batch", "8", "--training", "-o", str(tmp_path / "t.svg"),
                   "--graph", str(tmp_path / "g.png"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t.svg").exists() and (tmp_path / "g.png").exists()
    done = memplan("max-batch", "zoo:mlp", "--budget", "8MiB", "--strategy", "naive", "bestfit", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["strategy"]: r for r in json.loads(done.stdout)["rows"]}
    assert 0 < rows["naive"]["max_batch"] <= rows["bestfit"]["max_batch"]
    assert all(r["arena_bytes"] <= 8 * 2**20 for r in rows.values())
    for row in rows.values():  # one more sample no longer fits
        bigger = planner.compile("zoo:mlp", {"input": (row["max_batch"] + 1, 784)}, strategy=row["strategy"])
        assert bigger.arena_bytes > 8 * 2**20


@pytest.mark.parametrize("argv, message", [
    (["viz", "zoo:mlp", "--batch", "2", "-o", "t.jpg"], ".svg or .png"),
    (["max-batch", "zoo:mlp", "--budget", "12 parsecs"], "--budget '12 parsecs'"),
    (["viz", "missing.onnx"], "missing.onnx"),
    (["max-batch", "zoo:mlp", "--budget", "1GiB", "--strategy", "magic"], "invalid choice"),
    (["report", "zoo:mlp", "--frobnicate"], "unrecognized arguments"),
])
def test_cli_mistakes_exit_2_with_one_line(argv, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr
