"""memplan.SwapOut and memplan.SwapIn: a tensor copied between the device arena and the host arena, so that a
value the backward pass needs later leaves the device while it waits (planner/remat/swap.py places them).

SwapOut stands where its copy must be over: the device bytes it reads stay live to it, and an executor with a
copy stream starts the copy as soon as the value is made. SwapIn stands where its copy starts: the device bytes
it writes are live from it, and a reader waits for the copy."""
from .registry import schema
from .base import Schema

ANY = frozenset({"tensor(float16)", "tensor(bfloat16)", "tensor(float)", "tensor(double)", "tensor(int8)",
                 "tensor(uint8)", "tensor(int16)", "tensor(int32)", "tensor(int64)", "tensor(bool)",
                 "tensor(float8e4m3fn)", "tensor(float8e5m2)"})


class _Copy(Schema):
    """Y = X, in the other memory: the output's bytes are its own (never a view), as it lies in the other arena."""

    domain = "memplan"
    types = (("T",), {"T": ANY})
    arity = 1
    mirror = False
    timed = True

    def infer(self, node, ins):
        return [(ins[0].shape, ins[0].dtype)]

    def flops(self, node, ins, outs):
        return 0


@schema("SwapOut", domain="memplan")
class SwapOut(_Copy):
    """Y (host) = X (device)."""


@schema("SwapIn", domain="memplan")
class SwapIn(_Copy):
    """Y (device) = X (host)."""
