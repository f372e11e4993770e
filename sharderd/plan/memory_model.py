"""The memory model the compiles imply, derived from every observation each time.

Never by multiplying the last correction, so a scale can come down as well as up, and one
device's evidence never leaks into another's unless several devices showed the same ratio (see
``fit_model``; docs/search.md has the rules in prose).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sharderd.plan.observations import Observation

__all__ = [
    "FIT_MIN_MEASURED_SPREAD",
    "FIT_MIN_OVERLAP",
    "FIT_MIN_PREDICTED_SPREAD",
    "HEADROOM",
    "HOPELESS",
    "SYSTEMIC_AGREEMENT",
    "SYSTEMIC_CAP",
    "UNKNOWN_OVER",
    "DeviceModel",
    "MemoryModel",
    "corrected_scales",
    "estimate_scales",
    "fit_model",
    "hypothesis_scales",
    "inconsistencies",
]

HEADROOM = 1.05
"""Corrected budgets aim this much under what the compiler measured, so the re-plan has slack."""
UNKNOWN_OVER = 1.25
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
    """Out-of-memory reports that named no device: each grows every scale by ``UNKNOWN_OVER``."""

    def scales(self, margin: float) -> tuple[float, ...]:
        factor = UNKNOWN_OVER**self.blind
        return tuple(d.scale(margin) * factor for d in self.devices)

    def describe(self) -> str:
        parts = [
            f"device {i}: {d.source}" for i, d in enumerate(self.devices) if d.source != "prior"
        ]
        if self.systemic is not None:
            parts.append(f"systemic ratio {self.systemic:.3g} for the others")
        if self.blind:
            parts.append(
                f"{self.blind} numberless OOM(s): ×{UNKNOWN_OVER**self.blind:.3g} everywhere"
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
        o.ratio if o.ratio is not None else UNKNOWN_OVER / max(o.stage.predicted, 1e-12)
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
    factor = UNKNOWN_OVER**model.blind
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
    factor = UNKNOWN_OVER**model.blind
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
