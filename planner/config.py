"""Planner settings, with MXNet's environment variables as their outside names.

Precedence: an explicit argument, then the environment, then the default. The environment is
read when `Config.from_env()` runs, which `planner.compile` does on every call without `config=`;
a Config once made never changes.
"""
import os
from dataclasses import dataclass, fields
from importlib.util import find_spec

from .errors import ConfigError

MiB = 1 << 20


def jit_wanted():
    """Whether MEMPLAN_JIT allows the executor's compiled kernels (anything but 0, false, no or off)."""
    return os.environ.get("MEMPLAN_JIT", "1").strip().lower() not in ("0", "false", "no", "off")


def quiet_blas():
    """The one process-wide setting memplan makes, when `planner` is imported and before NumPy loads OpenBLAS:
    where the compiled kernels will run (numba installed, MEMPLAN_JIT not 0), OpenBLAS's threads sleep after
    2^18 cycles (0.1 ms) without a GEMM instead of 2^28 (0.1 s), so that they do not spin on the cores the next
    compiled loop needs: without MKL, mobilenet_v2 ran 1.6 to 1.9x faster; with it, as fast either way. Left
    alone without the compiled kernels (NumPy's passes between GEMMs would wake the threads each time: 6%
    slower), where OpenBLAS loaded first, and where the user set it."""
    if jit_wanted() and find_spec("numba") is not None:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "18")


def _bool(text):
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


@dataclass(frozen=True)
class Config:
    """What the planner may do. Each field's metadata names its environment variable."""

    enable_inplace: bool = True
    """MXNET_EXEC_ENABLE_INPLACE: an op's output may take its input's buffer."""
    match_range: int = 16
    """MXNET_EXEC_MATCH_RANGE: the `share` allocator reuses a free block within a factor of this
    of the requested size; 0 turns sharing between tensors off."""
    auto_search_match_range: bool = False
    """NNVM_AUTO_SEARCH_MATCH_RANGE: `share` tries match ranges 1, 2, 4, .. up to match_range
    and keeps the smallest arena."""
    num_temp: int = 1
    """MXNET_EXEC_NUM_TEMP: temp-workspace slots (colours) when workspace_mode is "pool"."""
    gpu_worker_nthreads: int = 2
    """MXNET_GPU_WORKER_NTHREADS: caps num_temp (slots are only useful to concurrent workers)."""
    pool_reserve_percent: float = 5.0
    """MXNET_GPU_MEM_POOL_RESERVE: share of device memory the executor keeps free of the arena."""
    pool_type: str = "Naive"
    """MXNET_GPU_MEM_POOL_TYPE: the dynamic pool that planner.pools replays by default: "Naive" (free
    blocks reused by exact rounded size) or "Round" (sizes rounded up to powers of two)."""
    pool_page_size: int = 4096
    """MXNET_GPU_MEM_POOL_PAGE_SIZE: the pools' smallest block; Naive rounds every size up to a multiple
    of it."""
    pool_round_size: int = 2 * MiB
    """MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE: the Naive pool rounds sizes above this up to a multiple of it."""
    pool_round_linear_cutoff: int = 24
    """MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF: the Round pool rounds sizes above 2**this up to a multiple
    of 2**this instead of a power of two."""
    workspace_limit: int = 64 * MiB
    """MEMPLAN_WORKSPACE_LIMIT: the most scratch bytes one op may take (Conv's im2col columns);
    a kernel whose full scratch is larger works through the batch in chunks."""
    workspace_mode: str = "auto"
    """MEMPLAN_WORKSPACE_MODE: "pool" (MXNet: num_temp shared slots, kept for the whole run),
    "tensor" (each op's scratch is a tensor living one step, placed by the allocator) or "auto" (both
    planned, the smaller arena kept; ties pooled)."""
    inplace_update: bool = True
    """MEGENGINE_INPLACE_UPDATE: optimizers write each param in place (MegEngine's default is off; off
    here, new params are tensors of their own, copied over the params at the end of the step)."""
    backward_do_mirror: bool = False
    """MXNET_BACKWARD_DO_MIRROR: training steps recompute cheap ops in backward (remat="mirror") when
    compile() is given no remat."""
    sublinear_search: str = "memonger"
    """MEMPLAN_SUBLINEAR_SEARCH: remat="sublinear" searches thresholds as memonger does, or as MegEngine
    does ("megengine": threshold samples, then the genetic search when its iterations are > 0)."""
    sublinear_thresh_nr_try: int = 10
    """MGB_SUBLINEAR_MEMORY_THRESH_NR_TRY: threshold samples in MegEngine's search."""
    sublinear_genetic_nr_iter: int = 0
    """MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER: generations of MegEngine's genetic search (0: off)."""
    sublinear_genetic_pool_size: int = 20
    """MGB_SUBLINEAR_MEMORY_GENETIC_POOL_SIZE: the genetic population."""
    sublinear_lower_bound_mb: int = 0
    """MGB_SUBLINEAR_MEMORY_LOWER_BOUND_MB: arenas at most this big count as small enough, and the
    least recomputation among them wins."""
    sublinear_workers: int = max(1, (os.cpu_count() or 2) // 2)
    """MGB_SUBLINEAR_MEMORY_WORKERS: processes scoring MegEngine's candidates in parallel."""
    time_limit: float = 10.0
    """MEMPLAN_TIME_LIMIT: seconds the `optimal` allocator's CP-SAT may search (its exact search first takes the
    effort of half of them, a count), and remat="optimal"'s solver per try; the plan records where one cut a
    search short."""
    remat_solver: str = "milp"
    """MEMPLAN_REMAT_SOLVER: remat="optimal" solves Checkmate's program with HiGHS ("milp") or OR-Tools
    CP-SAT ("cpsat")."""
    enable_swap: bool = False
    """MEGENGINE_ENABLE_SWAP: a training step given a memory budget and no remat swaps saved values to host memory
    (remat="swap") instead of recomputing them."""
    device_model: str = "auto"
    """MEMPLAN_DEVICE_MODEL: the time model swapping places its copies by (planner.timing): "cpu", "v100", "a100",
    "h100", "h200", a JSON file `memplan calibrate` wrote, or "auto" (h100 for a CUDA plan, else cpu)."""
    link_bandwidth: float = 25e9
    """MEMPLAN_LINK_BANDWIDTH: bytes a second the host link copies each way (PCIe 4 x16: about 25 GB/s)."""
    debug: bool = False
    """MEMPLAN_DEBUG: `compile` prints "memory X MiB -> Y MiB" (every tensor its own buffer -> the plan)."""

    def __post_init__(self):
        checks = {"match_range": self.match_range >= 0, "num_temp": self.num_temp >= 1,
                  "gpu_worker_nthreads": self.gpu_worker_nthreads >= 1,
                  "pool_reserve_percent": 0 <= self.pool_reserve_percent < 100,
                  "pool_type": self.pool_type in ("Naive", "Round"),
                  "pool_page_size": self.pool_page_size >= 32 and not self.pool_page_size & (self.pool_page_size - 1),
                  "pool_round_size": self.pool_round_size >= 1,
                  "pool_round_linear_cutoff": 20 <= self.pool_round_linear_cutoff <= 34
                  and 1 << self.pool_round_linear_cutoff >= self.pool_page_size,
                  "workspace_limit": self.workspace_limit >= 1,
                  "workspace_mode": self.workspace_mode in ("auto", "pool", "tensor"),
                  "time_limit": self.time_limit > 0, "remat_solver": self.remat_solver in ("milp", "cpsat"),
                  "sublinear_search": self.sublinear_search in ("memonger", "megengine"),
                  "sublinear_thresh_nr_try": self.sublinear_thresh_nr_try >= 1,
                  "sublinear_genetic_nr_iter": self.sublinear_genetic_nr_iter >= 0,
                  "sublinear_genetic_pool_size": self.sublinear_genetic_pool_size >= 2,
                  "sublinear_lower_bound_mb": self.sublinear_lower_bound_mb >= 0,
                  "sublinear_workers": self.sublinear_workers >= 1,
                  "device_model": bool(self.device_model), "link_bandwidth": self.link_bandwidth > 0}
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, f.type if f.type is not float else (int, float)) or \
                    (f.type is not bool and isinstance(value, bool)) or not checks.get(f.name, True):
                raise ConfigError(f"Config.{f.name} = {value!r} is not valid: {_ACCEPTS[f.name]}")

    @property
    def temp_slots(self):
        """Workspace slots in "pool" mode: MXNET_EXEC_NUM_TEMP capped by MXNET_GPU_WORKER_NTHREADS."""
        return min(self.num_temp, self.gpu_worker_nthreads)

    @classmethod
    def from_env(cls, environ=None, **overrides):
        """A Config from `overrides`, else the environment variables, else the defaults."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            if f.name in overrides:
                continue
            var = ENV[f.name]
            if var in environ:
                try:
                    values[f.name] = _bool(environ[var]) if f.type is bool else f.type(environ[var])
                except ValueError:
                    raise ConfigError(f"environment variable {var}={environ[var]!r} is not valid: "
                                      f"{_ACCEPTS[f.name]}") from None
        unknown = sorted(set(overrides) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown Config fields {unknown}; known: {', '.join(f.name for f in fields(cls))}")
        return cls(**values, **overrides)


ENV = {"enable_inplace": "MXNET_EXEC_ENABLE_INPLACE", "match_range": "MXNET_EXEC_MATCH_RANGE",
       "auto_search_match_range": "NNVM_AUTO_SEARCH_MATCH_RANGE", "num_temp": "MXNET_EXEC_NUM_TEMP",
       "gpu_worker_nthreads": "MXNET_GPU_WORKER_NTHREADS", "pool_reserve_percent": "MXNET_GPU_MEM_POOL_RESERVE",
       "pool_type": "MXNET_GPU_MEM_POOL_TYPE", "pool_page_size": "MXNET_GPU_MEM_POOL_PAGE_SIZE",
       "pool_round_size": "MXNET_GPU_MEM_LARGE_ALLOC_ROUND_SIZE",
       "pool_round_linear_cutoff": "MXNET_GPU_MEM_POOL_ROUND_LINEAR_CUTOFF",
       "workspace_limit": "MEMPLAN_WORKSPACE_LIMIT", "workspace_mode": "MEMPLAN_WORKSPACE_MODE",
       "inplace_update": "MEGENGINE_INPLACE_UPDATE",
       "backward_do_mirror": "MXNET_BACKWARD_DO_MIRROR", "sublinear_search": "MEMPLAN_SUBLINEAR_SEARCH",
       "sublinear_thresh_nr_try": "MGB_SUBLINEAR_MEMORY_THRESH_NR_TRY",
       "sublinear_genetic_nr_iter": "MGB_SUBLINEAR_MEMORY_GENETIC_NR_ITER",
       "sublinear_genetic_pool_size": "MGB_SUBLINEAR_MEMORY_GENETIC_POOL_SIZE",
       "sublinear_lower_bound_mb": "MGB_SUBLINEAR_MEMORY_LOWER_BOUND_MB", "sublinear_workers": "MGB_SUBLINEAR_MEMORY_WORKERS",
       "time_limit": "MEMPLAN_TIME_LIMIT", "remat_solver": "MEMPLAN_REMAT_SOLVER", "enable_swap": "MEGENGINE_ENABLE_SWAP",
       "device_model": "MEMPLAN_DEVICE_MODEL", "link_bandwidth": "MEMPLAN_LINK_BANDWIDTH", "debug": "MEMPLAN_DEBUG"}
"""The environment variable behind each field."""

_ACCEPTS = {"enable_inplace": "a boolean", "match_range": "an integer >= 0",
            "auto_search_match_range": "a boolean", "num_temp": "an integer >= 1",
            "gpu_worker_nthreads": "an integer >= 1", "pool_reserve_percent": "a number in [0, 100)",
            "pool_type": '"Naive" or "Round"', "pool_page_size": "a power of two >= 32",
            "pool_round_size": "a number of bytes >= 1",
            "pool_round_linear_cutoff": "an integer in [20, 34], at least log2 of MXNET_GPU_MEM_POOL_PAGE_SIZE",
            "workspace_limit": "a number of bytes >= 1", "workspace_mode": '"auto", "pool" or "tensor"',
            "inplace_update": "a boolean", "backward_do_mirror": "a boolean", "sublinear_search": '"memonger" or "megengine"',
            "sublinear_thresh_nr_try": "an integer >= 1", "sublinear_genetic_nr_iter": "an integer >= 0",
            "sublinear_genetic_pool_size": "an integer >= 2", "sublinear_lower_bound_mb": "an integer >= 0",
            "sublinear_workers": "an integer >= 1", "time_limit": "seconds > 0",
            "remat_solver": '"milp" or "cpsat"', "enable_swap": "a boolean",
            "device_model": 'a device name ("auto", "cpu", "h100", ...) or a file of `memplan calibrate`',
            "link_bandwidth": "bytes a second > 0", "debug": "a boolean"}
