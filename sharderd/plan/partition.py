"""Exact min-max partition of one order into k contiguous stages under per-device memory caps.

Stage ``[i, j)`` takes ``T(i, j) = P[j] - P[i] + (cut[i] + cut[j]) / bw``, which separates into
``u(j) + v(i)`` with ``u = P + cut/bw`` and ``v = cut/bw - P``. Its memory (distinct weights +
peak live bytes + code per node) only grows when the interval grows, so for each end ``j`` the
starts that fit device ``s`` form a window ``[lo_s[j], j)`` with ``lo_s`` non-decreasing: one
two-pointer sweep finds it.

Feasibility of a bottleneck ``B`` is then a layered reachability: end ``j`` is reachable with
``s`` stages iff some start ``i`` reachable with ``s-1`` stages lies in the window and
``v(i) <= B - u(j)``. A sparse table answers the windowed minimum of ``v`` over reachable starts
for all ``j`` at once, so one probe costs O(k n log n) in numpy. Bisection on ``B`` converges to
the optimum over this order; the reconstructed plan is exact up to floating-point tolerance.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from sharderd.plan.ordered_costs import OrderedCosts

__all__ = [
    "IntervalProblem",
    "Partition",
    "interval_problem",
    "memory_window",
    "range_min",
    "reach",
    "solve",
    "sparse_min",
    "stage_ends",
]

_REL_TOL = 1e-10


@dataclass(frozen=True, slots=True)
class Partition:
    bounds: tuple[int, ...]
    """Stage s covers positions [bounds[s], bounds[s+1]); bounds[0] = 0, bounds[-1] = n."""
    bottleneck_s: float
    probes: int
    balanced: bool = False
    """The stages after the slowest are leximax-least over the order's splits (``balance_order``);
    False: they are what the bisection's greedy reconstruction left."""


def memory_window(oc: OrderedCosts, cap: float) -> np.ndarray:
    """lo[j] = the smallest start i such that positions [i, j) fit in ``cap`` bytes (j if none)."""
    n = oc.n
    lo = np.zeros(n + 1, dtype=np.int64)
    w_ptr = oc.w_ptr.tolist()
    w_idx = oc.w_idx.tolist()
    wbytes = oc.weight_bytes.tolist()
    live = oc.live_bytes.tolist()
    code = oc.code_prefix.tolist()
    counts = [0] * len(wbytes)
    weights = 0
    peak: deque[int] = deque()
    i = 0
    for j in range(1, n + 1):
        q = j - 1
        for w in w_idx[w_ptr[q] : w_ptr[q + 1]]:
            if counts[w] == 0:
                weights += wbytes[w]
            counts[w] += 1
        while peak and live[peak[-1]] <= live[q]:
            peak.pop()
        peak.append(q)
        while i <= q and weights + live[peak[0]] + code[j] - code[i] > cap:
            for w in w_idx[w_ptr[i] : w_ptr[i + 1]]:
                counts[w] -= 1
                if counts[w] == 0:
                    weights -= wbytes[w]
            if peak[0] == i:
                peak.popleft()
            i += 1
        lo[j] = i
    return lo


def sparse_min(values: np.ndarray) -> np.ndarray:
    levels = max(1, int(np.floor(np.log2(len(values)))) + 1)
    table = np.full((levels, len(values)), np.inf)
    table[0] = values
    for level in range(1, levels):
        half = 1 << (level - 1)
        table[level, : len(values) - half] = np.minimum(
            table[level - 1, :-half], table[level - 1, half:]
        )
    return table


def range_min(table: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min over [a, b] inclusive for each query; +inf where a > b."""
    empty = a > b
    length = np.where(empty, 1, b - a + 1)
    level = np.floor(np.log2(length)).astype(np.int64)
    a_ok = np.where(empty, 0, a)
    right = np.where(empty, 0, b - (1 << level) + 1)
    result = np.minimum(table[level, a_ok], table[level, right])
    result[empty] = np.inf
    return result


@dataclass(frozen=True, slots=True)
class IntervalProblem:
    u: np.ndarray
    v: np.ndarray
    lo: tuple[np.ndarray, ...]
    """Per stage: the memory window start for each end."""
    hi: np.ndarray
    """The latest start that leaves a stage at least one costed node (or the end - 1)."""
    cut: np.ndarray
    """Bytes crossing each cut."""


def reach(problem: IntervalProblem, bound: float) -> list[np.ndarray] | None:
    """layers[s][j]: positions [0, j) split into s stages, each within ``bound`` and its window."""
    n1 = len(problem.u)
    ok = np.zeros(n1, dtype=bool)
    ok[0] = True
    layers = [ok]
    ends = np.arange(n1)
    for lo in problem.lo:
        masked = np.where(ok, problem.v, np.inf)
        best = range_min(sparse_min(masked), lo, problem.hi)
        ok = np.isfinite(best) & (best <= bound - problem.u) & (ends > 0)
        if not ok.any():
            return None
        layers.append(ok)
    return layers if layers[-1][-1] else None


def _reconstruct(
    problem: IntervalProblem, layers: list[np.ndarray], bound: float
) -> tuple[int, ...]:
    bounds = [len(problem.u) - 1]
    j = bounds[0]
    for s in range(len(problem.lo), 0, -1):
        lo, hi = int(problem.lo[s - 1][j]), int(problem.hi[j])
        starts = np.arange(lo, hi + 1)
        ok = layers[s - 1][lo : hi + 1] & (problem.v[lo : hi + 1] <= bound - problem.u[j])
        candidates = starts[ok]
        # Every valid start keeps the bottleneck. Prefer the cheapest cut (a layer boundary, not
        # the inside of an attention block), then the start that leaves an even share of the work
        # to the stages still to place, so stages off the critical path balance too.
        cut = problem.cut[candidates]
        candidates = candidates[cut <= cut.min() * (1 + 1e-6)]
        times = problem.u[j] + problem.v[candidates]
        share = (problem.u[j] - problem.u[0]) / s
        i = int(candidates[np.argmin(np.abs(times - share))])
        bounds.append(i)
        j = i
    return tuple(reversed(bounds))


def stage_ends(oc: OrderedCosts, k: int, *, require_costed: bool) -> np.ndarray:
    """hi[j]: the latest start for a stage ending at j."""
    n = oc.n
    hi = np.arange(-1, n, dtype=np.int64)  # hi[j] = j - 1: a stage is never empty
    if require_costed:
        positions = np.where(oc.costed, np.arange(n), -1)
        last_costed = np.maximum.accumulate(positions)
        hi[1:] = last_costed
    return hi


def interval_problem(
    oc: OrderedCosts, caps: np.ndarray, *, require_costed: bool
) -> IntervalProblem:
    """The stage times and windows of ``oc``'s order under ``caps``, as every probe reads them."""
    windows: dict[float, np.ndarray] = {}
    for cap in caps.tolist():
        if cap not in windows:
            windows[cap] = memory_window(oc, cap)
    bw = oc.link_bytes_per_s
    return IntervalProblem(
        u=oc.prefix_time + oc.cut_bytes / bw,
        v=oc.cut_bytes / bw - oc.prefix_time,
        lo=tuple(windows[c] for c in caps.tolist()),
        hi=stage_ends(oc, len(caps), require_costed=require_costed),
        cut=oc.cut_bytes,
    )


def solve(oc: OrderedCosts, caps: np.ndarray, *, require_costed: bool) -> Partition | None:
    """The min-max partition into ``len(caps)`` stages, stage s within ``caps[s]`` bytes.

    Returns None when no partition fits the caps (the caller explains why).
    """
    k = len(caps)
    problem = interval_problem(oc, caps, require_costed=require_costed)
    probes = 1
    layers = reach(problem, np.inf)
    if layers is None:
        return None
    hi_bound = _bottleneck(oc, _reconstruct(problem, layers, np.inf))
    best = _reconstruct(problem, layers, np.inf)
    total = float(oc.prefix_time[-1])
    lo_bound = max(total / k, float(oc.node_time.max()) if oc.n else 0.0) * (1 - _REL_TOL)
    while hi_bound - lo_bound > _REL_TOL * max(hi_bound, 1e-300):
        mid = (lo_bound + hi_bound) / 2
        probes += 1
        layers = reach(problem, mid)
        if layers is None:
            lo_bound = mid
        else:
            best = _reconstruct(problem, layers, mid)
            hi_bound = _bottleneck(oc, best)
    return Partition(bounds=best, bottleneck_s=_bottleneck(oc, best), probes=probes)


def _bottleneck(oc: OrderedCosts, bounds: tuple[int, ...]) -> float:
    return max(oc.stage_time(a, b) for a, b in itertools.pairwise(bounds))
