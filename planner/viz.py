"""Pictures of a Plan through graphviz: the memory timeline (x = step, y = arena offset, one box per
buffer, pinned with `neato -n2`) and the computation graph (`dot`, edges labelled with bytes, nodes
coloured by the buffer they write).

SVG boxes carry the tensor's name as their id ("t:NAME") and a tooltip with its shape, dtype, bytes,
lifetime and aliases, so the picture can be read back and checked.
"""
import colorsys
import shutil
from pathlib import Path

from .breakdown import category
from .errors import MemplanError, MissingDependencyError
from .units import format_bytes

CATEGORIES = {  # category: (colour, legend label)
    "param": ("#b0b0b0", "param / const"),
    "io": ("#f2c14e", "graph input / output"),
    "saved": ("#4c72b0", "activation saved for backward"),
    "activation": ("#8fb8de", "transient activation"),
    "gradient": ("#dd8452", "gradient"),
    "optimizer": ("#8c613c", "optimizer state"),
    "workspace": ("#55a868", "workspace"),
    "recomputed": ("#c44e52", "recomputed"),
}
WIDTH, HEIGHT = 1000.0, 600.0
"""The plot area in points."""
HOST_HEIGHT = 200.0
"""The height of the host arena's panel, under the device's, in points."""
ZOOM = 100
"""Graphviz rounds node sizes to whole points: the timeline is laid out this many times larger, then
scaled down to size, so boxes stay exact to 1/ZOOM of a point."""
MIN_HEIGHT = 0.5
"""Buffers drawn under this many points tall are summed into one legend line instead of drawn."""
FORMATS = ("svg", "png")
FAST_DOT = {"mclimit": "0.2", "nslimit": "4", "nslimit1": "4", "searchsize": "10", "remincross": "false",
            "splines": "line"}
"""dot's crossing minimisation and network simplex bounded: a training step's long forward-to-backward
edges otherwise keep it busy for minutes."""


def boxes(plan, host=False):
    """[(root tensor, first step, last step, aliases)] for every buffer of the device arena (of the host arena where
    `host`): transient ones span the union of their members' lifetimes; persistent ones span the whole run."""
    members = {}
    for t in plan.tensors.values():
        if t.alias_of is not None:
            members.setdefault(t.alias_of, []).append(t)
    last = max(len(plan.steps) - 1, 0)
    out = []
    for t in plan.tensors.values():
        if t.alias_of is not None or not t.nbytes or t.host != host:
            continue
        group = [t] + members.get(t.name, [])
        spans = [m.lifetime for m in group if m.lifetime is not None]
        first, end = (min(s[0] for s in spans), max(s[1] for s in spans)) if t.lifetime is not None else (0, last)
        out.append((t, first, min(end, last), [m.name for m in group[1:]]))
    return out


def timeline(plan, path, title=None):
    """Write the memory timeline of `plan` to `path` (.svg or .png), with its host arena (swapped copies, an
    offloaded optimizer) as a panel of its own under the device's; returns the path."""
    graphviz = require_graphviz()
    nsteps = max(len(plan.steps), 1)
    top = max(plan.arena_bytes, 1)
    sx, sy = WIDTH / nsteps, HEIGHT / top
    below = HOST_HEIGHT + 90 if plan.host_arena_bytes else 0
    g = graphviz.Graph("timeline", engine="neato", graph_attr={
        "splines": "line", "outputorder": "edgesfirst", "bgcolor": "white", "pad": "0.3",
        "size": f"{(WIDTH + 420) / 72:.2f},{(HEIGHT + 120 + below) / 72:.2f}",
        "label": title or (f"{plan.strategy} plan, {plan.schedule} schedule, {plan.stats.get('precision', 'fp32')}: "
                           f"arena {format_bytes(plan.arena_bytes)}"),
        "labelloc": "t", "fontname": "Helvetica", "fontsize": str(14 * ZOOM)},
        node_attr={"fontname": "Helvetica", "fontsize": str(9 * ZOOM)})
    hidden = [0, 0]
    _boxes(g, boxes(plan), sx, sy, 0, hidden)
    if plan.host_arena_bytes:
        host_sy, base = HOST_HEIGHT / plan.host_arena_bytes, -below
        _boxes(g, boxes(plan, host=True), sx, host_sy, base, hidden)
        _line(g, "host", base + HOST_HEIGHT, f"host arena {format_bytes(plan.host_arena_bytes)}", "solid")
        g.node("host:label", "host arena offset", shape="plaintext", pos=_pos(-20, base + HOST_HEIGHT + 14))
    if plan.lower_bound_bytes == plan.arena_bytes:
        _line(g, "peak", HEIGHT, f"arena = LOAD {format_bytes(plan.arena_bytes)}", "solid")
    else:
        _line(g, "peak", HEIGHT, f"arena {format_bytes(plan.arena_bytes)}", "solid")
        _line(g, "load", plan.lower_bound_bytes * sy, f"LOAD {format_bytes(plan.lower_bound_bytes)}", "dashed",
              label_y=min(plan.lower_bound_bytes * sy, HEIGHT - 12))
    _axes(g, nsteps, top, sx, sy)
    _legend(g, hidden)
    return _render(g, path, neato_no_op=2)


def _boxes(g, found, sx, sy, base, hidden):
    """A box per buffer of `found` (boxes'), `sy` points a byte above height `base`; those too thin to draw counted
    in `hidden` [buffers, bytes]."""
    for t, first, last, aliases in found:
        w, h = (last - first + 1) * sx, t.nbytes * sy
        if h < MIN_HEIGHT:
            hidden[0] += 1
            hidden[1] += t.nbytes
            continue
        tip = (f"{t.name}: {tuple(t.shape)} {t.dtype}, {t.nbytes:,} bytes at {'host ' * t.host}offset {t.offset:,}, "
               + ("persistent" if t.lifetime is None else f"steps {first}-{last}")
               + (f"; shared by {', '.join(aliases[:8])}" + (" ..." if len(aliases) > 8 else "") if aliases else ""))
        g.node(f"t:{t.name}", "", id=f"t:{t.name}", shape="box", style="filled", fixedsize="true",
               fillcolor=CATEGORIES[category(t)][0], color="#303030", penwidth=str(0.3 * ZOOM), width=_inches(w),
               height=_inches(h), pos=_pos(first * sx + w / 2, base + t.offset * sy + h / 2), tooltip=tip)


def graph_view(plan, path, max_nodes=200):
    """Write the computation graph of `plan` to `path` (.svg or .png): one node per step coloured by the
    buffer its first output lands in, each edge labelled with its tensor's bytes; in-place writes drawn
    bold, recomputed nodes dashed. Above `max_nodes` steps, runs of consecutive steps are collapsed."""
    graphviz = require_graphviz()
    g = graphviz.Digraph("graph", graph_attr={"rankdir": "TB", "fontname": "Helvetica", **FAST_DOT},
                         node_attr={"shape": "box", "style": "filled,rounded", "fontname": "Helvetica",
                                    "fontsize": "9"}, edge_attr={"fontname": "Helvetica", "fontsize": "8"})
    size = max(1, -(-len(plan.steps) // max_nodes))
    group = {k: k // size for k in range(len(plan.steps))}
    producer = {o: k for k, s in enumerate(plan.steps) for o in s.outputs if o}
    for first in range(0, len(plan.steps), size):
        steps = plan.steps[first:first + size]
        root = _root(plan, next((o for s in steps for o in s.outputs if o), None))
        inplace = any(plan.tensors[o].alias_of and not plan.tensors[o].view for s in steps for o in s.outputs if o)
        label = steps[0].op if size == 1 else f"steps {first}-{first + len(steps) - 1}\n{_ops(steps)}"
        g.node(f"s{first // size}", label + (" (in place)" if inplace and size == 1 else ""),
               fillcolor=_block_colour(root), penwidth="2" if inplace else "1",
               style="filled,rounded,dashed" if any(s.phase == "recompute" for s in steps) else "filled,rounded",
               tooltip=", ".join(s.name for s in steps[:20]))
    edges = {}
    for k, s in enumerate(plan.steps):
        for i in dict.fromkeys(i for i in s.inputs if i in producer):
            a, b = group[producer[i]], group[k]
            if a != b:
                edges[a, b] = edges.get((a, b), 0) + plan.tensors[i].nbytes
    for (a, b), nbytes in edges.items():
        g.edge(f"s{a}", f"s{b}", label=_short(nbytes))
    return _render(g, path)


def require_graphviz():
    """The graphviz module, once both it and Graphviz's programs are there; else how to install them."""
    try:
        import graphviz
    except ImportError:
        raise MissingDependencyError("pictures need the graphviz package: pip install graphviz") from None
    if shutil.which("dot") is None or shutil.which("neato") is None:
        raise MissingDependencyError(
            "pictures need Graphviz's programs dot and neato, which are not on PATH: apt-get install graphviz "
            "(Debian, Ubuntu), dnf install graphviz (Fedora), brew install graphviz (macOS), "
            "conda install -c conda-forge graphviz, or see https://graphviz.org/download/")
    return graphviz


def _render(g, path, **options):
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise MemplanError(f"{path}: pictures are written as {' or '.join('.' + f for f in FORMATS)}")
    g.format = fmt
    out = g.render(outfile=str(path), cleanup=True, **options)
    path.with_suffix(".gv").unlink(missing_ok=True)
    return out


def _line(g, name, y, label, style, label_y=None):
    """A horizontal line across the plot at height y, labelled at its right end."""
    g.node(f"{name}_from", "", shape="point", width=_inches(0.5), pos=_pos(0, y))
    g.node(f"{name}_to", "", shape="point", width=_inches(0.5), pos=_pos(WIDTH, y))
    g.node(f"{name}_label", label, shape="plaintext", pos=_pos(WIDTH + 60, y if label_y is None else label_y))
    g.edge(f"{name}_from", f"{name}_to", style=style, color="#202020", penwidth=str(0.8 * ZOOM))


def _axes(g, nsteps, top, sx, sy):
    g.node("x:label", "step", shape="plaintext", pos=_pos(WIDTH / 2, -30))
    g.node("y:label", "arena offset", shape="plaintext", pos=_pos(-20, HEIGHT + 20))
    for k in range(6):
        step = round(k * (nsteps - 1) / 5)
        g.node(f"x:{k}", str(step), shape="plaintext", pos=_pos(step * sx + sx / 2, -12))
        offset = k * top / 5
        g.node(f"y:{k}", _short(offset), shape="plaintext", pos=_pos(-30, offset * sy))


def _legend(g, hidden):
    x = WIDTH + 140
    for k, (colour, label) in enumerate(CATEGORIES.values()):
        y = HEIGHT - 14 * k
        g.node(f"legend:{k}", "", shape="box", style="filled", fillcolor=colour, fixedsize="true", width=_inches(11),
               height=_inches(9), pos=_pos(x, y), penwidth=str(0.3 * ZOOM))
        g.node(f"legend:{k}:text", label, shape="plaintext", pos=_pos(x + 12 + 2.6 * len(label), y))
    if hidden[0]:
        g.node("legend:hidden", f"{hidden[0]} buffers under {MIN_HEIGHT} pt\n({_short(hidden[1])}) not drawn",
               shape="plaintext", pos=_pos(x + 60, HEIGHT - 14 * len(CATEGORIES) - 10))


def _pos(x, y):
    """A pinned position, in points of the plot before ZOOM."""
    return f"{x * ZOOM:.2f},{y * ZOOM:.2f}!"


def _inches(points):
    return f"{points * ZOOM / 72:.5f}"


def _root(plan, name):
    return None if name is None else plan.tensors[name].alias_of or name


def _block_colour(root):
    """A light colour per storage block, stable across runs."""
    if root is None:
        return "#eeeeee"
    hue = (sum(map(ord, root)) * 0.61803398875) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, 0.82, 0.6)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _ops(steps):
    counts = {}
    for s in steps:
        counts[s.op] = counts.get(s.op, 0) + 1
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(counts.items(), key=lambda c: -c[1])[:4])


def _short(n):
    """A byte count for a small label: one decimal."""
    return format_bytes(n, digits=1)
