"""The memory model the compiles imply, derived from every observation each time.

Never by multiplying the last correction, so a factor can come down as well as up. What a compile
measured is attached to the nodes its device held (``plan.content``), not to the device index:
the same layers overflow wherever a re-plan puts them, and another device's contents say
nothing certain of theirs. docs/search.md has the rules in prose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from sharderd.plan.content import ContentCorrection
from sharderd.plan.observations import Observation, Runs, runs_minus, runs_within

__all__ = [
    "FIT_MIN_MEASURED_SPREAD",
    "FIT_MIN_OVERLAP",
    "FIT_MIN_PREDICTED_SPREAD",
    "HEADROOM",
    "HOPELESS",
    "OOM_FLOOR",
    "SYSTEMIC_AGREEMENT",
    "SYSTEMIC_CAP",
    "UNKNOWN_OVER",
    "UNMEASURED_SHARE",
    "cautious",
    "content_model",
    "hypothesis",
    "stage_factor",
    "systemic_ratio",
]

HEADROOM = 1.05
"""Corrected sizes aim this much over what the compiler measured, so the re-plan has slack."""
UNKNOWN_OVER = 1.25
"""An OOM without bytes is taken as a worst tile this far over capacity."""
SYSTEMIC_AGREEMENT = 1.2
"""Factors of stages with different contents within this factor of each other are "the same"."""
SYSTEMIC_CAP = 2.0
"""A systemic factor never exceeds this: it is a guess for nodes no compile has measured."""
FIT_MIN_OVERLAP = 0.5
"""Stages sharing less than this share of the smaller one's nodes count as different contents."""
FIT_MIN_MEASURED_SPREAD = 0.03
"""Below this share of a tile, two measurements differ by compiler noise: a verdict gives it to
the model's favour."""
FIT_MIN_PREDICTED_SPREAD = 0.1
"""Two nested stages whose predictions differ by less than this share of the larger say nothing
about the nodes between them."""
OOM_FLOOR = 1.001
"""What the verdict's model keeps an overflow at, however close to capacity it was measured."""
UNMEASURED_SHARE = 0.5
"""A verdict check takes the nodes no compile measured this share (geometrically) of the way
from the factor the model gives them (1, or a systemic factor) to the worst measured one: an OOM
names one device, and the others' error is rarely what the model assumes nor all of the worst."""
HOPELESS = 1e6
"""A factor so large nothing fits: the stage's code alone overflowed."""


def stage_factor(o: Observation, measured: float) -> float:
    """The factor on a stage's bytes that makes it measure ``measured`` (× capacity).

    Code is a per-node constant of the target the correction does not scale, so the factor
    applies to the rest: ``code + factor × rest = measured``.
    """
    assert o.stage is not None
    code, rest = o.stage.code, o.stage.rest
    if rest <= 1e-12:
        return HOPELESS if measured > code else 1.0
    return max((measured - code) / rest, 1e-6)


def _measured(o: Observation) -> float:
    return o.measured if o.measured is not None else UNKNOWN_OVER


def _at(observations: Sequence[Observation], amp: float) -> list[Observation]:
    return [o for o in observations if o.amp == amp and o.stage is not None and o.stage.nodes()]


def systemic_ratio(observations: Sequence[Observation], *, amp: float) -> float | None:
    """The shared factor of overflows with different contents, when they agree; else None.

    Two stages that ran out of memory with (mostly) different nodes and the same factor within
    ``SYSTEMIC_AGREEMENT`` make one systemic factor, the smaller of them, bounded by
    ``SYSTEMIC_CAP``: a guess for nodes no compile measured, given once (never compounded).
    """
    ooms = [o for o in _at(observations, amp) if not o.fits and o.measured is not None]
    distinct: list[tuple[Observation, float]] = []
    for o in sorted(ooms, key=lambda o: o.attempt):
        assert o.stage is not None
        factor = stage_factor(o, _measured(o))
        same = [
            i
            for i, (d, _) in enumerate(distinct)
            if d.stage is not None and d.stage.overlap(o.stage) >= FIT_MIN_OVERLAP
        ]
        if same:  # a shrunk or grown version of a stage already counted: keep the larger
            i = same[0]
            distinct[i] = (o, max(factor, distinct[i][1]))
        else:
            distinct.append((o, factor))
    factors = [f for _, f in distinct]
    if len(factors) >= 2 and max(factors) / min(factors) <= SYSTEMIC_AGREEMENT:
        return min(min(factors), SYSTEMIC_CAP)
    return None


def content_model(
    observations: Sequence[Observation], *, amp: float, estimate: bool = False
) -> ContentCorrection:
    """The per-node correction the observations at ``amp`` imply.

    For planning, each measurement aims ``HEADROOM`` above itself. With ``estimate`` (what a
    verdict may rest on) it is taken as measured with the noise in the model's favour, except
    that an overflow stays one (``OOM_FLOOR``): the very stage that ran out of memory is never
    predicted to fit, so it is not compiled again; a stage that holds fewer of its nodes may be.
    """
    at = _at(observations, amp)

    def aim(measured: float) -> float:
        return measured * (1.0 - FIT_MIN_MEASURED_SPREAD) if estimate else measured * HEADROOM

    chains: list[_Overflow] = []
    measured: list[tuple[Runs, float]] = []
    for o in sorted(at, key=lambda o: o.attempt):
        assert o.stage is not None
        if o.fits:  # a fit says the split fits; no backend reports its bytes
            continue
        for i, chain in enumerate(chains):
            nested = _nested(chain.observation, o, aim)
            if nested is not None:
                difference, factor, inner = nested
                measured.append((difference, factor))
                chains[i] = _fixed_cost(inner, factor, aim)
                break
        else:
            chains.append(_Overflow(o, stage_factor(o, aim(_measured(o))), 0.0))
    patches = tuple((c.nodes, c.factor) for c in chains)
    if estimate:  # an overflow given the noise still overflows, by the least amount
        patches += tuple(
            (o.stage.nodes(), stage_factor(o, OOM_FLOOR))
            for o in at
            if o.stage is not None and not o.fits and aim(_measured(o)) < OOM_FLOOR
        )
    fixed = tuple((c.nodes, c.fixed) for c in chains if c.fixed > 0)
    systemic = systemic_ratio(observations, amp=amp)
    base = 1.0
    if systemic is not None and systemic > 1.0:
        base = max(1.0, systemic * (1.0 - FIT_MIN_MEASURED_SPREAD) if estimate else systemic)
    return ContentCorrection(base, patches, tuple(measured), fixed, fixed_on_heaviest=estimate)


@dataclass(frozen=True, slots=True)
class _Overflow:
    """The latest of a chain of nested overflows: its nodes' factor and any fixed cost."""

    observation: Observation
    factor: float
    fixed: float
    """Capacity share that comes with the stage's nodes whatever their count (one op's code)."""

    @property
    def nodes(self) -> Runs:
        assert self.observation.stage is not None
        return self.observation.stage.nodes()


def _fixed_cost(inner: Observation, factor: float, aim: Callable[[float], float]) -> _Overflow:
    """The inner of two nested overflows: the nodes between them cost ``factor`` per byte; what
    the inner stage measures beyond that rate is a fixed cost that goes with its nodes."""
    assert inner.stage is not None
    fixed = aim(_measured(inner)) - inner.stage.code - factor * inner.stage.rest
    if fixed <= FIT_MIN_MEASURED_SPREAD:
        return _Overflow(inner, stage_factor(inner, aim(_measured(inner))), 0.0)
    return _Overflow(inner, factor, fixed)


def _nested(
    a: Observation, b: Observation, aim: Callable[[float], float]
) -> tuple[Runs, float, Observation] | None:
    """Two overflows, one stage inside the other, whose sizes and measurements differ beyond the
    noise: the nodes between them cost the difference (``FIT_MIN_*``), so a fixed cost (one op's
    code or exchange) is charged to the nodes that hold it, not spread over the bigger stage.

    Returns (nodes of the outer stage not in the inner one, their factor, the inner observation).
    """
    assert a.stage is not None and b.stage is not None
    if a.measured is None or b.measured is None:
        return None
    na, nb = a.stage.nodes(), b.stage.nodes()
    if runs_within(nb, na):
        outer, inner = a, b
    elif runs_within(na, nb):
        outer, inner = b, a
    else:
        return None
    assert outer.stage is not None and inner.stage is not None
    assert outer.measured is not None and inner.measured is not None
    dp = outer.stage.predicted - inner.stage.predicted
    if dp < FIT_MIN_PREDICTED_SPREAD * outer.stage.predicted:
        return None
    if abs(outer.measured - inner.measured) < FIT_MIN_MEASURED_SPREAD:
        return None
    code = outer.stage.code - inner.stage.code
    rest = outer.stage.rest - inner.stage.rest
    dm = aim(outer.measured) - aim(inner.measured) - code
    if rest <= 1e-12 or dm <= 0:
        return None
    difference = runs_minus(outer.stage.nodes(), inner.stage.nodes())
    return (difference, dm / rest, inner) if difference else None


def hypothesis(observations: Sequence[Observation], *, amp: float) -> ContentCorrection | None:
    """A speculative variant: the largest overflow factor seen given to every unmeasured node.

    Not a belief (one stage's factor says nothing certain of other nodes) but a cheap bet for a
    free pool slot, bounded by ``SYSTEMIC_CAP``. None when it would change nothing.
    """
    model = content_model(observations, amp=amp)
    if not model.patches or model.base > 1.0:
        return None
    guess = min(max(f for _, f in model.patches), SYSTEMIC_CAP)
    if guess <= 1.0:
        return None
    return replace(model, base=guess)


def cautious(model: ContentCorrection) -> ContentCorrection | None:
    """``model`` with the nodes no compile measured (its ``base``) taken ``UNMEASURED_SHARE`` of
    the way to its worst factor (bounded by ``SYSTEMIC_CAP``); None when that changes nothing.

    Every factor only grows, so a split that fits this fits ``model`` too: a verdict check chosen
    under it is still one the model as measured allows, with room where the compiles saw nothing.
    """
    worst = min(model.peak(), SYSTEMIC_CAP)
    guess = model.base * (worst / model.base) ** UNMEASURED_SHARE
    if guess <= model.base * (1.0 + 1e-9):
        return None
    return replace(model, base=guess)
