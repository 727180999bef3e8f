"""What a run is fed: the feeds' checks a user meets (FeedError), the labels' range, and random feeds of a plan's
inputs (`memplan run`, benchmarks)."""
import numpy as np

from planner.dtypes import is_float
from planner.errors import MemplanError

from .backends import numpy_backend


class FeedError(MemplanError):
    """A feed is missing, unknown, not an array, or of the wrong shape or dtype."""


LABEL_LOSSES = ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyGrad")


def label_ranges(plan):
    """{fed labels input: (classes, ignore_index)} of the loss steps that gather scores at labels."""
    return {s.inputs[1]: (plan.tensors[s.inputs[0]].shape[1], s.attrs.get("ignore_index"))
            for s in plan.steps if s.op in LABEL_LOSSES and s.inputs[1] in plan.inputs}


def check_labels(name, labels, classes, ignore):
    """A FeedError for a host array of labels with one outside [0, classes) that is not the ignore_index
    (the kernels would gather another class's score; on the GPU, another tensor's bytes)."""
    if not isinstance(labels, np.ndarray):
        return  # on the device already: reading it back would cost a synchronisation each run
    bad = (labels < 0) | (labels >= classes)
    if ignore is not None:
        bad &= labels != ignore
    if bad.any():
        skipped = "" if ignore is None else f" or equal ignore_index {ignore}"
        raise FeedError(f"labels {name!r} must lie in [0, {classes}){skipped}; got {labels[bad].flat[0]}")


def random_feeds(plan, seed=0):
    """{input: host array} for every input a run or training step takes (not a training step's lr and
    step): floats from a standard normal, ints zero (valid labels and indices), bools at random. Each
    is made in its own dtype, never through float64; raises OutOfMemoryError first when they cannot fit in
    the memory the process can allocate."""
    what, nbytes, names = random_inputs(plan)
    numpy_backend.check_room(nbytes, what)
    rng = np.random.default_rng(seed)
    with numpy_backend.allocating(nbytes, what):
        return {n: _random(rng, plan.tensors[n].shape, np.dtype(plan.tensors[n].dtype)) for n in names}


def random_inputs(plan):
    """(what they are, their bytes, their names) of the inputs random_feeds makes."""
    info = plan.training
    names = [n for n in plan.inputs if n not in (info.get("lr"), info.get("step"))]
    what = f"random feeds of the inputs {', '.join(names)}" if len(names) <= 3 else \
        f"random feeds of {len(names)} inputs"
    return what, sum(plan.tensors[n].nbytes for n in names), names


def _random(rng, shape, dtype):
    """One random array of `dtype`: float32 and float64 drawn as such, narrower floats cast from float32."""
    if dtype in (np.float32, np.float64):
        return rng.standard_normal(shape, dtype=dtype)
    if is_float(dtype):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape, dtype=bool)
    return np.zeros(shape, dtype)


def type_name(value):
    """The type of `value` as a user knows it: 'dict', 'str', 'cupy.ndarray'."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
