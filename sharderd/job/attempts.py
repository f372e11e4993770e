"""One compile attempt of a job's search, as the prover tracks it, and the search's result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from sharderd.backends.protocol import AttemptOutcome
from sharderd.job.session import PlanRequest
from sharderd.plan.content import ContentCorrection
from sharderd.plan.memory_model import UNKNOWN_OVER, planned_factor
from sharderd.plan.observations import AttemptKey, Observation, StageView, observe, runs_size
from sharderd.plan.search_state import Finished
from sharderd.plan.types import Plan
from sharderd.target import Target

__all__ = [
    "AttemptRecord",
    "Contradiction",
    "Correction",
    "ProveResult",
    "correction",
    "finished",
]


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


def correction(
    stages: Sequence[StageView], new: Sequence[Observation], model: ContentCorrection
) -> Correction | None:
    """The report's account of an overflow (None for a fit): the factor its stage's nodes now
    carry wherever a re-plan puts them (``model``: the memory model after it)."""
    o = next((o for o in new if not o.fits), None)
    if o is None:
        return None
    before = tuple(v.scale for v in stages)
    if o.stage is None:
        after = tuple(b * UNKNOWN_OVER for b in before)
        return Correction(
            None, None, None, before, after, f"OOM without a device: ×{UNKNOWN_OVER:g} everywhere"
        )
    factor = planned_factor(o)
    after = tuple(max(b, factor) if k == o.stage.device else b for k, b in enumerate(before))
    shown = f"{o.measured:.3f}× capacity" if o.measured is not None else "over capacity (no number)"
    reason = (
        f"device {o.stage.device}: worst tile {shown} vs {o.stage.predicted:.3f} predicted; its "
        f"{runs_size(o.stage.runs)} node(s) ×{factor:.3g} wherever they go; node factors "
        f"{model.describe()}"
    )
    return Correction(o.device, o.measured, o.stage.predicted, before, after, reason)


@dataclass(slots=True)
class AttemptRecord:
    index: int
    label: str
    key: AttemptKey
    margin: float
    scale: tuple[float, ...]
    orders: tuple[str, ...] | None
    plan: Plan | None
    """None for a probe, which is not a plan of the model."""
    views: tuple[StageView, ...]
    """What the search reads of the plan's stages (``observations.stage_views``)."""
    model: Path
    """The ONNX file compiled."""
    directory: Path
    request: PlanRequest | None
    """What planned it: the written result re-plans from exactly this (only the folder differs).
    None for a probe, which is not a plan of the model."""
    outcome: AttemptOutcome | None = None
    correction: Correction | None = None
    measured_times: Mapping[str, float] | None = None
    """Node times the plan was made with (``cost_model = "measured"``), else None."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    cancelled_because: str | None = None
    """Why the attempt was stopped before it finished (a better plan compiled, the job stopped)."""
    probe_node: str | None = None
    """Set for a probe: the node compiled alone on one device (evidence about memory, never a
    result)."""
    serializable: tuple[str, int] | None = None
    """A probe's MatMul that PopART could serialize: (node, the factor to retry it with)."""

    @property
    def predicted_s(self) -> float:
        return 0.0 if self.plan is None else self.plan.bottleneck_s

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
class Contradiction:
    """A probe's overflow that would have proved "does not fit" (exit 3), and the compile of the
    whole model that fitted all the same: the compile wins, the report and the log say both."""

    probe: int
    """The probe's attempt index."""
    fitted: int
    """The kept attempt's index."""
    proof: str
    """The proof as it would have read."""


@dataclass(frozen=True, slots=True)
class ProveResult:
    chosen: AttemptRecord
    attempts: tuple[AttemptRecord, ...]
    contradiction: Contradiction | None = None


def finished(
    record: AttemptRecord, outcome: AttemptOutcome, target: Target, batch_size: int
) -> Finished:
    """What a compile's outcome tells the search: a fit, or the device an overflow names and
    its worst tile (at the AMP that device's conv/matmuls had), the measured period, the node
    times, and what the compiled model carried (``details``, as the backend read it there)."""
    kind, oom = outcome.outcome, outcome.oom
    observations: tuple[Observation, ...] = ()
    if kind == "ok" or (kind == "oom" and oom is not None):
        amp = record.key.amp if kind == "ok" or oom is None else record.key.amp_on(oom.device)
        observations = observe(
            record.index,
            record.views,
            kind=kind,
            amp=amp,
            oom=oom,
            tile_bytes=target.bytes_per_tile,
        )
    details = outcome.details or {}
    times = details.get("node_times_s") if kind == "ok" else None
    compiled = details.get("matmul_serialization")
    return Finished(
        record.index,
        kind,
        observations,
        record.measured_period_s(batch_size),
        record.throughput,
        tuple(sorted(times.items())) if times else None,
        oom=None if oom is None else oom.kind,
        cause=outcome.cause,
        compiled_serialize=None
        if compiled is None
        else tuple(sorted((str(n), int(k)) for n, k in compiled.items())),
    )
