"""How long a step takes: a roofline per node, the most of its FLOPs at the device's rate and its bytes at the
device's memory bandwidth, plus a launch cost; and the host link, which copies at `link` bytes a second each way
(PCIe 4 x16: about 25 GB/s). The swap planner (planner/remat/swap.py) places its copies by it and reports what
they cost.

A DeviceModel is named ("cpu", "v100", "a100", "h100", "h200": PROFILES) or read from the JSON that
`memplan calibrate` writes after measuring a GEMM, a copy and a launch on the machine (`calibrate`). The named
GPUs' numbers are their spec sheets' peaks scaled by EFFICIENCY, not measurements; "cpu" is a 2-core x86 CI
machine's, measured by `calibrate`. A model is fixed data: the same model gives the same plan on a busy machine
as on a quiet one.
"""
import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from . import ops
from .dtypes import is_float
from .errors import ConfigError

LINK = 25e9
"""Host link bytes a second each way by default (PCIe 4 x16)."""
EFFICIENCY = {"flops": 0.6, "bandwidth": 0.8}
"""The share of a spec sheet's peak FLOP rate and memory bandwidth that the named GPUs' models take."""


@dataclass(frozen=True)
class DeviceModel:
    """A device's rates: `flops` (FLOP/s in float32), `half_flops` (in 16-bit floats), `bandwidth` (device
    memory bytes/s), `launch` (seconds a step costs besides its work), `host_bandwidth` (host memory bytes/s,
    for steps run on the host: an offloaded optimizer's update) and `link` (host link bytes/s each way).
    `on_host`: the device is the host's own cores (NumPy), so the host's steps take its time, not time beside it."""

    name: str
    flops: float
    half_flops: float
    bandwidth: float
    launch: float
    host_bandwidth: float
    link: float = LINK
    on_host: bool = False

    def __post_init__(self):
        if not isinstance(self.on_host, bool):
            raise ConfigError(f"device model {self.name!r}: on_host must be true or false, got {self.on_host!r}")
        for f in fields(self)[1:-1]:
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                    value < 0 or (value == 0 and f.name != "launch"):
                raise ConfigError(f"device model {self.name!r}: {f.name} must be a positive number, got {value!r}")

    def seconds(self, graph, node):
        """Seconds `node` of `graph` takes: its FLOPs at the rate of its widest float input (16-bit or not), or the
        bytes it reads and writes at the bandwidth of the memory holding them, whichever is longer; a view or a host
        copy, none."""
        schema = ops.of(node, graph.opsets)
        if schema.is_view(node) or schema.timed:  # a host copy runs on the link beside the compute (swap.simulate)
            return 0.0
        tensors = [graph.tensors[n] for n in dict.fromkeys((*node.inputs, *node.outputs)) if n]
        moved = sum(t.nbytes for t in tensors)
        if runs_on_host(node, graph.tensors):
            return self.launch + moved / self.host_bandwidth
        widest = max((np.dtype(t.dtype).itemsize for t in tensors if is_float(t.dtype)), default=4)
        rate = self.half_flops if widest <= 2 else self.flops
        return self.launch + max(ops.node_flops(graph, node) / rate, moved / self.bandwidth)

    def transfer(self, nbytes):
        """Seconds the link takes to copy `nbytes` one way."""
        return nbytes / self.link

    def to_json(self, path):
        Path(path).write_text(json.dumps(asdict(self), indent=1))


def _spec(name, tflops, half_tflops, tb_per_s):
    return DeviceModel(name, tflops * 1e12 * EFFICIENCY["flops"], half_tflops * 1e12 * EFFICIENCY["flops"],
                       tb_per_s * 1e12 * EFFICIENCY["bandwidth"], 5e-6, 20e9)


def runs_on_host(node, tensors):
    """Whether `node` (a graph's Node or a Plan's Step) runs on the host whatever the device: every tensor it reads
    and writes lies in the host arena (an offloaded optimizer's update and casts), and it is not a copy between the
    arenas."""
    names = [n for n in (*node.inputs, *node.outputs) if n]
    return bool(names) and all(tensors[n].host for n in names) and not ops.of(node).timed


PROFILES = {
    "cpu": DeviceModel("cpu", 190e9, 0.5e9, 12e9, 1e-6, 12e9, on_host=True),
    "v100": _spec("v100", 15.7, 125, 0.9),
    "a100": _spec("a100", 19.5, 312, 2.039),
    "h100": _spec("h100", 67, 989, 3.35),
    "h200": _spec("h200", 67, 989, 4.8),
}
"""The named device models: "cpu" as `calibrate` measured a 2-core CI machine (NumPy on OpenBLAS: 190 GFLOP/s in
a float32 GEMM, 0.5 in float16, which NumPy multiplies without BLAS, 24 GB/s of copy, read and written), the GPUs from their spec sheets (float32 without tensor cores,
16-bit with them, HBM bandwidth; SXM parts) by EFFICIENCY."""


def device_model(name, device="any", link=LINK):
    """The DeviceModel `name` names: a key of PROFILES, a JSON file `calibrate` wrote, or "auto" ("h100" for a
    CUDA `device`, else "cpu"); its link at `link` bytes/s."""
    if name == "auto":
        name = "h100" if str(device).startswith("cuda") else "cpu"
    if name in PROFILES:
        return replace(PROFILES[name], link=link)
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"device model {name!r} is neither one of {', '.join(PROFILES)} nor a file that "
                          "`memplan calibrate -o FILE` wrote")
    try:
        values = json.loads(path.read_text())
        return replace(DeviceModel(**values), link=link)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"device model file {name!r} is not one `memplan calibrate` wrote: {e}") from None


def timings(fn, repeat, synchronize=lambda: None, warmup=1):
    """The wall seconds of `repeat` calls of fn after `warmup` untimed ones, `synchronize()` waiting for each."""
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def calibrate(xp, synchronize, name, link=LINK, size=2048, repeat=5):
    """A DeviceModel measured with the array module `xp` (NumPy or CuPy, `synchronize()` waiting for its work): the
    best of `repeat` runs of a float32 and a float16 GEMM of `size` (a quarter of it in NumPy), a 256 MiB copy, and a
    one-element product; the host bandwidth by a NumPy copy."""
    def best(fn):
        return min(timings(fn, repeat, synchronize))

    def gemm(dtype, n):
        a = xp.ones((n, n), dtype=dtype)
        out = xp.empty_like(a)
        return 2 * n ** 3 / best(lambda: xp.matmul(a, a, out=out))

    def copied(module):
        a = module.ones(1 << 26, dtype=module.float32)
        out = module.empty_like(a)
        return 2 * a.nbytes / best(lambda: module.copyto(out, a))

    one = xp.ones(1, dtype=xp.float32)
    launch = best(lambda: [xp.multiply(one, one, out=one) for _ in range(1000)]) / 1000
    half = size if xp is not np else size // 4  # NumPy multiplies float16 without BLAS, hundreds of times slower
    return DeviceModel(name, gemm(xp.float32, size), gemm(xp.float16, half), copied(xp), launch, copied(np), link,
                       on_host=xp is np)
