"""The errors a user can meet, one class each; the CLI prints their message on one line."""
from collections import Counter


class MemplanError(Exception):
    """Base of every error caused by the user's model, shapes or settings."""


class ModelError(MemplanError):
    """The model cannot be read, or it is not a valid graph."""


class UnsupportedOpError(MemplanError):
    """The model uses op types that memplan has no schema for."""

    def __init__(self, op_types):
        self.counts = Counter(op_types)
        listed = ", ".join(f"{op} (x{n})" for op, n in sorted(self.counts.items()))
        super().__init__(f"unsupported op types: {listed}")


INPUT_SYNTAX = "bind it with --input NAME:8x3x224x224 (or input_shapes={'NAME': (8, 3, 224, 224)})"


class ShapeError(MemplanError):
    """A dimension is unbound or inconsistent; names the input or tensor."""


class InfeasibleBudgetError(MemplanError):
    """No plan fits the memory budget; carries the smallest feasible one."""

    def __init__(self, budget, minimum):
        self.budget, self.minimum = budget, minimum
        super().__init__(f"no plan fits the budget of {budget} bytes; the smallest feasible budget is {minimum} bytes")


class PlanError(MemplanError):
    """A plan breaks an invariant (two live tensors overlap, a misaligned offset, ...)."""


class MissingDependencyError(MemplanError):
    """An optional dependency a chosen feature needs is not installed; says which extra brings it."""


class ConfigError(MemplanError):
    """A setting (argument or environment variable) has an invalid value; names it and what it accepts."""
