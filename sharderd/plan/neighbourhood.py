"""Past the DP's limits: the same DP over the cuts near a plan's cuts (a large-neighbourhood search).

A plan of ``k`` contiguous stages of some topological order has cuts at positions ``c_1..c_{k-1}``.
Every node within ``w`` positions of a cut is set free: the family of cut ideals is, for each cut,
every ideal ``X`` with ``prefix(c - w) ⊆ X ⊆ prefix(c + w)`` (prefixes of a topological order are
ideals), and the DP of ``group_ideals`` finds the best split whose every cut is in that family.
Whole branches move across a cut this way, or a cut takes the first half of every branch, which
no order offers. The old plan's cuts are in the family when they keep groups together, so a round
never loses; rounds re-centre on the new cuts while they gain. ``w`` starts at the widest that
keeps windows apart (half of the shorter stage beside each cut) and halves until each window's
lattice is within its share of the limit.

Optimal over that neighbourhood only: the report says so, and ``proven_optimal`` needs the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sharderd.plan.build import canonical_order
from sharderd.plan.contract import Groups, refine
from sharderd.plan.group_ideals import MAX_GROUP_IDEALS, enumerate_ideals, solve_groups
from sharderd.plan.ideals import IdealSplit
from sharderd.plan.problem import Problem

__all__ = ["MAX_ROUNDS", "MAX_WINDOW", "Neighbourhood", "search_near"]

MAX_ROUNDS = 4
MAX_WINDOW = 512
"""Nodes on each side of a cut; wider windows rarely fit the lattice limit anyway."""


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    assignment: np.ndarray | None
    """int64 [N]: the best split found, or None when no round beat the starting plan."""
    bottleneck_s: float
    window: int
    """Nodes on each side of a cut that the last round set free (at most; fewer beside a short stage)."""
    ideals: int
    rounds: int


def search_near(
    problem: Problem,
    groups: Groups,
    order: np.ndarray,
    bounds: tuple[int, ...],
    *,
    upper_bound: float,
) -> Neighbourhood | None:
    """Rounds of the DP around the cuts of the plan ``bounds`` of ``order``; None if no window fits."""
    best: Neighbourhood | None = None
    for round_no in range(1, MAX_ROUNDS + 1):
        found = _one_round(problem, groups, order, bounds, upper_bound=upper_bound)
        if found is None:
            break
        window, ideals, split = found
        if (
            split is None
            or split.assignment is None
            or split.bottleneck_s >= upper_bound * (1 - 1e-9)
        ):
            if best is None:
                best = Neighbourhood(None, upper_bound, window, ideals, round_no)
            break
        best = Neighbourhood(split.assignment, split.bottleneck_s, window, ideals, round_no)
        upper_bound = split.bottleneck_s
        order = canonical_order(split.assignment, problem.reference)
        counts = np.bincount(split.assignment, minlength=problem.devices)
        bounds = (0, *np.cumsum(counts).tolist())
    return best


def _one_round(
    problem: Problem,
    groups: Groups,
    order: np.ndarray,
    bounds: tuple[int, ...],
    *,
    upper_bound: float,
) -> tuple[int, int, IdealSplit] | None:
    n, k = len(order), problem.devices
    cuts = np.asarray(bounds[1:-1], dtype=np.int64)
    if not len(cuts):
        return None
    sizes = np.diff(np.asarray(bounds, dtype=np.int64))
    # Each cut's window reaches at most half into each stage beside it: windows never overlap.
    widest = np.minimum(np.minimum(sizes[:-1], sizes[1:]) // 2, MAX_WINDOW)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    share = MAX_GROUP_IDEALS // max(k - 1, 1)
    divisor = 1
    while (widest // divisor).max() >= 1:
        half = widest // divisor
        window = int(half.max())
        divisor *= 2
        # Segments along the order: before window 1, window 1, between, window 2, ...
        marks = np.stack([cuts - half, cuts + half], axis=1).ravel()
        segment = np.searchsorted(marks, pos, side="right")
        free = np.arange(2 * len(cuts) + 1) % 2 == 1  # the windows; the stretches between are fixed
        refined = refine(problem.analysis, groups, segment, free)
        seg_of_group = np.zeros(refined.count, dtype=np.int64)
        seg_of_group[refined.of_node] = segment
        family = [0]
        for s in range(len(cuts)):
            low = _mask(np.flatnonzero(seg_of_group < 2 * s + 1))
            high = low | _mask(np.flatnonzero(seg_of_group == 2 * s + 1))
            ideals = enumerate_ideals(refined, low, high, limit=share)
            if ideals is None:
                break
            family.extend(ideals)
        else:
            whole = (1 << refined.count) - 1
            family = [x for x in dict.fromkeys(family) if x != whole] + [whole]
            split = solve_groups(problem, refined, upper_bound=upper_bound, family=family)
            if split is not None:
                return window, len(family), split
    return None


def _mask(ids: np.ndarray) -> int:
    out = 0
    for g in ids.tolist():
        out |= 1 << g
    return out
