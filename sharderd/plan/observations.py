"""What the search reads of a plan and of a finished compile: pure values.

A plan is a prediction per stage (``StageView``); a compile is a measurement of one device's worst
tile (an OOM names one tile) or, on success, of every device the compiler reports
(``Observation``). Attempts are keyed by (plan digest, available_memory_proportion), so no split
is compiled twice with the same options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sharderd.plan.oom import OomInfo

__all__ = ["AttemptKey", "Observation", "StageView", "observe", "stage_views"]


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
