"""The order's least next-slowest stage, and the (start, end) pairs a leximax-least split can use.

When one stage holds the bottleneck ``B1`` far above the others (a logits transfer), every pair
``(i, j)`` with ``T(i, j) <= B1`` lies on some split within ``B1``, and there are too many of them
to weigh. The leximax-least split has one stage at ``B1`` and every other stage at most ``B2``,
the least second-slowest stage of any split: so only pairs within ``B2`` (whose split has at most
one stage above ``B2``), and pairs above ``B2`` whose every other stage is within ``B2``, can be
in it. That is two narrow bands again.

``B2`` comes from a bisection like ``partition.solve``'s, over a reachability that counts the
stages above ``B2`` (none, or one within ``B1``): each layer is two windowed minima instead of one.
"""

from __future__ import annotations

import numpy as np

from sharderd.plan.partition import IntervalProblem, range_min, sparse_min

__all__ = ["Layers", "least_end", "least_start", "reach_one_over", "second_bound"]

_REL_TOL = 1e-10

Layers = list[tuple[np.ndarray, np.ndarray]]
"""Per stage boundary: (none above ``B2``, at most one above ``B2`` and within ``B1``)."""


def least_start(problem: IntervalProblem, s: int, ok: np.ndarray) -> np.ndarray:
    """Per end ``j``: the least ``v(i)`` over starts ``i`` in stage ``s``'s window with ``ok``."""
    return range_min(sparse_min(np.where(ok, problem.v, np.inf)), problem.lo[s], problem.hi)


def least_end(problem: IntervalProblem, s: int, ok: np.ndarray) -> np.ndarray:
    """Per start ``i``: the least ``u(j)`` over ends ``j`` whose stage-``s`` window holds ``i``,
    with ``ok``. ``lo`` and ``hi`` never decrease, so those ends are one interval."""
    positions = np.arange(len(problem.u))
    first = np.maximum(np.searchsorted(problem.hi, positions, side="left"), positions + 1)
    last = np.searchsorted(problem.lo[s], positions, side="right") - 1
    return range_min(sparse_min(np.where(ok, problem.u, np.inf)), first, last)


def reach_one_over(problem: IntervalProblem, b1: float, b2: float, *, forward: bool) -> Layers:
    """Forward: layer ``s`` says which ``[0, j)`` split into ``s`` stages with none (first) or at
    most one (second) above ``b2``, all within ``b1``. Backward: layer ``s`` for ``[i, n)`` into
    stages ``s..k-1``."""
    n1, k = len(problem.u), len(problem.lo)
    positions = np.arange(n1)
    start = positions == (0 if forward else n1 - 1)
    layers: Layers = [(start, start.copy())]
    stages = range(k) if forward else range(k - 1, -1, -1)
    for s in stages:
        none, one = layers[-1]
        if forward:
            m0, m1 = least_start(problem, s, none), least_start(problem, s, one)
            other = problem.u
        else:
            m0, m1 = least_end(problem, s, none), least_end(problem, s, one)
            other = problem.v
        within = (m0 <= b2 - other) & np.isfinite(m0)
        over = ((m1 <= b2 - other) & np.isfinite(m1)) | ((m0 <= b1 - other) & np.isfinite(m0))
        if forward:
            within &= positions > 0
            over &= positions > 0
        layers.append((within, over | within))
    return layers if forward else layers[::-1]


def second_bound(problem: IntervalProblem, b1: float) -> float:
    """The least ``B2`` such that some split has every stage within ``b1`` and all but one within
    ``B2``: the order's least second-slowest stage (to ``_REL_TOL``)."""
    lo, hi = 0.0, b1
    while hi - lo > _REL_TOL * max(b1, 1e-300):
        mid = (lo + hi) / 2
        if reach_one_over(problem, b1, mid, forward=True)[-1][1][-1]:
            hi = mid
        else:
            lo = mid
    return hi
