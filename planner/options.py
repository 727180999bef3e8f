"""CompileOptions: what planner.compile plans, as one checked value instead of a long keyword list."""
from dataclasses import dataclass, fields, replace
from enum import Enum

import ml_dtypes
import numpy as np

from .config import Config
from .errors import ModelError, PlanError
from .generation import Generation
from .parallel import Parallel
from .optimizers import UPDATES, optimizer_arguments

OFFLOADS = ("optimizer",)
"""What a training plan may hold in host memory besides swapped activations: the optimizer's state, master weights
and update (ZeRO-Offload; planner/passes/offload.py)."""

STRATEGIES = {  # name: (allocator, in-place allowed)
    "naive": ("naive", False),
    "inplace": ("naive", True),
    "share": ("share", True),
    "bestfit": ("bestfit", True),
    "auto": ("auto", True),
    "optimal": ("optimal", True),
}
SCHEDULES = ("file", "memory", "auto")
IGNORE_INDEX = -100
"""The label a loss skips by default (PyTorch's ignore_index)."""
DEVICE_KINDS = ("any", "cpu", "cuda")


class Precision(str, Enum):
    """The float types a plan computes in (planner.precision), parsed once by CompileOptions, so that what
    a precision means is asked of it (`low`, `mixed`, `scales_loss`) rather than read from its name."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    AMP_FP16 = "amp-fp16"
    AMP_BF16 = "amp-bf16"

    def __str__(self):
        return self.value

    @classmethod
    def parse(cls, value):
        try:
            return cls(value)
        except ValueError:
            raise PlanError(f"unknown precision {value!r}; choose one of {', '.join(p.value for p in cls)}") from None

    @property
    def low(self):
        """The 16-bit float type the plan computes in (float16 or bfloat16), None for fp32."""
        half = (Precision.FP16, Precision.AMP_FP16)
        return None if self is Precision.FP32 else np.dtype(np.float16 if self in half else ml_dtypes.bfloat16)

    @property
    def mixed(self):
        """Whether ops compute where autocast's policy puts them, rather than every one in `low`."""
        return self in (Precision.AMP_FP16, Precision.AMP_BF16)

    @property
    def scales_loss(self):
        """Whether gradients are of a scaled loss (float16's range needs it, as torch's GradScaler)."""
        return self is Precision.AMP_FP16


@dataclass(frozen=True)
class Device:
    """The device a plan's arena is for, parsed once by CompileOptions: "any" (whichever runs it), "cpu", or
    "cuda" with an optional index ("cuda:1")."""

    kind: str = "any"
    index: int | None = None

    def __str__(self):
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @classmethod
    def parse(cls, value):
        if isinstance(value, cls):
            return value
        kind, colon, index = value.partition(":") if isinstance(value, str) else ("", "", "")
        if kind not in DEVICE_KINDS or (colon and (kind == "any" or not (index.isascii() and index.isdigit()))):
            raise PlanError(f"device must name a device (\"any\", \"cpu\", \"cuda\" or \"cuda:N\"), got {value!r}")
        return cls(kind, int(index) if colon else None)

    @property
    def is_gpu(self):
        return self.kind == "cuda"


@dataclass(frozen=True)
class CompileOptions:
    """planner.compile's options (see its docstring), checked when made: an unknown strategy, schedule,
    optimizer, update or optimizer argument, and training options without `training=True`, are errors
    before any model is read. `device` and `rank` are recorded in the plan: which device its arena is
    for ("any": whichever runs it) and which of several cooperating plans it is. `device` and `precision`
    may be given by name ("cuda:0", "amp-fp16") and are held as a Device and a Precision. None means the
    default: `loss` "cross_entropy", `optimizer` "sgd", `config` Config.from_env() when compile runs.
    `weights=False` plans from the weights' shapes alone: an initializer's external data is not read, whether
    its file is there or not (its plan is planner.deferred's Absent weights, which no Executor runs).
    `arena_limit` (bytes): a plan whose LOAD is above it cannot fit it and is not placed (AboveLimitError, in the
    time of the passes and lifetimes alone): how a search for what fits a device skips the offsets of what
    cannot. `generation` (a planner.Generation) plans a causal LM exported with a cache as a GenerationPlan: its
    prefill and decode steps in one arena, the cache static and written in place (planner.generation)."""

    strategy: str = "auto"
    schedule: str = "auto"
    training: bool = False
    loss: str | None = None
    optimizer: str | None = None
    optimizer_args: dict | None = None
    loss_output: str | None = None
    frozen: tuple = ()
    update: str = "eager"
    remat: str | None = None
    memory_budget: int | None = None
    arena_limit: int | None = None
    config: Config | None = None
    fetch: tuple = ()
    trainable: tuple = ()
    class_axis: int | None = None
    ignore_index: int | None = IGNORE_INDEX
    device: Device = Device()
    rank: int = 0
    precision: Precision = Precision.FP32
    fuse_attention: bool = True
    fold_batchnorm: bool = True
    fuse_conv: bool = True
    fuse_norm: bool = True
    fuse_activation: bool = True
    fold_transpose: bool = True
    pretranspose: bool = True
    winograd: bool = True
    batch_conv: bool = True
    inverted_residual: bool = True
    parallel: Parallel | None = None
    weights: bool = True
    generation: Generation | None = None
    offload: str | None = None

    def __post_init__(self):
        if self.generation is not None and (not isinstance(self.generation, Generation) or self.training
                                            or self.parallel is not None):
            raise PlanError("generation takes a planner.Generation, for an inference plan on one device (no training, "
                            f"no parallel); got {self.generation!r}")
        if not isinstance(self.weights, bool):
            raise PlanError(f"weights must be True or False, got {self.weights!r}")
        if self.arena_limit is not None and (isinstance(self.arena_limit, bool) or not isinstance(self.arena_limit, int)
                                             or self.arena_limit < 0):
            raise PlanError(f"arena_limit must be a number of bytes (an int >= 0) or None, got {self.arena_limit!r}")
        object.__setattr__(self, "device", Device.parse(self.device))
        object.__setattr__(self, "precision", Precision.parse(self.precision))
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise PlanError(f"rank must be an int >= 0, got {self.rank!r}")
        if self.strategy not in STRATEGIES:
            raise PlanError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if not self.training:
            if (self.loss or self.optimizer or self.optimizer_args or self.loss_output or self.frozen or self.remat
                    or self.trainable or self.memory_budget is not None or self.class_axis is not None
                    or self.ignore_index != IGNORE_INDEX or self.offload):
                raise PlanError("loss, optimizer, optimizer_args, loss_output, frozen, trainable, class_axis, "
                                "ignore_index, remat, memory_budget and offload apply to training=True")
            if self.parallel is not None and self.parallel != Parallel(tp=getattr(self.parallel, "tp", 1)):
                raise PlanError("an inference plan takes tensor parallelism alone (parallel=Parallel(tp=N)): data "
                                "ranks, ZeRO, pipeline stages, microbatches and sequence parallelism apply to "
                                f"training=True; got {self.parallel!r}")
            return
        optimizer_arguments(self.optimizer or "sgd", self.optimizer_args or {})
        if self.parallel is not None and not isinstance(self.parallel, Parallel):
            raise PlanError(f"parallel must be a planner.Parallel, got {self.parallel!r}")
        if self.update not in UPDATES:
            raise ModelError(f"unknown update {self.update!r}; choose one of {', '.join(UPDATES)}")
        if self.offload is not None and self.offload not in OFFLOADS:
            raise PlanError(f"unknown offload {self.offload!r}; choose one of {', '.join(OFFLOADS)} (or None)")

    @classmethod
    def of(cls, options=None, **keywords):
        """`options` (default: the defaults) with `keywords` over it; an unknown keyword is a TypeError
        naming the options there are."""
        unknown = sorted(set(keywords) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"planner.compile got unknown options {', '.join(unknown)}; it takes "
                            f"{', '.join(f.name for f in fields(cls))}")
        return replace(options or cls(), **keywords)

    @property
    def orders(self):
        """The schedule orders to plan: both for "auto", which keeps the smaller plan; the file's for pipeline
        stages and microbatches."""
        if self.parallel is not None and (self.parallel.pp > 1 or self.parallel.microbatches > 1):
            return ("file",)  # the 1F1B order of the microbatches, which the stages' sends and receives follow
        return ("file", "memory") if self.schedule == "auto" else (self.schedule,)
