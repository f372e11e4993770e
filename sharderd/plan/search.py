"""What to compile next, learned from what the compiler said: pure values, no I/O.

A plan is a prediction; a compile is a measurement of one device's worst tile (an OOM names one
tile) or a success. The search keeps every measurement as an ``Observation`` and derives the
memory model from all of them each time (never by multiplying the last correction), so a scale
can come down as well as up and one device's evidence never leaks into another's unless several
devices showed the same ratio:

- a device with its own out-of-memory reports gets ``real ≈ r·predicted``, ``r`` the largest
  ratio it showed; an affine ``a·p + b`` (a fixed cost that moves with an op, not with bytes) only
  from two points whose stage contents mostly overlap and whose spread is above noise;
- a success with measured headroom lowers that device's ratio (only the plan that fitted counts);
- several devices with the same ratio (within ``SYSTEMIC_AGREEMENT``) make one systemic factor,
  bounded by the smallest of them and by ``SYSTEMIC_CAP``, given once to the devices without
  evidence of their own;
- "does not fit" is only said when the model *as measured* (``estimate_scales``: every OOM it
  comes from reproduced, no margin, no headroom) has no split either, and when the AMP-dependent
  share of the overflowing device cannot close its gap (``amp_retry``); a split it still allows
  is compiled first.

Attempts are keyed by (plan digest, available_memory_proportion): no split is compiled twice
with the same options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sharderd.plan.memory_model import (
    FIT_MIN_MEASURED_SPREAD,
    HEADROOM,
    SYSTEMIC_AGREEMENT,
    SYSTEMIC_CAP,
    UNKNOWN_OVER,
    DeviceModel,
    MemoryModel,
    corrected_scales,
    estimate_scales,
    fit_model,
    hypothesis_scales,
    inconsistencies,
)
from sharderd.plan.observations import AttemptKey, Observation, StageView, observe, stage_views

__all__ = [
    "FIT_MIN_MEASURED_SPREAD",
    "HEADROOM",
    "SYSTEMIC_AGREEMENT",
    "SYSTEMIC_CAP",
    "AttemptKey",
    "Correction",
    "DeviceModel",
    "MemoryModel",
    "Observation",
    "SearchState",
    "StageView",
    "amp_retry",
    "corrected_scales",
    "estimate_scales",
    "fit_model",
    "hypothesis_scales",
    "inconsistencies",
    "learn",
    "observe",
    "stage_views",
]


def amp_retry(overfull: Observation, amp: float, fallbacks: Sequence[float]) -> float | None:
    """The highest fallback AMP whose reducible share of the worst tile can close its gap, if any.

    ``available_memory_proportion`` bounds only the temporaries of convolutions and matmuls,
    which the model holds in the activation share of the stage; at ``a`` they shrink to about
    ``a / amp`` of what they were. A numberless OOM is taken as ``UNKNOWN_OVER`` over.
    """
    if overfull.stage is None:
        return min(fallbacks) if fallbacks else None
    measured = overfull.measured if overfull.measured is not None else UNKNOWN_OVER
    gap = measured - 1.0
    for candidate in sorted((a for a in fallbacks if a < amp), reverse=True):
        reducible = measured * overfull.stage.activation_share * (1.0 - candidate / amp)
        if reducible >= gap:
            return candidate
    return None


@dataclass(frozen=True, slots=True)
class Correction:
    """What one outcome taught, as the report shows it."""

    device: int | None
    measured_fraction: float | None
    """Worst-tile bytes / tile capacity reported by the compiler (> 1 on OOM)."""
    predicted_fraction: float | None
    """The plan's predicted memory / device capacity for that device."""
    before: tuple[float, ...]
    after: tuple[float, ...]
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

    def model(self, amp: float | None = None) -> MemoryModel:
        return fit_model(
            self.observations, self.devices, amp=self.default_amp if amp is None else amp
        )

    def scales(self, margin: float | None = None) -> tuple[float, ...]:
        base = corrected_scales(self.model(), self.margin if margin is None else margin)
        extra = self.escalation or (1.0,) * self.devices
        return tuple(s * e for s, e in zip(base, extra, strict=True))

    def estimate(self) -> tuple[float, ...]:
        """``estimate_scales`` of the current model (with any escalation), for margin 1."""
        extra = self.escalation or (1.0,) * self.devices
        return tuple(s * e for s, e in zip(estimate_scales(self.model()), extra, strict=True))

    def escalate(self, device: int | None, factor: float = 1.1) -> SearchState:
        extra = list(self.escalation or (1.0,) * self.devices)
        for e in range(self.devices):
            if device is None or e == device:
                extra[e] *= factor
        return replace(self, escalation=tuple(extra))

    def last_oom_device(self) -> int | None:
        ooms = [o for o in self.observations if not o.fits]
        return ooms[-1].device if ooms else None


def learn(
    state: SearchState, key: AttemptKey, new: Sequence[Observation]
) -> tuple[SearchState, Correction | None]:
    """The state after one finished compile, and the correction to report for it.

    An OOM at a lower ``available_memory_proportion`` is an OOM at the default too (the option
    only lowers memory): that split is not compiled at the default. (Its bytes stay evidence at
    their own AMP only: the default's model is fitted from the default's measurements.)"""
    before = state.scales()
    tried = state.tried | {key}
    if any(not o.fits and o.amp < state.default_amp for o in new):
        tried |= {AttemptKey(key.digest, state.default_amp)}
    after_state = replace(state, observations=(*state.observations, *new), tried=tried)
    ooms = [o for o in new if not o.fits]
    if not ooms:
        return after_state, None
    o = ooms[0]
    after = after_state.scales()
    model = after_state.model(o.amp)
    if o.stage is None:
        reason = f"OOM without a device: {model.describe()}"
    else:
        shown = (
            f"{o.measured:.3f}× capacity" if o.measured is not None else "over capacity (no number)"
        )
        reason = f"device {o.stage.device}: worst tile {shown} vs {o.stage.predicted:.3f} predicted; {model.describe()}"
    return after_state, Correction(
        o.device, o.measured, None if o.stage is None else o.stage.predicted, before, after, reason
    )
