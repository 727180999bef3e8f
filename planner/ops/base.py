"""The interface every op schema implements, and helpers the shape rules share."""
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import is_float
from ..errors import ShapeError
from ..ir import op_name

CONST_LIMIT = 1 << 24
"""Most elements of a constant that planning builds from sizes the model gives (a DFT's matrix, a gradient's
index table), checked before it is made: a model describes tensors of up to 2**48 bytes that are never made
when planning, and a constant shaped by one would exhaust the host."""


@dataclass(frozen=True)
class Info:
    """What shape inference knows of one input: its shape, dtype and, when computable now, its value."""

    shape: tuple
    dtype: np.dtype
    value: np.ndarray | None = None

    @property
    def rank(self):
        return len(self.shape)


class Schema:
    """What an op is, independent of how it is computed.

    - `attr_inputs`: (attribute, input index, first opset passing it as an input). Such inputs
      must be known before running; the shape pass moves their values into `node.attrs`, so
      downstream code sees one form whatever the opset.
    - `defaults`: attribute defaults from the ONNX spec.
    - `inplace`: (input index, output index) pairs the output may overwrite; `identity`: the
      output is a view of input 0 (same bytes, new shape).
    - `infer(node, ins)`: the (shape, dtype) of each output from the inputs' Info.
    - `evaluate(node, *arrays)`: the outputs in NumPy, for ops worth folding when their
      inputs are known (shape arithmetic); None when the op is not folded.
    - `normalize(node)`: every attribute, the ONNX defaults filled in (a plan's Step holds these).
    - `workspace(node, ins, outs, limit)`: the Layout of the scratch the kernel needs besides its
      inputs and outputs, as named slices (the executor cuts them for the kernel).
    - `flops(node, ins, outs)`: floating-point operations of one run (a multiply-add counts 2).
    - `kernel(xp, step, ins, outs, ws)`: how the op computes, with `xp` NumPy or CuPy, when its
      definition holds it (the elementwise families); None where executor/kernels has it.
    - `cuda`: the body of a fused CuPy ElementwiseKernel, for ops whose array form needs temporaries.
    - `torch`: the op in PyTorch, `fn(torch, *tensors, **attrs)`, for executor.torch_module.
    - `decompose(b, node)`: the op built from other ops with the autodiff Builder `b`, returning its
      output names; a composite with no kernel or no gradient runs or differentiates through it.
    - `mirror`: whether MXNet's mirror may recompute the output (False for the expensive ops);
      `random`: the op draws random values, so that recomputing it would draw others.
    - `result`: the dtype of output 0 where the op fixes it (bool for comparisons, int64 for Shape);
      `ranks`: how output 0's rank follows the inputs', "same" (input 0's) or "broadcast" (the
      largest), where one rule says; what the symbol API knows of an output before shapes are bound.
    - `types`: for an op outside ONNX's default domain (whose constraints ONNX's own schemas give),
      ONNX-style type constraints: (type parameter of each input, {parameter: allowed type strings
      as ONNX writes them, "tensor(float)"}); inputs past the last repeat its parameter.
    - `arity`: the number of inputs where the op takes a fixed number of data inputs (1 for the unary
      elementwise ops, which the symbol API offers as one-argument functions).
    - `effect`: the op acts beyond its outputs (memplan.Send gives its input to another rank), so that
      it stays in the graph though nothing reads what it makes.
    - `replayable`: a copy of the op computes its outputs again (False for memplan.Recv, whose copy would wait
      for a second send), so that recomputation may drop them.
    - `timed`: the op stands where a pass placed it by the time model (memplan.SwapOut and SwapIn, the host
      copies), so that a graph holding one runs in its own order (planner.schedule).

    What the passes know of an op is its schema's too, so that a new op is one entry and their tables
    (built from the registry) pick it up:

    - `autocast`: where torch.autocast computes the op under a mixed precision (planner.precision):
      "low" (the 16-bit type), "float32", "input" (its data input's type, whatever its weights'), or
      None (the widest float type of its inputs).
    - `split`: the name of the rule tensor parallelism follows the op by (planner.tensor_split.RULES:
      "elementwise", "matmul", "same", "norm", ...; sequence parallelism reads it too); None: a view follows
      "view", another op stops a split.
    - `stat`: the count of plan.stats the op adds to (the fused ops: "fused_attention", "winograd").
    - `numbers`: a one-element initializer the op reads is a number of the model's code (a scale, an
      epsilon, a bound: elementwise arithmetic and comparisons), not a weight that trains
      (planner.training.choose_params); `setting_inputs`: {input index: what it is} of the inputs that set
      how the op computes rather than being data it learns (a Pow's exponent), which never train.
    - `statistics`: the indices of the inputs that hold running statistics, which the op's training form
      updates and nothing trains (BatchNormalization's mean and variance).
    - `training_form(node, step)`: the node as a training step runs it (planner.training.training_mode:
      BatchNormalization on batch statistics, Dropout drawing its mask), given a TrainingStep; None
      where it runs as in inference.
    - `torch_node(torch, run, node, ins)`: the op in PyTorch where its form needs more than its tensors
      and attributes (the planned output shapes `run.shape(name)`, `run.training_mode(node)`, the
      module's `run.graph_buffers()`); it is the form executor.torch_module runs, before `torch`.
    """

    op = ""
    domain = ""
    since = 1
    attr_inputs = ()
    defaults = {}
    inplace = ()
    identity = False
    kernel = None
    cuda = None
    torch = None
    decompose = None
    mirror = True
    random = False
    result = None
    ranks = None
    arity = None
    types = None
    effect = False
    replayable = True
    timed = False
    autocast = None
    split = None
    stat = None
    numbers = False
    setting_inputs = {}
    statistics = ()
    training_form = None
    torch_node = None

    def attr(self, node, name):
        if name in node.attrs:
            return node.attrs[name]
        if name in self.defaults:
            return self.defaults[name]
        raise ShapeError(f"required attribute {name!r} is missing")

    def arguments(self, node):
        """The op's attributes by name, each of `defaults` (what an entry's `fn`, `torch` and `cuda`
        forms take)."""
        return {k: self.attr(node, k) for k in self.defaults}

    def normalize(self, node):
        """{attribute: value} of every attribute the node sets or the op defaults, resolved once when
        planning so that kernels read `step.attrs[name]` directly (None where ONNX has no default)."""
        return {**self.defaults, **node.attrs}

    def is_view(self, node):
        """Whether output 0 is input 0's bytes, unchanged (Reshape; Dropout in inference)."""
        return self.identity

    def infer(self, node, ins):
        raise NotImplementedError

    def workspace(self, node, ins, outs, limit):
        """The Layout of the scratch the kernel needs beyond its inputs and outputs, at most `limit` bytes
        (an op whose full scratch is larger works in chunks; see its own docstring for any exception).

        `ins` are the inputs' Info (None for an omitted optional input), `outs` the outputs'
        (shape, dtype) pairs as `infer` gives them. Most ops need none.
        """
        return Layout()

    def flops(self, node, ins, outs):
        """Floating-point operations of one run, a multiply-add counting 2; `ins` and `outs` as for
        `workspace`. By default one per output element, and none for a view of input 0."""
        return 0 if self.is_view(node) else elements(outs)

    evaluate = None
    gradient = None
    """`gradient(b, node, dys)`: given the gradient tensor of each output (None where nothing flows
    back), the gradient of each input (None where it has none), built with the autodiff Builder `b`
    out of ops the planner knows. None: the op is not differentiable."""

    @property
    def differentiable(self):
        """Whether the op has a gradient rule of its own."""
        return self.gradient is not None

    def accumulation(self, dtype):
        """The dtype the op sums or multiplies-and-adds in for inputs of `dtype`: float32 for the
        16-bit and narrower floats (as cuBLAS and PyTorch accumulate), the dtype itself otherwise."""
        dtype = np.dtype(dtype)
        narrow_float = dtype.itemsize < 4 and (is_float(dtype) or dtype.name.startswith("float"))
        return np.dtype(np.float32) if narrow_float else dtype

    def evaluate_into(self, xp, step, ins, outs):
        """Fill a step's outputs from `evaluate`, computed by NumPy on the host: the kernel of the rare
        cases (dtypes, modes, empty inputs) a direct one leaves to it."""
        host = [None if a is None else (a if xp is np else xp.asnumpy(a)) for a in ins]
        for out, value in zip(outs, self.evaluate(step, *host)):
            if out is not None:
                out[...] = xp.asarray(value)

    def fold(self, node, ins):
        """Output values when every input's value is known and the op can be evaluated, else None."""
        if self.evaluate is None or any(i is not None and i.value is None for i in ins):
            return None
        return self.evaluate(node, *(None if i is None else i.value for i in ins))


@dataclass
class TrainingStep:
    """What an op's `training_form` may add to the training step planner.training makes: `tensors`
    and `updates` ((new value, param) pairs) of the step, the `graph` it reads (its consumers), the
    node's `index` (a default seed) and the name of the step-counter input."""

    graph: object
    tensors: dict
    updates: list
    counter: str
    index: int = 0


@dataclass(frozen=True)
class Slice:
    """One named view of an op's workspace: `shape` elements of `dtype` (a NumPy dtype name) from byte
    `offset`; "uint8" slices are raw bytes the kernel cuts itself (chunked scratch)."""

    name: str
    offset: int
    shape: tuple
    dtype: str

    @property
    def nbytes(self):
        return math.prod(self.shape) * _dtype_facts(self.dtype)[0]


@dataclass(frozen=True)
class Layout:
    """An op's workspace: its named slices and its size in bytes (what the planner reserves)."""

    slices: tuple = ()
    nbytes: int = 0

    @classmethod
    def pack(cls, *parts, align=1):
        """The (name, shape, dtype) parts one after the other, each at a multiple of its itemsize and of
        `align`, the total rounded up to `align`; None parts are left out."""
        slices, end = [], 0
        for name, shape, dtype in filter(None, parts):
            itemsize, dtype = _dtype_facts(dtype)
            step = math.lcm(itemsize, align)
            start = -(-end // step) * step
            slices.append(Slice(name, start, tuple(int(d) for d in shape), dtype))
            end = start + slices[-1].nbytes
        return cls(tuple(slices), -(-end // align) * align)


@functools.lru_cache(maxsize=None)
def _dtype_facts(dtype):
    """(itemsize, name) of a dtype, as NumPy spells it; cached, as planning asks for them in every plan."""
    return np.dtype(dtype).itemsize, str(np.dtype(dtype))


FLOATS = frozenset({"tensor(float16)", "tensor(bfloat16)", "tensor(float)", "tensor(double)"})
"""The float types, as ONNX's type constraints name them."""


def axis(a, rank):
    """An axis in [0, rank), from ONNX's [-rank, rank)."""
    if not -rank <= a < rank:
        raise ShapeError(f"axis {a} is out of range for rank {rank}")
    return a % rank


def broadcast(*shapes):
    """The multidirectional (NumPy) broadcast of several shapes, in Python ints (no size overflows)."""
    rank = max(map(len, shapes), default=0)
    out = []
    for dims in zip(*[(1,) * (rank - len(s)) + tuple(s) for s in shapes]):
        sizes = {int(d) for d in dims if d != 1}
        if len(sizes) > 1:
            raise ShapeError(f"shapes {' and '.join(map(str, shapes))} do not broadcast: sizes "
                             f"{' and '.join(map(str, sorted(sizes)))} meet on one axis")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def same_dtype(ins):
    """The one dtype of the present inputs (their Info); ShapeError when they have several."""
    dtypes = {i.dtype for i in ins if i is not None}
    if len(dtypes) > 1:
        raise ShapeError(f"inputs have different dtypes {sorted(map(str, dtypes))}")
    return next(i.dtype for i in ins if i is not None)


def take(xp, a, indices, axis, out):
    """xp.take of in-range `indices` into `out`: NumPy's wrapping form, since its default checking one
    buffers the whole output; CuPy's take has no modes."""
    if xp is np:
        return np.take(a, indices, axis=axis, out=out, mode="wrap")
    return xp.take(a, indices, axis=axis, out=out)


def elements(outs):
    """The number of elements of (shape, dtype) pairs, summed (None: an omitted output)."""
    return sum(math.prod(o[0]) for o in outs if o is not None)


def constant_shape(node, what, *shape):
    """`shape`, that of a constant planning is about to build for `node` (`what` it holds), once it is seen to
    hold at most CONST_LIMIT elements; ShapeError naming the node otherwise."""
    count = math.prod(shape)
    if count > CONST_LIMIT:
        raise ShapeError(f"node {node.name!r} ({op_name(node.domain, node.op)}): {what} would hold {count:,} elements "
                         f"{tuple(shape)}, more than the {CONST_LIMIT:,} memplan builds when planning "
                         "(planner.ops.base.CONST_LIMIT)")
    return tuple(shape)


def no_flops(node, ins, outs):
    """The cost of ops that only describe or fill values (Shape, ConstantOfShape, Range): none."""
    return 0


def per_input_element(k):
    """A `flops` rule of `k` per element of input 0: 1 for reductions; about 5 for normalisations and
    softmax (subtract the mean or max, square or exponentiate, sum, scale, shift)."""
    return staticmethod(lambda node, ins, outs: k * math.prod(ins[0].shape))


def no_gradient(node):
    """What a gradient rule does for a form of its op it cannot differentiate (yet)."""
    from ..errors import ModelError
    raise ModelError(f"node {node.name!r} ({node.op}) has no gradient rule")


def normalised_dims(shape, first):
    """The dims from `first` on, which a normalisation takes its statistics over; ShapeError where they hold
    no values (the mean of an empty set has none; onnxruntime refuses it too)."""
    dims = tuple(shape[first:])
    if not math.prod(dims):
        raise ShapeError(f"it normalises over dims {dims} of its input {tuple(shape)}, which hold no values")
    return dims


def same_as_input(node, ins):
    """Shape rule of ops whose single output has the shape and dtype of input 0."""
    return [(ins[0].shape, ins[0].dtype)]
