"""Scalar float32 functions for the compiled kernels, written so that LLVM vectorises the loops that call
them: no libm calls (which numba leaves scalar without Intel's SVML), no branches but selects.

The activations are chosen by an integer code in the loops (one compiled kernel serves them all): the
codes are the names' positions in ACTIVATIONS.
"""
import math

import numpy as np
from numba import njit

from planner.ops.activation import ERFC_FIT

f32 = np.float32
FASTMATH = {"nsz", "arcp", "contract", "reassoc"}
"""numba's fastmath flags for the compiled kernels: those of fastmath=True but nnan, ninf and afn, so that NaN and
inf flow through as IEEE has them (under nnan or ninf LLVM takes them for poison, and a NaN in gives anything out:
Sigmoid(NaN) was 0, Gelu(inf) NaN); the loops still vectorise and contract."""
NO_BIAS = np.zeros(0, np.float32)
"""The bias of a kernel without one."""
ACTIVATIONS = ("Identity", "Relu", "Sigmoid", "Tanh", "Gelu", "GeluTanh", "Swish", "Clip", "HardSigmoid")
"""What `activate_row` computes, by code; Gelu is the exact (erf) form, GeluTanh the tanh approximation; Swish,
Clip and HardSigmoid take the parameters (alpha), (low, high) and (alpha, beta)."""

LOG2E, LN2_HI, LN2_LO = f32(1 / math.log(2)), f32(0.693359375), f32(-2.12194440e-4)
"""exp's range reduction: x = k ln 2 + r, ln 2 split in two so that k ln 2 is exact (Cody and Waite)."""
ERFC = tuple(f32(c) for c in ERFC_FIT[::-1])
"""The erfc fit's coefficients, highest power first."""
EXP = tuple(f32(1 / math.factorial(k)) for k in range(7, -1, -1))
"""e^r's Taylor coefficients to r^7, highest power first."""
HALVINGS = tuple(f32(2.0 ** -(1 << bit)) for bit in range(7))
"""2^-(2^bit): 2^-n is the product of those of n's bits."""
INV_SQRT2 = f32(1 / math.sqrt(2))
TWO_TANH_C, TANH_K = f32(2 * math.sqrt(2 / math.pi)), f32(0.044715)
"""The tanh Gelu x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3)."""


@njit(inline="always", fastmath=FASTMATH)
def horner(coefficients, x):
    """The polynomial of `coefficients` (highest power first) at x."""
    p = coefficients[0]
    for k in range(1, len(coefficients)):
        p = p * x + coefficients[k]
    return p


@njit(inline="always", fastmath=FASTMATH)
def exp_nonpositive(x):
    """exp(x) for x <= 0, within 2e-7 of it relative: e^r by its Taylor series on |r| <= ln 2 / 2, times
    2^-n by the bits of n (n < 127, where float32 stays normal); 0 below -87, NaN for NaN."""
    clamped = max(x, f32(-87.0))
    k = np.floor(clamped * LOG2E + f32(0.5))
    p = horner(EXP, clamped - k * LN2_HI - k * LN2_LO)
    n = np.int32(-k)
    for bit in range(len(HALVINGS)):
        p *= HALVINGS[bit] if n >> bit & 1 else f32(1)
    return p if x > f32(-87.0) else f32(0) if x <= f32(-87.0) else x  # NaN stays NaN


@njit(inline="always", fastmath=FASTMATH)
def sigmoid(x):
    """1 / (1 + e^-x) from e^-|x|, accurate on both tails."""
    e = exp_nonpositive(-abs(x))
    s = f32(1) / (f32(1) + e)
    return s if x >= f32(0) else e * s


@njit(inline="always", fastmath=FASTMATH)
def normal_cdf(x):
    """Phi(x) by the erfc fit of planner.ops.activation.normal_cdf (the NumPy kernel's), within 2e-6 of it
    relative for |x| < 6."""
    a = abs(x) * INV_SQRT2
    s = f32(1) / (f32(1) + f32(0.5) * a)
    half_erfc = f32(0.5) * s * exp_nonpositive(horner(ERFC, s) - a * a)
    return half_erfc if x < f32(0) else f32(1) - half_erfc


@njit(inline="always", fastmath=FASTMATH)
def activate_row(row, shift, code, p0, p1):
    """row = activation(row + shift) in place, for the activation of `code` (see ACTIVATIONS) with its
    parameters p0, p1. One loop per code, so that each vectorises alone: a loop choosing by code would
    compute every activation, its branches made selects."""
    n = row.shape[0]
    if code == 0:
        for k in range(n):
            row[k] += shift
    elif code == 1:
        for k in range(n):
            row[k] = max(row[k] + shift, f32(0))
    elif code == 2:
        for k in range(n):
            row[k] = sigmoid(row[k] + shift)
    elif code == 3:
        for k in range(n):
            row[k] = math.tanh(row[k] + shift)
    elif code == 4:
        for k in range(n):
            z = row[k] + shift
            row[k] = z * normal_cdf(z)
    elif code == 5:
        for k in range(n):
            z = row[k] + shift
            row[k] = z * sigmoid(TWO_TANH_C * (z + TANH_K * z * z * z))
    elif code == 6:
        for k in range(n):
            z = row[k] + shift
            row[k] = z * sigmoid(p0 * z)
    elif code == 7:
        for k in range(n):
            row[k] = min(max(row[k] + shift, p0), p1)
    else:
        for k in range(n):
            row[k] = min(max(p0 * (row[k] + shift) + p1, f32(0)), f32(1))
