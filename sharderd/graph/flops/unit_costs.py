"""FLOPs of one element of each basic operation class, the units every formula is written in.

A transcendental counts 4 because it costs several ALU ops on every device we target.
"""

from __future__ import annotations

ARITH = 1.0  # add, multiply, compare, select, cast, piecewise-linear activation
TRANSCENDENTAL = 4.0  # exp, log, tanh, erf, sin, pow...
SOFTMAX = 4 * ARITH + TRANSCENDENTAL  # max, subtract, exp, sum, divide
GELU = TRANSCENDENTAL + 4 * ARITH  # x * 0.5 * (1 + erf(x / sqrt 2))
QUANTIZE = 4 * ARITH  # divide, round, add zero point, saturate
DEQUANTIZE = 2 * ARITH  # subtract zero point, multiply
