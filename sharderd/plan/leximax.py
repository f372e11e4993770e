"""Lexicographic min-max ("leximax") over stage times: the slowest stage first, then the next
slowest, and so on. The planner's secondary objective: among the splits whose slowest stage is
the optimum, the one whose next slowest stage is least, and so on down the stages.

A split is scored by its stage times sorted slowest first; two splits compare by the first entry
where they differ. That order is kept by adding the same stage to both: if ``a`` is before ``b``,
then ``a + [t]`` is before ``b + [t]`` for any time ``t`` (compare the count of entries at or above
each value: adding ``t`` adds one to both counts at every value up to ``t``, so the first value,
from the top, where the counts differ does not move). Hence the principle of optimality holds, and
every DP that builds a split stage by stage (over ideals, over an order's positions) stays exact
when it keeps, per state, the leximax-least vector of the stages placed so far instead of their
maximum alone.

Times are compared as integers on a grid of ``GRID`` × a scale (the total work): floating-point
sums that are equal on paper but differ in their last bits then compare equal, and the order is
transitive. Vectors are ``int64 [rows, k]``, sorted descending, padded with ``EMPTY`` for the
stages not placed yet.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EMPTY", "GRID", "first_per_group", "grid_of", "lexmin", "push", "quantise"]

GRID = 1e-12
"""Stage times closer than this fraction of the total work are equal: 10⁴ times float64's
rounding of the prefix sums they come from, 10⁻³ of a nanosecond on a second of work."""
EMPTY = -1


def grid_of(total_s: float) -> float:
    """The time one grid step is worth for a graph of ``total_s`` seconds of work."""
    return max(float(total_s), 1e-300) * GRID


def quantise(times: np.ndarray, step: float) -> np.ndarray:
    """Stage times as int64 grid steps (+inf becomes the largest int64)."""
    out = np.full(np.shape(times), np.iinfo(np.int64).max, dtype=np.int64)
    finite = np.isfinite(times)
    out[finite] = np.rint(np.asarray(times)[finite] / step).astype(np.int64)
    return out


def push(vectors: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Each row of ``vectors`` (descending, at least one ``EMPTY`` slot) with its time added."""
    out = vectors.copy()
    out[:, -1] = times
    out.sort(axis=1)
    return out[:, ::-1]


def first_per_group(
    group: np.ndarray, vectors: np.ndarray, *ties: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Rows sorted by group, then leximax vector, then each of ``ties`` (least first); returns
    (that order, the position in it where each group starts)."""
    keys = [*reversed(ties), *(vectors[:, c] for c in range(vectors.shape[1] - 1, -1, -1)), group]
    order = np.lexsort(keys)
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, np.int64)
    return order, starts


def lexmin(vectors: np.ndarray, *ties: np.ndarray) -> int:
    """The row with the least leximax vector, then the least of each of ``ties``."""
    keys = [*reversed(ties), *(vectors[:, c] for c in range(vectors.shape[1] - 1, -1, -1))]
    return int(np.lexsort(keys)[0])
