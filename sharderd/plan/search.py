"""What to compile next, learned from what the compiler said: pure values, no I/O.

A plan is a prediction; a compile is a measurement of one device's worst tile (an OOM names one
tile) or a success. The search keeps every measurement as an ``Observation`` and derives the
memory model from all of them each time (``memory_model.content_model``; never by multiplying
the last correction), so a factor can come down as well as up:

- what a compile measured attaches to the nodes its device held, not to the device index: an
  overflowed stage's nodes carry the factor that reproduces its measurement wherever a re-plan
  puts them (code, a per-node constant, excepted), so the overflowing layers cannot simply move
  to a device without evidence and be compiled again;
- overflows of different contents with the same factor (within ``SYSTEMIC_AGREEMENT``) make one
  systemic factor for the nodes no compile measured, bounded by the smaller and by
  ``SYSTEMIC_CAP``, given once;
- the search gives up (exit 5, "not proven") when the model *as measured*
  (``SearchState.estimate_content``: every OOM it comes from reproduced, no margin, no headroom,
  the noise in the model's favour) has no split either, and no AMP level can close the gap of
  the overflowing devices (``amp_for_plan``); a split it still allows is compiled first. That
  model is fitted, not proven: a "does not fit" (exit 3) never rests on it.

Attempts are keyed by (plan digest, available_memory_proportion): no split is compiled twice
with the same options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sharderd.plan.content import ContentCorrection
from sharderd.plan.memory_model import (
    FIT_MIN_MEASURED_SPREAD,
    FIT_MIN_OVERLAP,
    HEADROOM,
    SYSTEMIC_AGREEMENT,
    SYSTEMIC_CAP,
    UNKNOWN_OVER,
    content_model,
    hypothesis,
    stage_factor,
    systemic_ratio,
)
from sharderd.plan.observations import (
    AttemptKey,
    Observation,
    StageView,
    observe,
    runs_size,
    stage_views,
)

__all__ = [
    "FIT_MIN_MEASURED_SPREAD",
    "HEADROOM",
    "SYSTEMIC_AGREEMENT",
    "SYSTEMIC_CAP",
    "AttemptKey",
    "ContentCorrection",
    "Correction",
    "Observation",
    "SearchState",
    "StageView",
    "amp_closing",
    "amp_for_plan",
    "amp_retry",
    "amp_saving",
    "learn",
    "observe",
    "stage_need",
    "stage_views",
]


def amp_retry(overfull: Observation, amp: float, fallbacks: Sequence[float]) -> float | None:
    """The highest fallback AMP that can close the worst tile's gap (``amp_closing``), if any.
    A numberless OOM is taken as ``UNKNOWN_OVER`` over."""
    if overfull.stage is None:
        return min(fallbacks) if fallbacks else None
    measured = overfull.measured if overfull.measured is not None else UNKNOWN_OVER
    return amp_closing(measured, amp, fallbacks)


def amp_saving(amp: float, lower: float) -> float:
    """The most a cap of ``lower`` instead of ``amp`` can take off a worst tile (× its capacity).

    PopART's ``available_memory_proportion`` is the conv/matmul planner's per-tile limit on
    temporary memory, as a share of the tile ("a per-tile memory limit", which the planner may
    exceed when no plan fits). The temporaries on the worst tile were planned under ``amp``; a lower
    cap can remove only what was above it, so at most ``amp - lower`` of the tile. (Sharderd's
    activation estimate is no bound on the compiler's temporaries, so it does not narrow this.)
    """
    return max(0.0, amp - lower)


def amp_closing(measured: float, amp: float, fallbacks: Sequence[float]) -> float | None:
    """The highest fallback below ``amp`` whose ``amp_saving`` can bring ``measured`` to fit."""
    for candidate in sorted((a for a in fallbacks if a < amp), reverse=True):
        if measured - amp_saving(amp, candidate) <= 1.0:
            return candidate
    return None


def stage_need(
    stage: StageView, attempt: int, observations: Sequence[Observation], amp: float
) -> float:
    """What the compiles say one stage of a compiled plan needs (× capacity) at ``amp``.

    Its own measurement if the compile named its device (``UNKNOWN_OVER`` for an OOM without
    bytes); else the largest overflow of a stage holding mostly the same nodes, carried over by
    its factor with the noise in the model's favour (so a retry is only skipped when even that
    reading leaves a gap); else the prediction.
    """
    need = stage.predicted
    for o in observations:
        if o.amp != amp or o.stage is None or o.fits:
            continue
        if o.attempt == attempt and o.stage.device == stage.device:
            return o.measured if o.measured is not None else UNKNOWN_OVER
        if o.measured is not None and o.stage.overlap(stage) >= FIT_MIN_OVERLAP:
            factor = stage_factor(o, o.measured * (1.0 - FIT_MIN_MEASURED_SPREAD))
            need = max(need, stage.code + factor * stage.rest)
    return need


def amp_for_plan(
    stages: Sequence[StageView],
    attempt: int,
    observations: Sequence[Observation],
    amp: float,
    fallbacks: Sequence[float],
) -> tuple[float | None, StageView | None, float]:
    """The highest fallback below ``amp`` at which every stage of a compiled plan that the
    compiles say overflows can fit (``amp_closing``), and the stage that decides it with its need.

    The compiler names one device per OOM; a retry that closes that device's gap while another
    device is known (from an overlapping stage's overflow) to need more is a compile the model
    already calls hopeless, so the level is chosen for the worst of them.
    """
    needs = [(s, stage_need(s, attempt, observations, amp)) for s in stages]
    over = [(s, n) for s, n in needs if n > 1.0]
    if not over:
        return None, None, 0.0
    # A lower level only shrinks more, so the plan's level is the lowest any stage needs.
    levels = [amp_closing(n, amp, fallbacks) for _, n in over]
    if None not in levels:
        return min(level for level in levels if level is not None), None, 0.0
    # None closes every gap: the largest need, which stays open longest, decides.
    stage, need = max(over, key=lambda sn: sn[1])
    return None, stage, need


@dataclass(frozen=True, slots=True)
class Correction:
    """What one outcome taught, as the report shows it."""

    device: int | None
    measured_fraction: float | None
    """Worst-tile bytes / tile capacity reported by the compiler (> 1 on OOM)."""
    predicted_fraction: float | None
    """The plan's predicted memory / device capacity for that device."""
    before: tuple[float, ...]
    """The factor each stage of the plan was planned with (corrected / predicted bytes)."""
    after: tuple[float, ...]
    """The same with the overflowed stage's nodes at the factor this outcome taught."""
    reason: str = field(default="")


@dataclass(frozen=True, slots=True)
class SearchState:
    """Everything the search has learned, as one value; ``learn`` returns the next one."""

    devices: int
    margin: float
    default_amp: float
    observations: tuple[Observation, ...] = ()
    tried: frozenset[AttemptKey] = frozenset()
    escalation: tuple[float, ...] = ()
    """Extra factor per device after a re-plan reproduced a tried split (1.0 each by default)."""

    def content(self, amp: float | None = None) -> ContentCorrection:
        """The per-node correction to plan with (measurements aimed ``HEADROOM`` above)."""
        return content_model(self.observations, amp=self.default_amp if amp is None else amp)

    def estimate_content(self) -> ContentCorrection:
        """The correction as measured, for the verdict: no headroom, noise in the model's favour."""
        return content_model(self.observations, amp=self.default_amp, estimate=True)

    def hypothesis(self) -> ContentCorrection | None:
        return hypothesis(self.observations, amp=self.default_amp)

    def blind(self) -> int:
        """Out-of-memory reports at the default AMP that named no device."""
        return sum(1 for o in self.observations if o.stage is None and o.amp == self.default_amp)

    def scales(self) -> tuple[float, ...]:
        """Per-device factors on top of the content correction: ``UNKNOWN_OVER`` for every OOM
        that named no device, and any escalation (the margin is the planner's)."""
        extra = self.escalation or (1.0,) * self.devices
        blind = UNKNOWN_OVER ** self.blind()
        return tuple(blind * e for e in extra)

    def escalate(self, device: int | None, factor: float = 1.1) -> SearchState:
        extra = list(self.escalation or (1.0,) * self.devices)
        for e in range(self.devices):
            if device is None or e == device:
                extra[e] *= factor
        return replace(self, escalation=tuple(extra))

    def last_oom_device(self) -> int | None:
        ooms = [o for o in self.observations if not o.fits]
        return ooms[-1].device if ooms else None

    def describe(self, amp: float | None = None) -> str:
        amp = self.default_amp if amp is None else amp
        parts = [f"node factors {self.content(amp).describe()}"]
        systemic = systemic_ratio(self.observations, amp=amp)
        if systemic is not None:
            parts.append(f"systemic factor {systemic:.3g} from overflows of different contents")
        if self.blind():
            parts.append(
                f"{self.blind()} numberless OOM(s): ×{UNKNOWN_OVER ** self.blind():.3g} everywhere"
            )
        return "; ".join(parts)


def learn(
    state: SearchState,
    key: AttemptKey,
    new: Sequence[Observation],
    stages: Sequence[StageView] = (),
) -> tuple[SearchState, Correction | None]:
    """The state after one finished compile, and the correction to report for it.

    An OOM at a lower ``available_memory_proportion`` is an OOM at the default too (the option
    only lowers memory): that split is not compiled at the default. (Its bytes stay evidence at
    their own AMP only: the default's model is fitted from the default's measurements.)"""
    tried = state.tried | {key}
    if any(not o.fits and o.amp < state.default_amp for o in new):
        tried |= {AttemptKey(key.digest, state.default_amp)}
    after_state = replace(state, observations=(*state.observations, *new), tried=tried)
    ooms = [o for o in new if not o.fits]
    if not ooms:
        return after_state, None
    o = ooms[0]
    before = tuple(v.scale for v in stages) or (1.0,) * state.devices
    after = list(before)
    if o.stage is None:
        reason = f"OOM without a device: {after_state.describe(o.amp)}"
        after = [b * UNKNOWN_OVER for b in after]
    else:
        shown = (
            f"{o.measured:.3f}× capacity" if o.measured is not None else "over capacity (no number)"
        )
        factor = stage_factor(o, (o.measured or UNKNOWN_OVER) * HEADROOM)
        if o.stage.device < len(after):
            after[o.stage.device] = max(after[o.stage.device], factor)
        reason = (
            f"device {o.stage.device}: worst tile {shown} vs {o.stage.predicted:.3f} predicted; "
            f"its {runs_size(o.stage.nodes())} node(s) ×{factor:.3g} wherever they go; "
            f"{after_state.describe(o.amp)}"
        )
    return after_state, Correction(
        o.device,
        o.measured,
        None if o.stage is None else o.stage.predicted,
        before,
        tuple(after),
        reason,
    )
