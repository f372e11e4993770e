"""``--optimal-perf``: which variants of a compiled plan the search compiles, and which planned
split is worth a compile at all (``search.learn`` asks; docs/search.md)."""

from __future__ import annotations

from dataclasses import replace

from sharderd.plan.observations import AttemptKey
from sharderd.plan.search_state import Attempt, SearchState, Started

__all__ = ["PERF_BAND", "perf_variants", "worth_compiling"]

PERF_BAND = 0.9
"""``--optimal-perf`` compiles a variant only if its predicted time, calibrated by the best ratio of
measured to predicted so far, is 10% under the best measured period: the cost model's error between
two splits of one model is of that order, so a smaller predicted gain is a coin toss."""


def perf_variants(s: SearchState, best: Started) -> tuple[Attempt, ...]:
    if best.period_s is None:
        return ()
    margins = sorted({s.margin, *s.settings.speculative_margins})
    base = s.plan_attempt()
    return tuple(
        replace(base, kind="perf", label="optimal-perf variant", margin=m, orders=o)
        for m in margins
        for o in (None, ("file",), ("depth_first",))
    )


def worth_compiling(
    state: SearchState, attempt: Attempt, key: AttemptKey, predicted_s: float
) -> bool:
    """Whether a planned split is worth a compile: never a tried one; under ``--optimal-perf`` a
    variant only if its calibrated prediction beats the best measured period (``PERF_BAND``)."""
    if key in state.tried():
        return False
    if attempt.kind != "perf":
        return True
    measured = [a for a in state.attempts if a.period_s and a.predicted_s > 0]
    best = state.best()
    if best is None or best.period_s is None or not measured:
        return False
    ratio = min(a.period_s / a.predicted_s for a in measured if a.period_s)
    return predicted_s * ratio * PERF_BAND < best.period_s
