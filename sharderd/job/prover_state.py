"""The prover's state: one job's search, owned by one task (mutable by design)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sharderd.backends.pool import AttemptPool
from sharderd.config import Config
from sharderd.errors import (
    NoSplitError,
    PlanInfeasibleError,
    SharderdError,
)
from sharderd.job.attempts import AttemptRecord
from sharderd.job.session import PlanSession
from sharderd.plan.search import (
    AttemptKey,
    SearchState,
)
from sharderd.target import Target

__all__ = ["Emit", "ProverState"]

Emit = Callable[[str, Mapping[str, Any]], None]
MAX_ESCALATIONS = 12
PERF_BAND = 0.9
"""optimal_perf compiles a plan if its predicted time, scaled by the best measured/predicted ratio,
is within this factor of the best measured period (seconds per batch at the measured throughput)."""


class ProverState:
    """What the search holds between attempts; ``NextAttempt`` and ``Verdict`` read and extend it."""

    def __init__(
        self,
        session: PlanSession,
        *,
        backend: str,
        config: Config,
        target: Target,
        devices: int,
        stem: str,
        workdir: Path,
        pool: AttemptPool,
        job_id: str,
        emit: Emit,
        priority: int = 0,
        max_attempts: int,
        parallel: int,
        timeout: float,
        kill_grace: float,
        optimal_perf: bool = False,
        env: Mapping[str, str] | None = None,
        argv_prefix: list[str] | None = None,
        reference_model: Path | None = None,
        precision: str = "fp32",
        input_shapes: Mapping[str, list[int]] | None = None,
    ) -> None:
        self.session = session
        self.backend = backend
        self.config = config
        self.target = target
        self.devices = devices
        self.stem = stem
        self.workdir = workdir
        self.pool = pool
        self.job_id = job_id
        self.emit = emit
        self.priority = priority
        self.max_attempts = max_attempts
        self.parallel = max(1, parallel)
        self.timeout = timeout
        self.kill_grace = kill_grace
        self.optimal_perf = optimal_perf
        self.env = env
        self.argv_prefix = argv_prefix
        self.reference_model = reference_model
        """The user's own file: the onnxruntime backend checks the stages against it."""
        self.precision = precision
        self.input_shapes = dict(input_shapes) if input_shapes else None
        self.margin = config.plan.safety_margin
        self.default_amp = config.poprt.available_memory_proportion if backend == "poprt" else 0.0
        self.state = SearchState(devices, self.margin, self.default_amp)
        """What the compiles taught (``plan.search``): the policy's input, replaced, never mutated."""
        self.attempts: list[AttemptRecord] = []
        self.running: dict[int, AttemptRecord] = {}
        self.need_base = True
        self.spec_margins = list(config.search.speculative_margins)
        self.hypothesis_pending = False
        self.perf_variants: list[tuple[float, tuple[str, ...] | None]] | None = None
        self.lowest_amp = (
            min((self.default_amp, *config.search.amp_fallbacks)) if backend == "poprt" else 0.0
        )
        """The probe compiles at this AMP: an overflow there holds at every AMP the job may use."""
        self.infeasible: NoSplitError | None = None
        """Set once the search gives up: the model as measured has no split either (no proof)."""
        self.proof: PlanInfeasibleError | None = None
        """Set on a proof (``errors.GROUNDS``) that no split fits: the search ends with it."""
        self.settle_note = ""
        self.fatal: SharderdError | None = None
        self.done = False
        self.stop_reason: str | None = None
        """Set by whoever cancels the job (user cancel, shutdown) so stopped attempts say why."""
        self.calibrate = config.plan.cost_model == "measured" and backend == "onnxruntime"
        self.calibrate_pending = False
        self.measured_times: Mapping[str, float] | None = None

    @property
    def scale(self) -> tuple[float, ...]:
        return self.state.scales()

    @property
    def tried(self) -> frozenset[AttemptKey]:
        return self.state.tried
