"""After the order search: the DP over the whole graph, contracted, or around the order plan's cuts.

``plan_stages`` plans a graph past the bit-mask DP's size on its candidate orders first; then
``improve`` runs the DP of ``group_ideals`` over the contracted graph with the order plan as the
bound to beat, and past that DP's limits the neighbourhood search around the order plan's cuts.
It returns the split to take (one ``DP_GAIN`` faster than the order plan, or any split when no
order had one), or, for the order plan that stands, what the DPs showed of it in words.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from sharderd.plan.claims import LEXICOGRAPHIC
from sharderd.plan.contract import Groups, contract
from sharderd.plan.group_ideals import solve_groups
from sharderd.plan.ideals import IdealSplit
from sharderd.plan.neighbourhood import Neighbourhood, search_near
from sharderd.plan.problem import Problem

__all__ = ["DP_GAIN", "Found", "improve"]

DP_GAIN = 0.01
"""A split from the DPs replaces the order plan only when this much faster (like the level order):
a cut of any shape for a hair's gain is not worth a stage boundary away from a layer's end."""


@dataclass(frozen=True, slots=True)
class Found:
    assignment: np.ndarray | None
    """int64 [N]: the split to take, or None: the order plan stands."""
    method: str
    """``ideals``, ``contracted`` or ``neighbourhood`` for a split to take."""
    claim: str
    """What the split is optimal over; for the order plan that stands, what the DPs showed."""
    proven: bool
    """Optimal over every valid split (the uncontracted DP found nothing faster, or took this)."""
    timings_s: dict[str, float] = field(default_factory=dict)


def improve(
    problem: Problem,
    *,
    start: tuple[np.ndarray, tuple[int, ...], str] | None,
    upper: float,
    skip: str | None,
) -> Found:
    """``start``: the order plan (its order, stage bounds, order name), None when none fits.
    ``skip``: why the DPs are not run, for the claim; None runs them."""
    if skip is not None:
        return Found(None, "", skip, False)
    timings: dict[str, float] = {}
    t1 = time.perf_counter()
    groups = contract(problem.analysis)
    grouped = solve_groups(problem, groups, upper_bound=upper)
    timings["solve.contracted"] = time.perf_counter() - t1
    if (
        grouped is not None
        and grouped.assignment is not None
        and grouped.bottleneck_s < upper * (1 - DP_GAIN)
    ):
        return Found(
            grouped.assignment,
            "contracted" if groups.merged else "ideals",
            _contracted_claim(grouped.ideals, groups),
            not groups.merged,
            timings,
        )
    near = None
    if grouped is None and start is not None:
        t1 = time.perf_counter()
        near = search_near(problem, groups, start[0], start[1], upper_bound=upper)
        timings["solve.neighbourhood"] = time.perf_counter() - t1
        if (
            near is not None
            and near.assignment is not None
            and near.bottleneck_s < upper * (1 - DP_GAIN)
        ):
            return Found(
                near.assignment,
                "neighbourhood",
                _near_claim(near, start[2], groups),
                False,
                timings,
            )
    proven = (
        grouped is not None
        and not groups.merged
        and (grouped.assignment is None or grouped.bottleneck_s >= upper * (1 - 1e-9))
    )
    return Found(None, "", _searched(grouped, groups, upper, near), proven, timings)


def _contracted_claim(ideals: int, groups: Groups) -> str:
    if groups.merged == 0:
        return f"optimal over every valid split (DP over all {ideals} ideals){LEXICOGRAPHIC}"
    return (
        f"optimal over the splits that keep shape arithmetic and constant-only nodes with their "
        f"neighbours ({len(groups.of_node)} nodes in {groups.count} groups; DP over {ideals} "
        f"ideals){LEXICOGRAPHIC}"
    )


def _near_claim(near: Neighbourhood, start: str, groups: Groups) -> str:
    rounds = f"{near.rounds} round{'s' if near.rounds > 1 else ''}"
    kept = ", keeping the contracted groups together" if groups.merged else ""
    return (
        f"optimal over the splits whose every cut lies within {_nodes(near.window)} of the "
        f"previous plan's cuts{kept} ({rounds} from the `{start}` order's plan; DP over "
        f"{near.ideals} ideals){LEXICOGRAPHIC}; not proven over every split: the DP over the "
        "whole graph was past its limits"
    )


def _searched(
    grouped: IdealSplit | None, groups: Groups, upper: float, near: Neighbourhood | None
) -> str:
    """What the DPs showed when the order search's plan stands."""
    if grouped is None:
        if near is not None:
            return (
                f"the DP over the contracted graph ({groups.count} groups) was past its limits; "
                f"none of the splits whose cuts lie within {_nodes(near.window)} of this plan's cuts "
                f"is {DP_GAIN:.0%} faster (DP over {near.ideals} ideals)"
            )
        return (
            f"the DP over the contracted graph ({groups.count} groups) was past its limits, "
            "so splits outside those orders were not searched"
        )
    over = (
        f"every valid split (DP over all {grouped.ideals} ideals)"
        if not groups.merged
        else f"the splits that keep the {groups.count} groups of the contracted graph together "
        f"(DP over its {grouped.ideals} ideals)"
    )
    if grouped.assignment is not None and grouped.bottleneck_s < upper * (1 - 1e-9):
        gain = 1 - grouped.bottleneck_s / upper
        return (
            f"the best of {over} is {gain:.2%} faster, under the {DP_GAIN:.0%} worth a stage "
            "boundary away from the order's layer ends, so the order's split is kept"
        )
    return f"none of {over} is faster"


def _nodes(count: int) -> str:
    return f"{count} node{'s' if count != 1 else ''}"
