"""Weights read when they are needed, not when the model is: an ONNX initializer as an array-like whose
shape and dtype are known up front and whose values are read from the model (or its external data file)
each time they are asked for, and not kept. Planning needs only the shapes; the rewrites that fold a
weight read that one; the executor copies each into its arena in turn. So a model's weights are never held
twice: `memplan report` of an export with external data reads none of them, and a run holds the arena and
one weight in flight beside the model, not a second copy of every weight. So a ModelProto (or external data
file) a plan was compiled from must not change while the plan is in use: an Executor made later reads the
weights it holds then."""
from functools import partial

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin


class Deferred(NDArrayOperatorsMixin):
    """An array of `shape` and `dtype` that `read()` returns: NumPy functions, ufuncs, operators, indexing
    and ndarray's methods take it as that array (read anew each time); a copy or a pickle is the array."""

    def __init__(self, read, shape, dtype):
        self._read, self.shape, self.dtype = read, tuple(int(d) for d in shape), np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __array__(self, dtype=None, copy=None):
        value = self._read()
        if dtype is not None and value.dtype != dtype:
            return value.astype(dtype)
        return value.copy() if copy else value

    def __getattr__(self, name):
        if name.startswith("__") or name == "_read":
            raise AttributeError(name)
        return getattr(np.asarray(self), name)

    def __getitem__(self, key):
        return np.asarray(self)[key]

    def __len__(self):
        return self.shape[0]

    def __iter__(self):
        return iter(np.asarray(self))

    def __reduce__(self):
        return np.asarray, (np.asarray(self),)

    def __deepcopy__(self, memo):
        return self

    def __repr__(self):
        return f"Deferred({self.shape}, {self.dtype})"


def computed(fn, shape, dtype, *args):
    """fn(*args), an array of `shape` and `dtype`: where an argument is a Deferred, a Deferred computing it
    when read (a rewrite of a weight then holds no more of it than the weight did); else computed now."""
    if not any(isinstance(a, Deferred) for a in args):
        return fn(*args)
    return Deferred(partial(_call, fn, args), shape, dtype)


def _call(fn, args):
    return fn(*(np.asarray(a) if isinstance(a, Deferred) else a for a in args))
