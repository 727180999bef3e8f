"""The errors a user can meet, one class each; the CLI prints their message on one line."""
import contextvars
import importlib
from collections import Counter

SURFACE = contextvars.ContextVar("memplan_surface", default="api")
"""Where the user meets memplan: "api" (Python calls) or "cli" (the memplan command), which sets it."""


def say(api, cli):
    """The phrase for the surface the user is on: the API's keywords, or the command line's flags."""
    return cli if SURFACE.get() == "cli" else api


class MemplanError(Exception):
    """Base of every error caused by the user's model, shapes or settings."""


class ModelError(MemplanError):
    """The model cannot be read, or it is not a valid graph."""


class UnsupportedOpError(MemplanError):
    """The model uses op types that memplan has no schema for."""

    def __init__(self, op_types, reasons=None):
        self.counts = Counter(op_types)
        self.reasons = {op: why for op, why in (reasons or {}).items() if op in self.counts}
        listed = ", ".join(f"{op} (x{n})" for op, n in sorted(self.counts.items()))
        why = "".join(f"; {op}: {reason}" for op, reason in sorted(self.reasons.items()))
        super().__init__(f"unsupported op types: {listed}{why}")


class ShapeError(MemplanError):
    """A dimension is unbound or inconsistent; names the input or tensor."""


class InfeasibleBudgetError(MemplanError):
    """No plan fits the memory budget; carries the smallest feasible one."""

    def __init__(self, budget, minimum):
        self.budget, self.minimum = budget, minimum
        super().__init__(f"no plan fits the budget of {_mib(budget)}; the smallest arena found needs {_mib(minimum)}")


class AboveLimitError(InfeasibleBudgetError):
    """A plan's LOAD (the least arena any placement of its buffers can have) is above the `arena_limit` it was
    asked to keep within, so it was not placed; carries the LOAD as `minimum`."""

    def __init__(self, limit, load):
        MemplanError.__init__(self, f"the plan needs at least {_mib(load)} (its LOAD), above the arena limit of "
                                    f"{_mib(limit)}")
        self.budget, self.minimum = limit, load


def _mib(n):
    """Bytes in MiB and in full, as the errors print them (planner.units, which raises these errors, sits above)."""
    return f"{n / 2**20:,.2f} MiB ({n:,} bytes)"


class PlanError(MemplanError):
    """A plan breaks an invariant (two live tensors overlap, a misaligned offset, ...)."""


class MissingDependencyError(MemplanError):
    """An optional dependency a chosen feature needs is not installed; says which extra brings it."""


def require(module, feature, package, extra):
    """Import `module`, or raise MissingDependencyError: `feature` needs `package`, which `extra` brings."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f'{feature} needs {package}: pip install "memplan[{extra}]"') from None


class ConfigError(MemplanError):
    """A setting (argument or environment variable) has an invalid value; names it and what it accepts."""


class OutOfMemoryError(MemplanError):
    """What a run needs (its arena, feeds or output copies) does not fit in the memory the process can still
    allocate; names the bytes needed and the bytes available."""
