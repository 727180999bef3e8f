"""How the command line binds a model's inputs: `--input NAME:DIMS` flags, `--batch N` for the first dim of the
others, and the checks `max-batch` makes before it varies that dim. A mistake is one line naming the input, its
shape and what to give."""
import re
import sys

from .errors import MemplanError, ShapeError


def parse_input(text):
    """'NAME:8x3x224x224' -> ('NAME', (8, 3, 224, 224))."""
    m = re.fullmatch(r"(.+):(\d+(?:x\d+)*)", text)
    if not m:
        raise MemplanError(f"--input {text!r}: expected NAME:DIMS, e.g. --input input:8x3x224x224")
    return m.group(1), tuple(int(d) for d in m.group(2).split("x"))


def input_shapes(graph, inputs, batch):
    """Shapes from --input flags; --batch fills the first dim of every other input whose first dim is free
    (see bind_batch). An input whose first dim --batch binds but whose other dims stay unbound is an error
    naming them; a --batch that binds no input is a warning on stderr."""
    shapes = {}
    for text in inputs:
        name, dims = parse_input(text)
        if name not in graph.inputs:
            raise ShapeError(f"--input {name}: the model has no input {name!r}; its inputs are "
                             + ", ".join(f"{n} {_dims(graph, n)}" for n in graph.inputs))
        if name in shapes:
            raise MemplanError(f"--input {name} is given twice ({'x'.join(map(str, shapes[name]))} and "
                               f"{'x'.join(map(str, dims))}); give each input once")
        shapes[name] = dims
    if batch is None:
        return shapes
    bound, partial = bind_batch(graph, shapes, batch)
    if partial:
        name, shape = next(iter(partial.items()))
        raise ShapeError(f"--batch {batch} binds the first dim of input {name} {_dims(graph, name)}, but "
                         f"{_left(shape)} unbound: give its whole shape with --input {name}:{_example(shape)}")
    if not bound:
        print(f"memplan: warning: --batch {batch} binds no input: each has a fixed first dim or an --input of its "
              "own", file=sys.stderr)
    return shapes


def bind_batch(graph, shapes, batch):
    """Add to `shapes` each input not in it whose first dim is free (unbound by the dim names of `shapes`), with
    `batch` as that dim and its other dims as declared or bound by name in `shapes`. Returns (the names bound,
    {name: shape with dims left unbound (names, or None)} of the inputs that `batch` binds only in part)."""
    named = {d: g for n, given in shapes.items() for d, g in zip(graph.tensors[n].shape or (), given)
             if isinstance(d, str)}
    bound, partial = [], {}
    for name in graph.inputs:
        declared = graph.tensors[name].shape
        if name in shapes or not declared or isinstance(declared[0], int) or declared[0] in named:
            continue
        shape = (batch, *(named.get(d, d) if isinstance(d, str) else d for d in declared[1:]))
        if all(isinstance(d, int) for d in shape):
            shapes[name] = shape
            bound.append(name)
        else:
            partial[name] = shape
    return bound, partial


def _dims(graph, name):
    """An input's declared shape as the model names it: (batch, seq)."""
    shape = graph.tensors[name].shape
    return "no declared shape" if shape is None else f"({', '.join('?' if d is None else str(d) for d in shape)})"


def _left(shape):
    """'dim 'seq' stays', 'dims 'seq' and 'width' stay', 'the dim at axis 1 stays' for a shape's unbound dims."""
    left = [repr(d) if d is not None else f"the one at axis {k}" for k, d in enumerate(shape) if not isinstance(d, int)]
    return f"dim{'s' * (len(left) > 1)} {' and '.join(left)} {'stay' if len(left) > 1 else 'stays'}"


def _example(shape):
    """A shape with 128 for each unbound dim, as --input writes it: 1x128."""
    return "x".join(str(d) if isinstance(d, int) else "128" for d in shape)


def check_free_batch(raw, given):
    """Refuse a model whose batch max-batch cannot vary: an --input whose first dim the model fixes, an input
    whose other dims stay unbound (naming it, its shape and what to give), or no input with a free first dim."""
    fixed = {n: raw.tensors[n].shape for n in (given or raw.inputs)
             if raw.tensors[n].shape and isinstance(raw.tensors[n].shape[0], int)}
    hint = "; export the model with a free batch dim (torch.onnx.export(..., dynamic_shapes=...))"
    for name in given:
        if name in fixed:
            raise MemplanError(f"max-batch varies the first dim of the inputs, but the model fixes {name}'s at "
                               f"{fixed[name][0]} (shape {tuple(fixed[name])}){hint}")
    bound, partial = bind_batch(raw, dict(given), 1)
    if partial:
        name, shape = next(iter(partial.items()))
        raise ShapeError(f"max-batch varies the first dim of input {name} {_dims(raw, name)}, but "
                         f"{_left(shape)} unbound: give the other dims with --input {name}:{_example(shape)}")
    if not given and not bound:
        shapes = ", ".join(f"{n} {_dims(raw, n)}" for n in raw.inputs)
        why = "the model fixes the first dim of every input" if len(fixed) == len(raw.inputs) else \
            "no input has a free first dim"
        raise MemplanError(f"max-batch varies the first dim of the inputs, but {why} ({shapes}){hint}")
