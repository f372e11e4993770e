"""One compile attempt of a job's search, as the prover tracks it, and the search's result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from sharderd.backends.protocol import AttemptOutcome
from sharderd.job.session import PlanRequest
from sharderd.plan.observations import AttemptKey
from sharderd.plan.search import Correction

__all__ = ["AttemptRecord", "ProveResult"]


@dataclass(slots=True)
class AttemptRecord:
    index: int
    label: str
    key: AttemptKey
    margin: float
    scale: tuple[float, ...]
    orders: tuple[str, ...] | None
    plan: dict[str, Any]
    files: dict[str, Any]
    directory: Path
    request: PlanRequest | None
    """What planned it: the written result re-plans from exactly this (only the folder differs).
    None for a probe, which is not a plan of the model."""
    outcome: AttemptOutcome | None = None
    correction: Correction | None = None
    measured_times: Mapping[str, float] | None = None
    """Node times the plan was made with (``cost_model = "measured"``), else None."""
    contents: Sequence[Sequence[Sequence[int]]] = ()
    """Each stage's nodes (``plan.observations.stage_contents``): what an OOM's excess follows."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    cancelled_because: str | None = None
    """Why the attempt was stopped before it finished (a better plan compiled, the job stopped)."""
    probe: str | None = None
    """Set for a probe, saying what was compiled alone on one device ("node 'x'", "stage 3 of
    attempt 0"): evidence about memory, never a result."""

    @property
    def predicted_s(self) -> float:
        return float(self.plan["bottleneck_s"])

    def measured_period_s(self, batch_size: int) -> float | None:
        """Measured seconds per batch with the pipeline full: what ``predicted_s`` predicts."""
        if self.outcome is None or self.outcome.benchmark is None:
            return None
        return self.outcome.benchmark.period_s(batch_size)

    @property
    def throughput(self) -> float | None:
        """Measured samples/s: what a pipeline is for, and comparable across backends."""
        if self.outcome is None or self.outcome.benchmark is None:
            return None
        return self.outcome.benchmark.throughput_per_s


@dataclass(frozen=True, slots=True)
class ProveResult:
    chosen: AttemptRecord
    attempts: tuple[AttemptRecord, ...]
