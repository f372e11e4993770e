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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sharderd.plan.oom import OomInfo

__all__ = [
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

HEADROOM = 1.05
"""Corrected budgets aim this much under what the compiler measured, so the re-plan has slack."""
_UNKNOWN_OVER = 1.25
"""An OOM without bytes is taken as a worst tile this far over capacity (for the corrected model
only)."""
SYSTEMIC_AGREEMENT = 1.2
"""Ratios of different devices within this factor of each other are "the same ratio"."""
SYSTEMIC_CAP = 2.0
"""A systemic factor never exceeds this: it is a guess for devices that have not spoken."""
FIT_MIN_OVERLAP = 0.5
"""Two points of a device join an affine fit only if their stages share this much (``overlap``)."""
FIT_MIN_PREDICTED_SPREAD = 0.1
"""... and their predictions differ by this share of the larger one,"""
FIT_MIN_MEASURED_SPREAD = 0.03
"""... and their measurements by this much of a tile (below it is compiler noise)."""
HOPELESS = 1e6
"""A scale so large no stage fits: a fitted fixed cost alone fills the device."""


@dataclass(frozen=True, slots=True)
class AttemptKey:
    digest: str
    amp: float


@dataclass(frozen=True, slots=True)
class StageView:
    """What the search reads of one planned stage."""

    device: int
    predicted: float
    """Raw predicted memory / device capacity (before margin and correction)."""
    activation_share: float
    """Activations / predicted memory: where conv/matmul temporaries live in the model."""
    order: str
    start: int
    stop: int

    def overlap(self, other: StageView) -> float:
        """Share of the smaller stage's node range that the other holds too (0 across orders).

        A stage shrunk around the same ops (the usual re-plan after an OOM) overlaps fully; the
        same device index holding other layers does not.
        """
        if self.order != other.order:
            return 0.0
        inter = max(0, min(self.stop, other.stop) - max(self.start, other.start))
        smaller = min(self.stop - self.start, other.stop - other.start)
        return inter / smaller if smaller > 0 else 0.0


def stage_views(plan: Mapping[str, Any], capacity: int) -> tuple[StageView, ...]:
    """``StageView`` of every stage of a ``plan_section`` dict."""
    views = []
    for stage in plan["stages"]:
        memory = max(int(stage["memory_bytes"]), 1)
        views.append(
            StageView(
                device=int(stage["index"]),
                predicted=memory / capacity,
                activation_share=min(1.0, int(stage["activation_bytes"]) / memory),
                order=str(plan.get("order", "")),
                start=int(stage["start"]),
                stop=int(stage["stop"]),
            )
        )
    return tuple(views)


@dataclass(frozen=True, slots=True)
class Observation:
    """One device in one finished compile."""

    attempt: int
    stage: StageView | None
    """None: the compiler named no device."""
    fits: bool
    measured: float | None
    """Worst tile / tile capacity when the compiler gave a number (> 1 on OOM)."""
    amp: float

    @property
    def device(self) -> int | None:
        return None if self.stage is None else self.stage.device

    @property
    def ratio(self) -> float | None:
        if self.stage is None or self.measured is None:
            return None
        return self.measured / max(self.stage.predicted, 1e-12)


def observe(
    attempt: int,
    stages: Sequence[StageView],
    *,
    kind: Literal["ok", "oom"],
    amp: float,
    oom: OomInfo | None = None,
    tile_bytes: int = 0,
    device_memory: Sequence[int] | None = None,
    device_capacity: int = 0,
) -> tuple[Observation, ...]:
    """The observations one compile gives: one per device on success, the named one on OOM."""
    if kind == "ok":
        out = []
        for stage in stages:
            measured = None
            if device_memory is not None and stage.device < len(device_memory) and device_capacity:
                measured = device_memory[stage.device] / device_capacity
            out.append(Observation(attempt, stage, True, measured, amp))
        return tuple(out)
    assert oom is not None
    d = oom.device
    if d is None or not 0 <= d < len(stages):
        return (Observation(attempt, None, False, None, amp),)
    measured = None
    if oom.bytes_used is not None and (oom.tile_bytes or tile_bytes):
        measured = oom.bytes_used / (oom.tile_bytes or tile_bytes)
    return (Observation(attempt, stages[d], False, measured, amp),)


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """``real fraction ≈ slope · predicted + intercept`` for one device."""

    slope: float
    intercept: float = 0.0
    source: str = "prior"

    def predict(self, predicted: float) -> float:
        return self.slope * predicted + self.intercept

    def scale(self, margin: float, headroom: float = HEADROOM) -> float:
        """The planner's factor: ``p · margin · scale <= 1`` ⇔ ``margin · headroom · predict(p) <= 1``.

        The margin stays on top of a learned ratio: it was measured on other stage contents.
        """
        if self.source == "prior":
            return 1.0
        room = 1.0 - margin * headroom * self.intercept
        if room <= 0:
            return HOPELESS
        return headroom * self.slope / room


@dataclass(frozen=True, slots=True)
class MemoryModel:
    devices: tuple[DeviceModel, ...]
    systemic: float | None = None
    """The shared ratio several devices showed, given to the devices without their own evidence."""
    blind: int = 0
    """Out-of-memory reports that named no device: each grows every scale by ``_UNKNOWN_OVER``."""

    def scales(self, margin: float) -> tuple[float, ...]:
        factor = _UNKNOWN_OVER**self.blind
        return tuple(d.scale(margin) * factor for d in self.devices)

    def describe(self) -> str:
        parts = [
            f"device {i}: {d.source}" for i, d in enumerate(self.devices) if d.source != "prior"
        ]
        if self.systemic is not None:
            parts.append(f"systemic ratio {self.systemic:.3g} for the others")
        if self.blind:
            parts.append(
                f"{self.blind} numberless OOM(s): ×{_UNKNOWN_OVER**self.blind:.3g} everywhere"
            )
        return "; ".join(parts) or "prior"


def _at(observations: Sequence[Observation], amp: float) -> list[Observation]:
    return [o for o in observations if o.amp == amp]


def _device_model(points: Sequence[Observation]) -> DeviceModel | None:
    """The model of one device from its own observations, or None without evidence."""
    ooms = [o for o in points if not o.fits]
    if not ooms:
        fits = [o for o in points if o.ratio is not None and o.measured is not None]
        if fits:  # measured successes only: the latest one says where this device stands
            last = max(fits, key=lambda o: o.attempt)
            return DeviceModel(
                max(last.ratio or 0.0, 1e-6),
                0.0,
                f"ratio {last.ratio:.3g} measured on a compile that fitted",
            )
        return None
    ratios = [
        o.ratio if o.ratio is not None else _UNKNOWN_OVER / max(o.stage.predicted, 1e-12)
        for o in ooms
        if o.stage
    ]
    ratio = max(ratios)
    source = f"ratio {ratio:.3g} from {len(ooms)} OOM(s)"
    latest_oom = max(o.attempt for o in ooms)
    headroom_fits = [
        o
        for o in points
        if o.fits and o.ratio is not None and o.attempt > latest_oom and o.ratio < ratio
    ]
    if headroom_fits:  # a later plan fitted with room to spare: trust it over the older OOMs
        last = max(headroom_fits, key=lambda o: o.attempt)
        assert last.ratio is not None
        return DeviceModel(
            last.ratio, 0.0, f"ratio {last.ratio:.3g} from a later compile that fitted"
        )
    affine = _affine(points)
    if affine is not None:
        a, b = affine
        if all(a * o.stage.predicted + b > 1.0 for o in ooms if o.stage):  # reproduces every OOM
            return DeviceModel(a, b, f"affine fit {a:.3g}·p + {b:.3g}")
    return DeviceModel(ratio, 0.0, source)


def _affine(points: Sequence[Observation]) -> tuple[float, float] | None:
    """(a, b) from the latest pair of measured points fit for it, if any."""
    measured = sorted(
        (o for o in points if o.measured is not None and o.stage is not None),
        key=lambda o: o.attempt,
    )
    for j in range(len(measured) - 1, 0, -1):
        for i in range(j - 1, -1, -1):
            p, q = measured[i], measured[j]
            assert (
                p.stage is not None
                and q.stage is not None
                and p.measured is not None
                and q.measured is not None
            )
            dp = q.stage.predicted - p.stage.predicted
            dm = q.measured - p.measured
            if p.stage.overlap(q.stage) < FIT_MIN_OVERLAP:
                continue
            if abs(dp) < FIT_MIN_PREDICTED_SPREAD * max(p.stage.predicted, q.stage.predicted):
                continue
            if abs(dm) < FIT_MIN_MEASURED_SPREAD:
                continue
            a = dm / dp
            b = p.measured - a * p.stage.predicted
            if a > 0 and b > 0:
                return a, b
    return None


def fit_model(observations: Sequence[Observation], devices: int, *, amp: float) -> MemoryModel:
    """The corrected model from every observation made at ``amp``."""
    at = _at(observations, amp)
    per_device: list[DeviceModel | None] = []
    for d in range(devices):
        per_device.append(_device_model([o for o in at if o.device == d]))
    ratios = [
        m.slope for m in per_device if m is not None and m.intercept == 0.0 and "OOM" in m.source
    ]
    systemic = None
    if len(ratios) >= 2 and max(ratios) / min(ratios) <= SYSTEMIC_AGREEMENT:
        systemic = min(min(ratios), SYSTEMIC_CAP)
    models = []
    for m in per_device:
        if m is not None:
            models.append(m)
        elif systemic is not None and systemic > 1.0:
            models.append(DeviceModel(systemic, 0.0, f"systemic ratio {systemic:.3g}"))
        else:
            models.append(DeviceModel(1.0))
    blind = sum(1 for o in at if o.stage is None)
    return MemoryModel(tuple(models), systemic, blind)


def corrected_scales(model: MemoryModel, margin: float) -> tuple[float, ...]:
    """Planner scales; a device that only has the prior keeps 1.0 (the margin applies)."""
    scales = model.scales(margin)
    return tuple(
        s if d.source != "prior" else max(s, 1.0)
        for s, d in zip(scales, model.devices, strict=True)
    )


def hypothesis_scales(model: MemoryModel, margin: float) -> tuple[float, ...] | None:
    """A speculative variant: the worst ratio seen so far given to every silent device too.

    Not a belief (one device's ratio says nothing certain of another's) but a cheap bet for a
    free pool slot, bounded by ``SYSTEMIC_CAP``. None when it would change nothing.
    """
    seen = [
        d.slope
        for d in model.devices
        if d.source != "prior" and d.intercept == 0.0 and d.slope > 1.0
    ]
    if not seen or model.systemic is not None or all(d.source != "prior" for d in model.devices):
        return None
    guess = min(max(seen), SYSTEMIC_CAP)
    base = corrected_scales(model, margin)
    return tuple(
        max(s, DeviceModel(guess, 0.0, "guess").scale(margin)) if d.source == "prior" else s
        for s, d in zip(base, model.devices, strict=True)
    )


def estimate_scales(model: MemoryModel) -> tuple[float, ...]:
    """Scales for planning at margin 1 with the model as measured: no margin, no headroom, and
    the measurement noise (``FIT_MIN_MEASURED_SPREAD``) given in the model's favour.

    Every device's model reproduces the compiles it comes from (each OOM beyond the noise is
    predicted to overflow), so "no split under these scales" is a verdict consistent with every
    observation, not a product of the margin or of an extrapolated fit.
    """
    factor = _UNKNOWN_OVER**model.blind
    scales = []
    for d in model.devices:
        if d.source == "prior":
            scales.append(1.0)
            continue
        if d.intercept > 0:
            lenient = DeviceModel(
                d.slope, max(d.intercept - FIT_MIN_MEASURED_SPREAD, 0.0), d.source
            )
        else:
            lenient = DeviceModel(d.slope * (1.0 - FIT_MIN_MEASURED_SPREAD), 0.0, d.source)
        scales.append(lenient.scale(1.0, 1.0) * factor)
    return tuple(scales)


def inconsistencies(
    model: MemoryModel, observations: Sequence[Observation], *, amp: float
) -> list[str]:
    """Observations the model contradicts: an OOM it predicts to fit, or a fit it predicts to overflow."""
    problems = []
    factor = _UNKNOWN_OVER**model.blind
    for o in _at(observations, amp):
        if o.stage is None:
            continue
        dm = model.devices[o.stage.device]
        predicted = dm.predict(o.stage.predicted) * factor
        if not o.fits and predicted <= 1.0:
            problems.append(
                f"attempt {o.attempt}: device {o.stage.device} ran out of memory but the model says {predicted:.3f}"
            )
        if o.fits and predicted > 1.0 + FIT_MIN_MEASURED_SPREAD:
            problems.append(
                f"attempt {o.attempt}: device {o.stage.device} fitted but the model says {predicted:.3f}"
            )
    return problems


def amp_retry(overfull: Observation, amp: float, fallbacks: Sequence[float]) -> float | None:
    """The highest fallback AMP whose reducible share of the worst tile can close its gap, if any.

    ``available_memory_proportion`` bounds only the temporaries of convolutions and matmuls,
    which the model holds in the activation share of the stage; at ``a`` they shrink to about
    ``a / amp`` of what they were. A numberless OOM is taken as ``_UNKNOWN_OVER`` over.
    """
    if overfull.stage is None:
        return min(fallbacks) if fallbacks else None
    measured = overfull.measured if overfull.measured is not None else _UNKNOWN_OVER
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
    """The state after one finished compile, and the correction to report for it."""
    before = state.scales()
    after_state = replace(
        state, observations=(*state.observations, *new), tried=state.tried | {key}
    )
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
