"""What to compile next, learned from what the compiler said. Pure bookkeeping, no I/O.

A plan is a prediction; an out-of-memory report measures the worst tile of one device. The
search turns that into a per-device correction of the memory model (measured / predicted) and
asks the exact planner again: never a blind local move. Each attempt is keyed by (plan digest,
available_memory_proportion), so no split is ever compiled twice with the same options.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sharderd.backends.protocol import OomInfo

__all__ = ["HEADROOM", "AttemptKey", "Correction", "corrected_scale", "escalate"]

HEADROOM = 1.05
"""Corrected budgets aim this much under what the compiler measured, so the re-plan has slack."""
_UNKNOWN_DEVICE_FACTOR = 1.25
"""A numberless OOM says "too much somewhere": every device's estimate grows by this."""
SYSTEMIC_SPREAD = 0.5
"""Share (in log space) of a device's correction applied to the others once several devices ran
out of memory: the error is then systemic (code and exchange buffers grow on every device)."""


@dataclass(frozen=True, slots=True)
class AttemptKey:
    digest: str
    amp: float


@dataclass(frozen=True, slots=True)
class Correction:
    device: int | None
    measured_fraction: float | None
    """Worst-tile bytes / tile capacity reported by the compiler (> 1 on OOM)."""
    predicted_fraction: float | None
    """The plan's predicted memory / device capacity for that device."""
    before: tuple[float, ...]
    after: tuple[float, ...]
    reason: str = field(default="")


def corrected_scale(
    scale: Sequence[float],
    oom: OomInfo,
    predicted_bytes: Sequence[int],
    capacity: int,
    tile_bytes: int,
    *,
    margin: float = 1.0,
    spread: float = 0.0,
    history: Sequence[tuple[float, float]] = (),
) -> Correction:
    """New per-device memory scale after ``oom``.

    ``predicted_bytes[d]`` is the plan's raw prediction for device d (before the safety margin and
    scale). A numbered OOM on device d says the worst tile held ``m = U / tile_bytes`` of its
    capacity where we predicted ``p = predicted / capacity``. One observation gives a ratio
    (``real ≈ p × m/p``); with an earlier observation of the same device (``history``: its
    ``(p, m)`` pairs) the two fit ``real ≈ a·p + b``, which also captures a fixed cost such as
    one large op's code that moves with the op, not with the bytes around it. The planner's
    constraint ``p × margin × scale <= 1`` then gets ``scale = a / (1 - margin·b)``. Other devices
    take ``spread`` of the growth in log space. Without a device every scale grows.
    """
    before = tuple(float(x) for x in scale)
    after = list(before)
    d = oom.device
    if d is None or not 0 <= d < len(after):
        after = [s * _UNKNOWN_DEVICE_FACTOR for s in after]
        return Correction(None, None, None, before, tuple(after), f"{oom.kind} OOM without a device: all estimates ×{_UNKNOWN_DEVICE_FACTOR}")
    predicted = max(predicted_bytes[d], 1) / capacity
    if oom.bytes_used is not None and tile_bytes > 0:
        measured = oom.bytes_used / (oom.tile_bytes or tile_bytes)
        fitted = _affine_scale([*history, (predicted, measured)], margin)
        ratio = fitted if fitted is not None else max(measured / predicted, 1.0)
        new_d = max(before[d] * HEADROOM, ratio * HEADROOM)
        how = f"fit of {len(history) + 1} observations" if fitted is not None else "ratio"
        reason = f"device {d}: worst tile {measured:.3f}× capacity vs {predicted:.3f} predicted ({how})"
    else:
        measured = None
        new_d = before[d] * _UNKNOWN_DEVICE_FACTOR
        reason = f"device {d}: {oom.kind} OOM without bytes: ×{_UNKNOWN_DEVICE_FACTOR}"
    growth = new_d / before[d]
    after[d] = new_d
    for e in range(len(after)):
        if e != d:
            after[e] = max(before[e], before[e] * math.exp(spread * math.log(growth)))
    return Correction(d, measured, predicted, before, tuple(after), reason)


_HOPELESS = 1e6
"""A scale so large no stage fits: the fit says the fixed cost alone fills the device."""


def _affine_scale(points: Sequence[tuple[float, float]], margin: float) -> float | None:
    """``a / (1 - margin·b)`` from the last two distinct (predicted, measured) points, if sane."""
    distinct = {round(p, 9): (p, m) for p, m in points}
    if len(distinct) < 2:
        return None
    (p1, m1), (p2, m2) = list(distinct.values())[-2:]
    a = (m1 - m2) / (p1 - p2)
    b = m1 - a * p1
    if a <= 0 or b <= 0:
        return None  # no fixed part visible (or noise): the ratio is the better model
    room = 1.0 - margin * b
    return _HOPELESS if room <= 0 else a / room


def escalate(scale: Sequence[float], device: int | None, factor: float = 1.1) -> tuple[float, ...]:
    """Push a correction further when re-planning reproduced a split that was already tried."""
    if device is None:
        return tuple(s * factor for s in scale)
    return tuple(s * factor if e == device else s for e, s in enumerate(scale))
