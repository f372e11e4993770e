"""The fewest devices that keep a plan's predicted throughput: when one stage holds the
bottleneck (``held.py``), devices past a point buy nothing, and the others can stay free.

Device counts are tried from the smallest the lower bound allows (``bounds.py``: no split onto
``d`` devices beats ``max(W / d, ...)``, so a ``d`` whose bound is over the band needs no plan)
upwards, each planned as the plan was (same target, margin, costs); the first whose bottleneck is
within ``THROUGHPUT_BAND`` of the plan's is the answer, and its plan comes back with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sharderd.errors import NoSplitError
from sharderd.graph.analyze import Analysis
from sharderd.plan.bounds import lower_bound_all_splits
from sharderd.plan.types import Plan
from sharderd.target import Target

__all__ = ["FITTING_SEARCH", "THROUGHPUT_BAND", "Fewest", "fewest_devices", "first_fitting"]

THROUGHPUT_BAND = 0.01
"""Within 1% of the plan's predicted throughput counts as the same: the band the planner already
uses for "a different split is worth it" (``DP_GAIN``, ``LEVEL_ORDER_GAIN``). The cost model does
not rank two splits closer than that, so a device that buys less is not worth holding."""


@dataclass(frozen=True, slots=True)
class Fewest:
    devices: int
    plan: Plan
    """The plan on ``devices`` (the given plan itself when no fewer devices keep its throughput)."""
    planned: tuple[int, ...]
    """The device counts planned to find it (the lower bound ruled the others out)."""


def fewest_devices(
    analysis: Analysis,
    target: Target,
    compute_s: np.ndarray,
    plan: Plan,
    plan_on: Callable[[int], Plan],
) -> Fewest:
    """The smallest ``d <= plan.devices`` whose plan (``plan_on(d)``) is within the band."""
    limit = plan.bottleneck_s * (1 + THROUGHPUT_BAND)
    planned: list[int] = []
    for d in range(1, plan.devices):
        if lower_bound_all_splits(analysis, target, compute_s, d) > limit:
            continue
        planned.append(d)
        try:
            fewer = plan_on(d)
        except NoSplitError:
            continue
        if fewer.method != "overfull" and fewer.bottleneck_s <= limit:
            return Fewest(d, fewer, tuple(planned))
    return Fewest(plan.devices, plan, tuple(planned))


FITTING_SEARCH = 8
"""Device counts past the one asked for that ``first_fitting`` plans, at most. A hint names a
count only when the planner found a split that fits there; past 8 more devices the user is
better served by "more devices" than by waiting for more plans."""


def first_fitting(devices: int, plan_on: Callable[[int], Plan], limit: int) -> int | None:
    """The smallest count in ``devices + 1 .. min(devices + FITTING_SEARCH, limit)`` whose plan
    (``plan_on``) fits the estimate (no ``overfull`` method, no error), or None. The hint after an
    overfull plan names it, so that rerunning as told finds a split instead of asking for one more
    device again (the floor of ``infeasible.py`` counts weights and code, not the activations
    the order's cut points leave)."""
    for count in range(devices + 1, min(devices + FITTING_SEARCH, limit) + 1):
        try:
            plan = plan_on(count)
        except NoSplitError:
            continue
        if plan.method != "overfull":
            return count
    return None
