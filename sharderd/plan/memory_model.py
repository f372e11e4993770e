"""The memory model the compiles imply, rebuilt from every observation each time (so a factor
can come down as well as up), attached to the nodes a device held (``plan.content``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import Observation, runs_minus, runs_within

__all__ = [
    "HEADROOM",
    "NOISE",
    "UNKNOWN_OVER",
    "amp_closing",
    "content_model",
    "overflow_need",
    "planned_factor",
    "stage_factor",
]

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
    """The factor on a stage's bytes with ``code + factor × rest = measured`` (code is not scaled)."""
    assert o.stage is not None
    code, rest = o.stage.code, o.stage.rest
    if rest <= 1e-12:
        return _HOPELESS if measured > code else 1.0
    return max((measured - code) / rest, 1e-6)


def overflow_need(o: Observation) -> float:
    """How far over its device an overflow measured (× capacity; ``UNKNOWN_OVER`` when the
    compiler said no bytes)."""
    return o.measured if o.measured is not None else UNKNOWN_OVER


def planned_factor(o: Observation) -> float:
    """The factor an overflowed stage's nodes are planned with: its measurement aimed
    ``HEADROOM`` above (``content_model``'s reading of one overflow, and the report's)."""
    return stage_factor(o, overflow_need(o) * HEADROOM)


def content_model(
    observations: Sequence[Observation], *, amp: float, estimate: bool = False, exact: bool = False
) -> ContentCorrection:
    """The per-node correction the overflows at ``amp`` imply (a fit teaches no bytes).

    Each measurement is aimed ``HEADROOM`` above itself for planning; ``exact`` takes it as is;
    ``estimate`` (the model a "not proven" rests on) gives the ``NOISE`` in the model's favour
    but keeps every overflowed stage over capacity. Two nested overflows price the nodes between
    them; what the inner one measures beyond that rate is a fixed cost going with its nodes.
    """

    def aim(o: Observation) -> float:
        m = overflow_need(o)
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
    and both predictions and readings differ beyond ``NOISE``."""
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
    capacity) under capacity, if any. PopART's ``available_memory_proportion`` caps conv/matmul
    temporaries per tile; a lower cap removes only what was above it: at most ``amp - lower``."""
    for lower in sorted((a for a in fallbacks if a < amp), reverse=True):
        if need - (amp - lower) <= 1.0:
            return lower
    return None
