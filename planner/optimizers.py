"""memplan's optimizers (the ops of the memplan domain that update a param, their optimizer_args and
state), when their updates run, and the check of a given optimizer_args: what CompileOptions checks before
any model is read and planner.training builds the optimizer nodes from."""
import math
import numbers

import numpy as np

from .errors import ConfigError, ModelError

OPTIMIZERS = {  # name: (op of the memplan domain, defaults of optimizer_args, state tensors per parameter)
    "sgd": ("SGD", {"lr": 0.01, "weight_decay": 0.0}, ()),
    "momentum": ("SGD", {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False}, ("momentum",)),
    "adam": ("Adam", {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}, ("exp_avg", "exp_avg_sq")),
    "adamw": ("Adam", {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
              ("exp_avg", "exp_avg_sq")),
}
UPDATES = ("eager", "after_backward")
"""When a param is updated: as soon as its gradient is complete, or after the whole backward pass."""

ARGUMENTS = {  # optimizer_args key: (accepts it, what it accepts)
    "lr": (lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "weight_decay": (lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "momentum": (lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "eps": (lambda v: _real(v) and v > 0, "a finite number > 0"),
    "betas": (lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(_real(x) and 0 <= x < 1 for x in v),
              "two numbers in [0, 1), as (0.9, 0.999)"),
    "nesterov": (lambda v: isinstance(v, (bool, np.bool_)), "True or False"),
}


def optimizer_arguments(optimizer, given):
    """optimizer_args over the optimizer's defaults, as plain Python values; an unknown optimizer, unknown
    keys and values outside what torch.optim accepts are errors, not left for the run to meet."""
    if optimizer not in OPTIMIZERS:
        raise ModelError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    defaults = OPTIMIZERS[optimizer][1]
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"optimizer {optimizer!r} takes optimizer_args {', '.join(defaults)}; "
                          f"got unknown {', '.join(unknown)}")
    for key, value in given.items():
        accepts, what = ARGUMENTS[key]
        if not accepts(value):
            raise ConfigError(f"optimizer_args {key}={value!r} is invalid; {key} takes {what}")
    args = {**defaults, **given}
    if args.get("nesterov") and args["momentum"] == 0:
        raise ConfigError("optimizer_args nesterov=True needs a momentum > 0")
    return {key: _plain(value) for key, value in args.items()}


def _plain(value):
    """A checked argument as a JSON-ready Python value (NumPy scalars and lists become float, bool, tuple)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (tuple, list)):
        return tuple(float(v) for v in value)
    return float(value)


def _real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)
