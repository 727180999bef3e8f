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

from .errors import ModelError


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

    def same_as(self, other):
        """Whether `other` is this value as surely as identity says: the same read, or the same function of the same
        arguments (`computed` anew from the same weights, as each of a generation's steps rewrites them)."""
        if not isinstance(other, Deferred) or (self.shape, self.dtype) != (other.shape, other.dtype):
            return False
        mine, theirs = self._read, other._read
        if mine is theirs:
            return True
        return isinstance(mine, partial) and isinstance(theirs, partial) and mine.func is theirs.func and \
            len(mine.args) == len(theirs.args) and all(
                a is b or isinstance(a, Deferred) and a.same_as(b) or _same_object_args(a, b)
                for a, b in zip(mine.args, theirs.args)) and mine.keywords == theirs.keywords

    def __repr__(self):
        return f"Deferred({self.shape}, {self.dtype})"


class Absent(Deferred):
    """A weight the model gives the type and shape of but no values (a weightless export: planned from
    shapes alone). Planning takes it as any weight; reading its values is an error naming it."""

    def __init__(self, name, shape, dtype):
        super().__init__(partial(_absent, name), shape, dtype)
        self.name = name

    def __reduce__(self):
        return Absent, (self.name, self.shape, self.dtype)

    def same_as(self, other):
        """Whether `other` stands for the same weight in the same shape (see Deferred.same_as)."""
        return isinstance(other, Absent) and (self.name, self.shape, self.dtype) == (other.name, other.shape, other.dtype)

    def __repr__(self):
        return f"Absent({self.name!r}, {self.shape}, {self.dtype})"


def _absent(name):
    raise ModelError(f"the value of {name!r} is needed here, but the model's weights are absent (it was planned "
                     "from their shapes alone): give the model with its weights")


def is_absent(value):
    """Whether `value` (an array, a Deferred, a rank's part of one: parallel.Whole) stands for a weight without
    values."""
    return isinstance(_inner(value), Absent)


def absent_name(value):
    """The name of the model's weight an absent value stands for (see is_absent)."""
    return _inner(value).name


def _inner(value):
    while not isinstance(value, Deferred) and hasattr(value, "value"):
        value = value.value
    return value


def computed(fn, shape, dtype, *args):
    """fn(*args), an array of `shape` and `dtype`: where an argument is a Deferred, a Deferred computing it
    when read (a rewrite of a weight then holds no more of it than the weight did), an Absent where one is;
    else computed now."""
    absent = next((a for a in args if isinstance(a, Absent)), None)
    if absent is not None:
        return Absent(absent.name, shape, dtype)
    if not any(isinstance(a, Deferred) for a in args):
        return fn(*args)
    return Deferred(partial(_call, fn, args), shape, dtype)


def _same_object_args(a, b):
    """Whether two arguments of `computed` functions are equal tuples of the same objects (Deferred, arrays)."""
    return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(
        x is y or isinstance(x, Deferred) and x.same_as(y) for x, y in zip(a, b))


def _call(fn, args):
    return fn(*(np.asarray(a) if isinstance(a, Deferred) else a for a in args))
