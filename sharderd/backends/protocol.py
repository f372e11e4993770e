"""The plain data that crosses the attempt process boundary, as JSON files.

The parent writes an ``AttemptRequest`` to ``request.json`` and starts
``python -m sharderd.backends.worker request.json result.json`` in its own process group. The
child imports the backend (poprt only ever here), compiles, and writes one ``AttemptOutcome``.
``crashed``, ``timeout`` and ``cancelled`` are produced by the parent from the exit status; a
child never claims them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from sharderd.fsutil import atomic_write
from sharderd.plan.observations import OomInfo, OomKind

__all__ = [
    "OUTCOMES",
    "AttemptOutcome",
    "AttemptRequest",
    "BenchmarkResult",
    "Cause",
    "OomInfo",
    "OomKind",
    "Outcome",
]

Outcome = Literal["ok", "oom", "invalid", "crashed", "timeout", "cancelled"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "oom", "invalid", "crashed", "timeout", "cancelled")
Cause = Literal["verification", "compiler", "setup"]
"""``verification``: the stages disagree with the input model; ``compiler``: the backend refused
the model; ``setup``: the backend itself is missing or misconfigured."""


@dataclass(frozen=True, slots=True)
class BenchmarkResult:
    latency_s: float
    """Median latency of one batch alone in the pipeline."""
    throughput_per_s: float
    """Samples per second with several batches in flight: what a pipeline is for."""
    runs: int
    stage_times_s: tuple[float, ...] = ()
    """Per-stage median time, where the backend can measure it."""
    spread_s: float = 0.0
    """Inter-quartile range of the latency."""
    in_flight: int = 1
    """Batches queued at once while throughput was measured (1: measured one at a time)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as reports and the outcome file carry it."""
        return {**asdict(self), "stage_times_s": list(self.stage_times_s)}

    def period_s(self, batch_size: int) -> float:
        """Seconds per batch at the measured throughput (the pipeline's slowest stage, measured)."""
        return batch_size / self.throughput_per_s if self.throughput_per_s > 0 else self.latency_s


@dataclass(frozen=True, slots=True)
class AttemptRequest:
    backend: str
    model: str
    """Path of the annotated model (its external data beside it)."""
    artifact: str
    """Where the compiled artifact goes (a PopEF for poprt)."""
    num_devices: int
    options: Mapping[str, Any] = field(default_factory=dict)
    """Backend options, e.g. poprt CompilerOptions fields by their Python names."""
    tiles_per_device: int = 0
    benchmark: bool = False
    warmup: int = 20
    runs: int = 200
    batch_size: int = 1
    precision: str = "fp32"
    """The planned precision (``fp32``/``fp16``): poprt converts to it, onnxruntime picks its
    verification tolerances by it."""
    input_shapes: Mapping[str, list[int]] | None = None
    """The planned static input shapes by input name; None: the model's own."""
    benchmark_only: bool = False
    """Run ``artifact``, compiled by an earlier attempt, instead of compiling (poprt: the
    benchmark step, which holds IPUs, apart from the compile, which holds a compile slot)."""

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=True), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> AttemptRequest:
        return cls(**json.loads(path.read_text(encoding="utf-8")))


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    outcome: Outcome
    message: str = ""
    artifact: str | None = None
    oom: OomInfo | None = None
    benchmark: BenchmarkResult | None = None
    returncode: int | None = None
    signal: int | None = None
    stderr_tail: str = ""
    duration_s: float = 0.0
    details: Mapping[str, Any] | None = None
    """Backend-specific results as plain JSON data (e.g. onnxruntime's verification and profile)."""
    cause: Cause | None = None
    """Why an ``invalid`` outcome is invalid, as a type the search acts on (never message text)."""
    ipus_on_host: int | None = None
    """IPUs the attempt's host has (poprt: ``DeviceManager().get_num_devices()``); None: not asked."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptOutcome:
        values = dict(data)
        if values.get("outcome") not in OUTCOMES:
            raise ValueError(f"unknown outcome {values.get('outcome')!r}")
        if values.get("oom") is not None:
            values["oom"] = OomInfo(**values["oom"])
        if values.get("benchmark") is not None:
            bench = dict(values["benchmark"])
            bench["stage_times_s"] = tuple(bench.get("stage_times_s", ()))
            values["benchmark"] = BenchmarkResult(**bench)
        values.pop("device_memory", None)  # written by older versions; no backend ever set it
        return cls(**values)

    def write(self, path: Path) -> None:
        atomic_write(path, json.dumps(self.to_json(), sort_keys=True), durable=False)
