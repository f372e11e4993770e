"""The onnxruntime backend's options: ``AttemptRequest.options`` checked into one value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sharderd.backends.protocol import AttemptRequest
from sharderd.errors import ConfigError

__all__ = ["OPTIMIZATION_LEVELS", "TOLERANCES", "OrtOptions"]

TOLERANCES: Mapping[str, tuple[float, float]] = {
    "fp32": (1e-3, 1e-4),
    "fp16": (1e-2, 1e-2),
}
"""Default (rtol, atol) by the request's precision, used when the options give none."""

OPTIMIZATION_LEVELS: Mapping[str, str] = {
    "off": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
"""Option value → ``onnxruntime.GraphOptimizationLevel`` member."""


@dataclass(frozen=True, slots=True)
class OrtOptions:
    """The backend's options, from ``AttemptRequest.options`` (same names) and the request."""

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    reference_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    """Where the unsharded reference runs; the CPU by default, so it takes no device memory."""
    reference_model: str | None = None
    """The model the stages must agree with: the user's original file (the prover always sets
    it); None, only for direct calls, checks against the sharded model itself."""
    rtol: float = 1e-3
    atol: float = 1e-4
    warmup: int = 3
    runs: int = 20
    """Timed runs per stage, and micro-batches through the pipeline."""
    profile_runs: int = 10
    low_memory: bool = False
    seed: int = 0
    verify: bool = True
    measure: bool = False
    profile: bool = False
    """Per-node times from onnxruntime's profiler, for ``cost_model = "measured"``."""
    graph_optimization: str = "all"
    """onnxruntime's graph optimizations for every session: off, basic, extended or all.
    ``all`` (onnxruntime's default) is what a user deploying the stages gets."""
    profile_optimization: str | None = None
    """The level profiled sessions run at; None: ``graph_optimization``, so the profile times
    the kernels that are measured. Another level exists to compare schemes (bench/ort_balance.py)."""
    profile_scale: bool = True
    """Scale each stage's profiled node times to its measured time (when measuring): the
    profiler slows small kernels, and plans are judged against unprofiled runs."""
    gpu_mem_limit: int | None = None
    """Bytes per device; an allocation failure is then ``oom`` on the stage's device."""
    write_stages_dir: str | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    """Values of named symbolic input dims; a leading unnamed one is the batch size."""
    input_shapes: Mapping[str, list[int]] = field(default_factory=dict)
    """The planned shape of each input (wins over ``dims``), for a model written with ``keep_dynamic``."""
    intra_op_threads: int = 0
    """Threads per stage session; 0: the CPU's cores shared out between the stages."""
    batch_size: int = 1

    @classmethod
    def from_request(cls, request: AttemptRequest) -> OrtOptions:
        """Request fields give the defaults of ``warmup``, ``runs``, ``measure`` and ``batch_size``."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {
            "warmup": request.warmup,
            "runs": request.runs,
            "measure": request.benchmark,
            "batch_size": request.batch_size,
        }
        rtol, atol = TOLERANCES.get(request.precision, TOLERANCES["fp32"])
        values.update(rtol=rtol, atol=atol)
        for key, value in request.options.items():
            if key not in known:
                raise ConfigError(
                    f"unknown onnxruntime option {key!r} (known: {', '.join(sorted(known))})"
                )
            if value is not None:
                values[key] = value
        try:
            for key in ("providers", "reference_providers"):
                if key in values:
                    given = values[key]
                    values[key] = (given,) if isinstance(given, str) else tuple(given)
            if "dims" in values:
                values["dims"] = {str(k): int(v) for k, v in dict(values["dims"]).items()}
            options = cls(**values)
            options.check()
        except (TypeError, ValueError) as exc:  # a value of the wrong type (JSON from a sidecar)
            raise ConfigError(f"onnxruntime options: {exc}") from None
        return options

    @property
    def profile_level(self) -> str:
        return self.profile_optimization or self.graph_optimization

    def check(self) -> None:
        levels = ", ".join(OPTIMIZATION_LEVELS)
        problems = [
            (not self.providers, "providers must name at least one execution provider"),
            (self.rtol < 0 or self.atol < 0, "rtol and atol must be >= 0"),
            (
                self.warmup < 0 or self.runs < 1 or self.profile_runs < 1,
                "warmup must be >= 0, runs and profile_runs >= 1",
            ),
            (
                self.gpu_mem_limit is not None and self.gpu_mem_limit <= 0,
                "gpu_mem_limit must be > 0 bytes",
            ),
            (
                self.batch_size < 1 or self.intra_op_threads < 0,
                "batch_size must be >= 1, intra_op_threads >= 0",
            ),
            (
                self.graph_optimization not in OPTIMIZATION_LEVELS
                or self.profile_level not in OPTIMIZATION_LEVELS,
                f"graph_optimization and profile_optimization must be one of {levels}",
            ),
        ]
        for bad, message in problems:
            if bad:
                raise ConfigError(f"onnxruntime options: {message}")
