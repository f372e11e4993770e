"""Balance beyond the bottleneck on one order: among the splits of an order into contiguous stages
whose slowest stage is the bisection's optimum ``B``, the leximax-least one (``leximax.py``: the
next slowest stage least, then the next, and so on).

The bisection (``partition.solve``) finds ``B`` and the layers of ends reachable within it; this is
a DP over the order's positions with the same stage time ``T(i, j) = u(j) + v(i)``, windows and
caps, that keeps per end ``j`` and stage count the leximax-least vector of stage times instead of a
yes/no. Exact over the order's contiguous splits with every stage within ``B`` (leximax's
principle of optimality), and only the pairs ``(i, j)`` that lie on some such split are formed:
``i`` reachable forward with ``s`` stages, ``j`` forward with ``s + 1`` and backward with the rest,
and ``P(j) − P(i) ≤ B``. When the stages are balanced that is a narrow band around each cut; when
one stage holds ``B`` far above the others the bands widen, and past ``MAX_PAIRS`` the greedy
reconstruction of the bisection stands (``Partition.balanced`` False, and the claim says so).
"""

from __future__ import annotations

import itertools

import numpy as np

from sharderd.plan.leximax import EMPTY, first_per_group, grid_of, push, quantise
from sharderd.plan.ordered_costs import OrderedCosts
from sharderd.plan.partition import (
    IntervalProblem,
    Partition,
    interval_problem,
    range_min,
    reach,
    sparse_min,
)
from sharderd.plan.second_stage import reach_one_over, second_bound

__all__ = ["MAX_PAIRS", "balance_order", "candidate_pairs", "one_over_pairs", "window_pairs"]

MAX_PAIRS = 4_000_000
"""(start, end) candidates over all stages: ~1 s of numpy sorting; beyond it the greedy split stands."""
_SLACK = 1e-9
"""The bisection stops within 1e-10 of the optimum: stages within ``B × (1 + _SLACK)`` count."""


def balance_order(
    oc: OrderedCosts, caps: np.ndarray, found: Partition, *, require_costed: bool
) -> Partition | None:
    """The leximax-least split of ``oc``'s order whose every stage is within ``found``'s
    bottleneck; None when past ``MAX_PAIRS`` (``found`` stands)."""
    problem = interval_problem(oc, caps, require_costed=require_costed)
    bound = found.bottleneck_s * (1 + _SLACK)
    forward = reach(problem, bound)
    if forward is None:  # cannot happen: ``found`` is within the bound
        return None
    back = _reach_back(problem, bound)
    k, n1 = len(caps), len(problem.u)
    rows, total = candidate_pairs(problem, oc.prefix_time, forward, back, bound)
    if total > MAX_PAIRS:  # one stage far above the rest: only narrow bands can hold the others
        b2 = second_bound(problem, bound)
        rows, total = one_over_pairs(problem, oc.prefix_time, bound, b2)
    if total > MAX_PAIRS:
        return None
    prefix = oc.prefix_time
    step = grid_of(float(prefix[-1]))
    vec = np.full((n1, k), EMPTY, dtype=np.int64)
    parents: list[np.ndarray] = []
    for s, (i, j) in enumerate(rows):
        if s:  # a start no split reaches has no vector yet (every kept pair's start has one)
            placed = vec[i, 0] != EMPTY
            i, j = i[placed], j[placed]
        vectors = push(vec[i], quantise(problem.u[j] + problem.v[i], step))
        # Ties: the cheapest cut into the stage (a layer boundary, not the inside of a block).
        order, starts = first_per_group(j, vectors, problem.cut[i])
        pick = order[starts]
        new = np.full((n1, k), EMPTY, dtype=np.int64)
        new[j[pick]] = vectors[pick]
        parent = np.full(n1, -1, dtype=np.int64)
        parent[j[pick]] = i[pick]
        vec = new
        parents.append(parent)
    bounds = [n1 - 1]
    for parent in reversed(parents):
        bounds.append(int(parent[bounds[-1]]))
    if min(bounds) < 0:  # cannot happen: every end kept has a start
        return None
    cuts = tuple(reversed(bounds))
    worst = max(oc.stage_time(a, b) for a, b in itertools.pairwise(cuts))
    return Partition(bounds=cuts, bottleneck_s=worst, probes=found.probes, balanced=True)


def candidate_pairs(
    problem: IntervalProblem,
    prefix: np.ndarray,
    forward: list[np.ndarray],
    back: list[np.ndarray],
    bound: float,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Per stage, the (start, end) pairs on some split within ``bound``, and how many candidates
    there are to weigh (the work ``MAX_PAIRS`` limits): counted first, formed only within it."""
    windows = [
        _windows(problem, prefix, s, forward[s + 1] & back[s + 1], bound)
        for s in range(len(problem.lo))
    ]
    total = sum(int(w[2].sum()) for w in windows)
    if total > MAX_PAIRS:
        return [], total
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    for s, window in enumerate(windows):
        i, j = _spread(*window)
        keep = forward[s][i] & (problem.v[i] <= bound - problem.u[j])
        rows.append((i[keep], j[keep]))
    return rows, total


def one_over_pairs(
    problem: IntervalProblem, prefix: np.ndarray, b1: float, b2: float
) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """``candidate_pairs`` for splits with every stage within ``b1`` and all but one within
    ``b2`` (``second_stage``): a pair within ``b2`` needs at most one stage above it elsewhere,
    a pair above ``b2`` none."""
    fwd = reach_one_over(problem, b1, b2, forward=True)
    back = reach_one_over(problem, b1, b2, forward=False)
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    total = 0
    for s in range(len(problem.lo)):
        (f0, f1), (g0, g1), (_, h1) = fwd[s], back[s + 1], fwd[s + 1]
        i, j = window_pairs(problem, prefix, s, h1 & g1, b2)
        low = problem.u[j] + problem.v[i]
        keep = (low <= b2 * (1 + _SLACK)) & ((f0[i] & g1[j]) | (f1[i] & g0[j]))
        hi_i, hi_j = window_pairs(problem, prefix, s, h1 & g0, b1)
        high = problem.u[hi_j] + problem.v[hi_i]
        over = f0[hi_i] & (high > b2 * (1 + _SLACK)) & (problem.v[hi_i] <= b1 - problem.u[hi_j])
        total += len(i) + len(hi_i)
        if total > MAX_PAIRS:
            break
        rows.append((np.r_[i[keep], hi_i[over]], np.r_[j[keep], hi_j[over]]))
    return rows, total


def window_pairs(
    problem: IntervalProblem, prefix: np.ndarray, s: int, ends_ok: np.ndarray, bound: float
) -> tuple[np.ndarray, np.ndarray]:
    """Every (start, end) with the end in ``ends_ok`` and the start in stage ``s``'s window and
    within ``bound`` of it in work (``T(i, j) >= P(j) - P(i)``), before any other test."""
    return _spread(*_windows(problem, prefix, s, ends_ok, bound))


def _windows(
    problem: IntervalProblem, prefix: np.ndarray, s: int, ends_ok: np.ndarray, bound: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``window_pairs`` as (ends, first start, count of starts) per end, not yet formed."""
    ends = np.flatnonzero(ends_ok)
    first = np.searchsorted(prefix, prefix[ends] - bound * (1 + _SLACK), side="left")
    lo = np.maximum(problem.lo[s][ends], first)
    return ends, lo, np.maximum(problem.hi[ends] - lo + 1, 0)


def _spread(ends: np.ndarray, lo: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    j = np.repeat(ends, counts)
    offset = np.arange(len(j)) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(lo, counts) + offset, j


def _reach_back(problem: IntervalProblem, bound: float) -> list[np.ndarray]:
    """back[s][i]: positions [i, n) split into stages s..k-1, each within ``bound`` and its window.

    ``partition.reach`` run from the end: for a start ``i`` the ends whose window holds it form
    one interval (``lo`` and ``hi`` never decrease), and a sparse table gives the least ``u`` over
    the ends reachable backwards in it."""
    n1, k = len(problem.u), len(problem.lo)
    positions = np.arange(n1)
    ok = positions == n1 - 1
    layers = [ok]
    for s in range(k - 1, -1, -1):
        lo = problem.lo[s]
        first = np.searchsorted(problem.hi, positions, side="left")
        last = np.searchsorted(lo, positions, side="right") - 1
        first = np.maximum(first, positions + 1)
        least = range_min(sparse_min(np.where(ok, problem.u, np.inf)), first, last)
        ok = np.isfinite(least) & (problem.v <= bound - least)
        layers.append(ok)
    return layers[::-1]
