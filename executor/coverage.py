"""The op-coverage table of docs/OPS.md, generated from the registries: each op memplan plans, the
opsets its schemas cover, how it runs and whether it trains; then the ops refused by design.
`python -m executor.coverage` prints it as Markdown, `python -m executor.coverage docs/OPS.md` rewrites the
copy between the markers there, which tests/test_coverage.py keeps current."""
import sys
from pathlib import Path

import onnx

from frontends.onnx_frontend import MAX_OPSET, MIN_OPSET
from planner import ops
from planner.ir import op_name

from .kernels import KERNELS


def rows():
    """[(op, opsets, runs, gradient)] of every registered op, the default domain first."""
    out = []
    for (domain, op), versions in sorted(ops.SCHEMAS.items(), key=lambda item: (item[0][0] != "", item[0])):
        newest = versions[-1][1]
        starts = [max(since, MIN_OPSET) if not domain else since for since, _ in versions]
        opsets = ", ".join(f"{s}+" for s in dict.fromkeys(starts))
        out.append((op_name(domain, op), opsets, _runs(domain, op, newest), _trains(newest)))
    return out


def _runs(domain, op, schema):
    if (domain, op) in KERNELS or schema.kernel is not None or schema.cuda is not None:
        return "kernel"
    if getattr(schema, "expand", None):
        return "inlined"
    return "its parts" if schema.decompose is not None else "no"


def _trains(schema):
    if schema.differentiable:
        return "yes"
    return "its parts" if schema.decompose is not None or getattr(schema, "expand", None) else "—"


def _onnx_op_types():
    """The op types of ONNX's default domain that the installed onnx defines and has not deprecated."""
    return {s.name for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx") and not s.deprecated}


def markdown():
    """The table and the refused ops, as docs/OPS.md shows them."""
    onnx_ops = sum(1 for d, op in ops.SCHEMAS if not d and onnx.defs.has(op))
    lines = [f"{len(ops.SCHEMAS)} op types ({onnx_ops} of the {len(_onnx_op_types())} of ONNX's default domain), "
             f"read at opsets {MIN_OPSET} to {MAX_OPSET}. *runs*: a kernel shared by the NumPy and CuPy backends, "
             "*its parts* (a composite replaced by the ops it is made of when planning), or *inlined* (control "
             "flow, replaced by its subgraphs); *gradient*: a rule of its own, or through its parts.", "",
             "| op | opsets | runs | gradient |", "|---|---|---|---|"]
    lines += [f"| {op} | {opsets} | {runs} | {grad} |" for op, opsets, runs, grad in rows()]
    lines += ["", "Besides these, Constant nodes become constant tensors when a model is read, and a node of any "
              "other op whose inputs are all constants is folded by onnx.reference when planning.", "",
              "Refused by design, with the reason the error gives (unless the op folds away so):", ""]
    by_reason = {}
    for op, reason in ops.REASONS.items():
        by_reason.setdefault(reason, []).append(op)
    lines += [f"- {', '.join(sorted(names))}: {reason}." for reason, names in by_reason.items()]
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- op coverage: python -m executor.coverage -->\n", "<!-- end of op coverage -->\n"
"""The markers around the table in docs/OPS.md."""


def spliced(text):
    """`text` with the table between its markers made current."""
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + markdown() + END + rest.split(END, 1)[1]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
        path.write_text(spliced(path.read_text()))
    else:
        print(markdown(), end="")
