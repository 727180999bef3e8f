"""The copies between the device arena and the host arena (memplan.SwapOut, memplan.SwapIn; rules in
planner/ops/swap.py). With NumPy both arenas are host memory and a copy is a plain copy; with CuPy the executor
runs them on its copy stream (executor/backends/cupy_backend.py)."""
from . import kernel


@kernel("SwapOut", domain="memplan")
def swap_out(xp, step, ins, outs, ws):
    outs[0][...] = ins[0]


@kernel("SwapIn", domain="memplan")
def swap_in(xp, step, ins, outs, ws):
    outs[0][...] = ins[0]
