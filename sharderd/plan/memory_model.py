"""The memory model the compiles imply, derived from every observation each time.

What a compile measured is attached to the nodes its device held (``plan.content``), not to the
device index: the same layers overflow wherever a re-plan puts them. The model is rebuilt from all
observations each time (never by multiplying the last correction), so a factor can come down as
well as up. Three of the search's five constants live here; docs/search.md has the rules in prose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import Observation, runs_minus, runs_within

__all__ = ["HEADROOM", "NOISE", "UNKNOWN_OVER", "amp_closing", "content_model", "stage_factor"]

HEADROOM = 1.05
"""A re-plan aims each measured stage this far above what the compiler measured. A factor fitted
to exactly the measurement puts the next split on the edge of the same overflow; 5% is a
re-plan's slack, small against the 10-40% errors an overflow reveals, so it costs little speed.
(Also the step by which a re-plan that reproduces a tried split grows the last overflow.)"""
NOISE = 0.03
"""Two readings of a share of a device closer than this are one reading: a compiler's worst tile
moves by a few percent with tile mapping alone. A verdict takes the noise in the model's favour;
nested stages that differ by less say nothing about the nodes between them."""
UNKNOWN_OVER = 1.25
"""An out-of-memory report without bytes is taken as a worst tile this far over capacity: the
compiler says only "over", and a guess between the small excesses re-plans fix and the large
ones no factor fixes keeps the search moving without claiming either. Never grounds of a proof."""
_JUST_OVER = 1.0 + 1e-6
"""Not tuned: the least over capacity the verdict's model keeps an overflowed stage at."""
_HOPELESS = 1e6
"""Not tuned: the factor of a stage whose code alone overflowed (nothing holds its nodes)."""


def stage_factor(o: Observation, measured: float) -> float:
    """The factor on a stage's bytes that makes it measure ``measured`` (× capacity): code is a
    per-node constant the correction does not scale, so ``code + factor × rest = measured``."""
    assert o.stage is not None
    code, rest = o.stage.code, o.stage.rest
    if rest <= 1e-12:
        return _HOPELESS if measured > code else 1.0
    return max((measured - code) / rest, 1e-6)


def _measured(o: Observation) -> float:
    return o.measured if o.measured is not None else UNKNOWN_OVER


def content_model(
    observations: Sequence[Observation], *, amp: float, estimate: bool = False, exact: bool = False
) -> ContentCorrection:
    """The per-node correction the overflows at ``amp`` imply (a fit teaches no bytes).

    For planning, each measurement aims ``HEADROOM`` above itself; ``exact`` takes it as measured. With ``estimate`` (the model
    a "not proven" rests on) it is taken as measured with the ``NOISE`` in the model's favour, but
    an overflow stays one: the very stage that ran out of memory is never predicted to fit.
    Two nested overflows whose sizes and readings differ beyond the noise price the nodes between
    them; what the inner one measures beyond that rate is a fixed cost going with its nodes.
    """

    def aim(o: Observation) -> float:
        m = _measured(o)
        if exact:
            return m
        return max(m * (1.0 - NOISE), _JUST_OVER) if estimate else m * HEADROOM

    chains: list[_Overflow] = []
    between: list[tuple[tuple[tuple[int, int], ...], float]] = []
    at = [o for o in observations if o.amp == amp and o.stage is not None and not o.fits]
    for o in sorted(at, key=lambda o: o.attempt):
        for i, chain in enumerate(chains):
            nested = _nested(chain.observation, o, aim)
            if nested is not None:
                difference, factor, inner = nested
                between.append((difference, factor))
                assert inner.stage is not None
                fixed = aim(inner) - inner.stage.code - factor * inner.stage.rest
                chains[i] = (
                    _Overflow(inner, factor, fixed)
                    if fixed > NOISE
                    else _Overflow(inner, stage_factor(inner, aim(inner)), 0.0)
                )
                break
        else:
            chains.append(_Overflow(o, stage_factor(o, aim(o)), 0.0))
    return ContentCorrection(
        1.0,
        tuple((c.nodes, c.factor) for c in chains),
        tuple(between),
        tuple((c.nodes, c.fixed) for c in chains if c.fixed > 0),
        fixed_on_heaviest=estimate,
    )


@dataclass(frozen=True, slots=True)
class _Overflow:
    """The latest of a chain of nested overflows: its nodes' factor and any fixed cost."""

    observation: Observation
    factor: float
    fixed: float

    @property
    def nodes(self) -> tuple[tuple[int, int], ...]:
        assert self.observation.stage is not None
        return self.observation.stage.runs


def _nested(
    a: Observation, b: Observation, aim: Callable[[Observation], float]
) -> tuple[tuple[tuple[int, int], ...], float, Observation] | None:
    """(outer's nodes not in the inner, their factor, the inner) when one stage holds the other
    and their predictions and readings differ beyond ``NOISE``; else None."""
    assert a.stage is not None and b.stage is not None
    if a.measured is None or b.measured is None:
        return None
    if runs_within(b.stage.runs, a.stage.runs):
        outer, inner = a, b
    elif runs_within(a.stage.runs, b.stage.runs):
        outer, inner = b, a
    else:
        return None
    assert outer.stage is not None and inner.stage is not None
    assert outer.measured is not None and inner.measured is not None
    if outer.stage.predicted - inner.stage.predicted < NOISE:
        return None
    if abs(outer.measured - inner.measured) < NOISE:
        return None
    rest = outer.stage.rest - inner.stage.rest
    dm = aim(outer) - aim(inner) - (outer.stage.code - inner.stage.code)
    if rest <= 1e-12 or dm <= 0:
        return None
    difference = runs_minus(outer.stage.runs, inner.stage.runs)
    return (difference, dm / rest, inner) if difference else None


def amp_closing(need: float, amp: float, fallbacks: Sequence[float]) -> float | None:
    """The highest fallback below ``amp`` that can bring a worst tile needing ``need`` (× its
    capacity) under capacity, if any.

    PopART's ``available_memory_proportion`` caps the conv/matmul planner's temporary memory per
    tile, as a share of the tile (a cap the planner may exceed when nothing fits under it). The
    worst tile's temporaries were planned under ``amp``; a lower cap can remove only what was
    above it, so at most ``amp - lower`` of the tile: never a linear scale of the tile."""
    for lower in sorted((a for a in fallbacks if a < amp), reverse=True):
        if need - (amp - lower) <= 1.0:
            return lower
    return None
