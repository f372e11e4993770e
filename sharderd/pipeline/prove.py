"""Prove a plan by compiling it, learning from every failure, stopping as early as possible.

The loop: compile the best plan; with a free pool slot, also a speculative variant (a larger
safety margin). An OOM corrects the memory model of the device it names (``plan.search``) and the
exact planner re-solves; a split is never compiled twice with the same options. When the
corrected model proves no split fits, the least-overfull plan is retried with lower
``available_memory_proportion`` values (as PopRT's own tool does), then the job stops: does not
fit. ``optimal_perf`` keeps compiling plans predicted to possibly beat the best measured one.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from sharderd.backends.attempt import run_attempt
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import attempt_options
from sharderd.config import Config
from sharderd.errors import (
    CompileFailedError,
    PlanInfeasibleError,
    SharderdError,
    VerificationError,
)
from sharderd.pipeline.session import PlanRequest, PlanSession
from sharderd.plan.search import SYSTEMIC_SPREAD, AttemptKey, Correction, corrected_scale, escalate
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["AttemptRecord", "Emit", "ProveResult", "Prover"]

Emit = Callable[[str, Mapping[str, Any]], None]
_MAX_ESCALATIONS = 12
_PERF_BAND = 0.9
"""optimal_perf compiles a plan if its predicted time, scaled by the best measured/predicted ratio,
is within this factor of the best measured latency (model and measurement noise)."""


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
    outcome: AttemptOutcome | None = None
    correction: Correction | None = None
    measured_times: Mapping[str, float] | None = None
    """Node times the plan was made with (``cost_model = "measured"``), else None."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    @property
    def predicted_s(self) -> float:
        return float(self.plan["bottleneck_s"])

    @property
    def measured_s(self) -> float | None:
        if self.outcome is None or self.outcome.benchmark is None:
            return None
        return self.outcome.benchmark.latency_s

    @property
    def throughput(self) -> float | None:
        """Measured samples/s: what a pipeline is for, and comparable across backends."""
        if self.outcome is None or self.outcome.benchmark is None:
            return None
        return self.outcome.benchmark.throughput_per_s

    def to_report(self) -> dict[str, Any]:
        out = self.outcome
        data: dict[str, Any] = {
            "index": self.index,
            "label": self.label,
            "plan_digest": self.key.digest,
            "options": {"available_memory_proportion": self.key.amp, "safety_margin": self.margin},
            "memory_scale": list(self.scale),
            "predicted_bottleneck_s": self.predicted_s,
            "predicted_stage_times_s": [st["time_s"] for st in self.plan["stages"]],
            "cost_model": "measured" if self.measured_times else "analytic",
            "outcome": out.outcome if out else "cancelled",
            "duration_s": out.duration_s if out else 0.0,
            "message": out.message if out else "cancelled: a better plan compiled first",
        }
        if out is not None:
            data["oom"] = None if out.oom is None else {
                "kind": out.oom.kind,
                "device": out.oom.device,
                "tile": out.oom.tile,
                "bytes_used": out.oom.bytes_used,
            }
            data["returncode"] = out.returncode
            data["signal"] = out.signal
            data["stderr_tail"] = out.stderr_tail[-4000:]
            data["benchmark"] = None if out.benchmark is None else {
                "latency_s": out.benchmark.latency_s,
                "throughput_per_s": out.benchmark.throughput_per_s,
                "runs": out.benchmark.runs,
                "stage_times_s": list(out.benchmark.stage_times_s),
                "spread_s": out.benchmark.spread_s,
            }
            details = dict(out.details) if out.details else None
            if details and "node_times_s" in details:
                details["node_times_s"] = f"{len(details['node_times_s'])} nodes profiled"
            data["details"] = details
        if self.correction is not None:
            c = self.correction
            data["correction"] = {
                "device": c.device,
                "measured_fraction": c.measured_fraction,
                "predicted_fraction": c.predicted_fraction,
                "scale_before": list(c.before),
                "scale_after": list(c.after),
                "reason": c.reason,
            }
        return data


@dataclass(frozen=True, slots=True)
class ProveResult:
    chosen: AttemptRecord
    attempts: tuple[AttemptRecord, ...]


class Prover:
    """One job's search. Mutable by design: it is the loop's state, owned by one task."""

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
        self.margin = config.plan.safety_margin
        self.scale: tuple[float, ...] = (1.0,) * devices
        self.default_amp = config.poprt.available_memory_proportion if backend == "poprt" else 0.0
        self.attempts: list[AttemptRecord] = []
        self.tried: set[AttemptKey] = set()
        self.running: dict[int, AttemptRecord] = {}
        self.need_base = True
        self.spec_margins = list(config.search.speculative_margins)
        self.amp_queue: list[tuple[AttemptRecord, float]] | None = None
        self.perf_variants: list[tuple[float, tuple[str, ...] | None]] | None = None
        self.last_oom_device: int | None = None
        self.oom_devices: set[int] = set()
        self.observations: dict[int, list[tuple[float, float]]] = {}
        self.infeasible: PlanInfeasibleError | None = None
        self.fatal: SharderdError | None = None
        self.done = False
        self.calibrate = config.plan.cost_model == "measured" and backend == "onnxruntime"
        self.calibrate_pending = False
        self.measured_times: Mapping[str, float] | None = None

    # -- planning --------------------------------------------------------------------------

    def _request(self, margin: float, scale: tuple[float, ...], orders: tuple[str, ...] | None, write_dir: str | None) -> PlanRequest:
        return PlanRequest(
            self.devices, margin, scale, orders, write_dir=write_dir, stem=self.stem, measured_times=self.measured_times
        )

    async def _plan(self, *, margin: float, scale: tuple[float, ...], orders: tuple[str, ...] | None, amp: float) -> tuple[dict[str, Any], tuple[float, ...]] | None:
        """A plan whose (digest, amp) was never tried, escalating the last correction if needed."""
        for _ in range(_MAX_ESCALATIONS):
            result = await self.session.plan(self._request(margin, scale, orders, None))
            if AttemptKey(result["plan"]["digest"], amp) not in self.tried:
                return result, scale
            if orders is not None or margin != self.margin:
                return None  # a variant that reproduces a tried split adds nothing
            scale = escalate(scale, self.last_oom_device)
        return None

    async def _candidate(self, label: str, margin: float, scale: tuple[float, ...], orders: tuple[str, ...] | None, amp: float) -> AttemptRecord | None:
        planned = await self._plan(margin=margin, scale=scale, orders=orders, amp=amp)
        if planned is None:
            return None
        _, used_scale = planned
        index = len(self.attempts)
        directory = self.workdir / f"attempt-{index}"
        if directory.exists():
            shutil.rmtree(directory)
        result = await self.session.plan(self._request(margin, used_scale, orders, str(directory)))
        record = AttemptRecord(
            index=index,
            label=label,
            key=AttemptKey(result["plan"]["digest"], amp),
            margin=margin,
            scale=used_scale,
            orders=orders,
            plan=result["plan"],
            files=result["files"],
            directory=directory,
            measured_times=self.measured_times,
        )
        self.emit(
            "plan.finished",
            {
                "label": label,
                "digest": record.key.digest,
                "bottleneck_s": record.predicted_s,
                "ratio_to_bound": result["plan"]["ratio_to_bound"],
                "memory_scale": list(used_scale),
            },
        )
        return record

    async def _next(self) -> AttemptRecord | None:
        if self.fatal is not None or self.done:
            return None
        if self.calibrate_pending:
            self.calibrate_pending = False
            try:
                record = await self._candidate("re-plan on measured times", self.margin, self.scale, None, self.default_amp)
            except PlanInfeasibleError:
                record = None
            if record is not None:
                return record
        if self.need_base and self.infeasible is None:
            self.need_base = False
            label = "plan" if not self.attempts else "re-plan after OOM"
            try:
                record = await self._candidate(label, self.margin, self.scale, None, self.default_amp)
            except PlanInfeasibleError as err:
                self.infeasible = err
                record = None
                if err.fits_without_margin and self.margin > 1.0:
                    # Only the margin rules it out: the compiler, not the prior, should decide.
                    self.margin = 1.0
                    self.spec_margins = []
                    self.need_base = True
                    self.infeasible = None
                    return await self._next()
            if record is not None:
                self.scale = record.scale
                return record
        if self.infeasible is None and self.spec_margins and not self._any_ok():
            margin = self.spec_margins.pop(0)
            try:
                record = await self._candidate(f"speculative margin {margin:g}", margin, self.scale, None, self.default_amp)
            except PlanInfeasibleError:
                record = None
            if record is not None:
                return record
        if self.optimal_perf and self._any_ok():
            return await self._perf_variant()
        amp_running = any(a.key.amp != self.default_amp for a in self.running.values())
        if self.infeasible is not None and self.backend == "poprt" and not self._any_ok() and not amp_running:
            return self._amp_retry()  # one at a time: a higher proportion that compiles runs faster
        return None

    def _amp_retry(self) -> AttemptRecord | None:
        if self.amp_queue is None:
            ooms = [a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "oom"]
            ooms.sort(key=lambda a: a.outcome.oom.bytes_used or math.inf if a.outcome and a.outcome.oom else math.inf)
            best = ooms[:1]
            self.amp_queue = [(a, amp) for a in best for amp in self.config.search.amp_fallbacks]
        while self.amp_queue:
            base, amp = self.amp_queue.pop(0)
            key = AttemptKey(base.key.digest, amp)
            if key in self.tried:
                continue
            index = len(self.attempts)
            return AttemptRecord(
                index=index,
                label=f"available_memory_proportion {amp:g}",
                key=key,
                margin=base.margin,
                scale=base.scale,
                orders=base.orders,
                plan=base.plan,
                files=base.files,
                directory=base.directory.parent / f"attempt-{index}",
            )
        return None

    async def _perf_variant(self) -> AttemptRecord | None:
        if self.perf_variants is None:
            margins = sorted({self.margin, self.margin * 1.1, self.margin * 1.25, *self.config.search.speculative_margins})
            self.perf_variants = [(m, o) for m in margins for o in (None, ("file",), ("depth_first",))]
        best = self._best_ok()
        assert best is not None
        measured = [a for a in self.attempts if a.measured_s is not None]
        if not measured or best.measured_s is None:
            return None
        ratio = min(a.measured_s / a.predicted_s for a in measured if a.predicted_s > 0 and a.measured_s)
        while self.perf_variants:
            margin, orders = self.perf_variants.pop(0)
            try:
                record = await self._candidate("optimal-perf variant", margin, self.scale, orders, self.default_amp)
            except PlanInfeasibleError:
                continue
            if record is None:
                continue
            if record.predicted_s * ratio * _PERF_BAND < best.measured_s:
                return record
            shutil.rmtree(record.directory, ignore_errors=True)
        return None

    # -- outcomes --------------------------------------------------------------------------

    def _any_ok(self) -> bool:
        return any(a.outcome is not None and a.outcome.outcome == "ok" for a in self.attempts)

    def _best_ok(self) -> AttemptRecord | None:
        oks = [a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "ok"]
        if not oks:
            return None
        if (self.optimal_perf or self.measured_times is not None) and any(a.throughput for a in oks):
            return max((a for a in oks if a.throughput), key=lambda a: a.throughput or 0.0)
        return min(oks, key=lambda a: a.predicted_s)

    def _handle(self, record: AttemptRecord, outcome: AttemptOutcome) -> None:
        record.outcome = outcome
        kind = outcome.outcome
        if kind == "ok":
            times = (outcome.details or {}).get("node_times_s")
            if self.calibrate and self.measured_times is None and times:
                self.measured_times = dict(times)
                self.calibrate_pending = True
                return
            better_running = [a for a in self.running.values() if a.predicted_s < record.predicted_s]
            if not self.optimal_perf and not better_running and not self.calibrate_pending:
                self.done = True
        elif kind == "oom" and outcome.oom is not None:
            predicted = [int(s["memory_bytes"]) for s in record.plan["stages"]]
            device = outcome.oom.device
            history = self.observations.get(device, []) if device is not None else []
            if device is not None:
                self.oom_devices.add(device)
            correction = corrected_scale(
                record.scale,
                outcome.oom,
                predicted,
                self.target.memory_bytes,
                self.target.bytes_per_tile,
                margin=record.margin,
                spread=SYSTEMIC_SPREAD if len(self.oom_devices) > 1 else 0.0,
                history=history,
            )
            if device is not None and correction.measured_fraction is not None and correction.predicted_fraction:
                self.observations.setdefault(device, []).append(
                    (correction.predicted_fraction, correction.measured_fraction)
                )
            record.correction = correction
            self.scale = tuple(max(a, b) for a, b in zip(self.scale, correction.after, strict=True))
            self.last_oom_device = correction.device
            if record.key.amp == self.default_amp:
                self.need_base = True
                self.spec_margins = list(self.config.search.speculative_margins)
        elif kind == "invalid":
            if "verification failed" in outcome.message:
                self.fatal = VerificationError(outcome.message)
            elif not self._any_ok():
                self.fatal = CompileFailedError(
                    f"the {self.backend} backend rejected the sharded model: {outcome.message.splitlines()[0] if outcome.message else 'no message'}",
                    hint="see report.json attempts[].message for the full compiler text",
                )

    # -- the loop --------------------------------------------------------------------------

    def _may_start(self) -> bool:
        if len(self.attempts) >= self.max_attempts or len(self.running) >= self.parallel:
            return False
        if not self.running:
            return True
        return self.pool.busy + self.pool.waiting < self.pool.max_parallel

    async def _run_one(self, record: AttemptRecord, send: MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]]) -> None:
        request = AttemptRequest(
            backend=self.backend,
            model=record.files["model"],
            artifact=str(record.directory / f"{self.stem}.{'popef' if self.backend == 'poprt' else 'artifact'}"),
            num_devices=self.devices,
            options=attempt_options(
                self.backend,
                self.config,
                amp=record.key.amp if self.backend == "poprt" else None,
                profile=self.calibrate and self.measured_times is None,
                stages_dir=str(record.directory / "stages"),
            ),
            tiles_per_device=self.target.tiles,
            benchmark=self.optimal_perf or self.backend == "onnxruntime",
            warmup=self.config.poprt.benchmark_warmup,
            runs=self.config.poprt.benchmark_runs,
            batch_size=self.config.plan.batch_size,
        )
        record.directory.mkdir(parents=True, exist_ok=True)
        async with send:
            await self._attempt(record, request, send)

    async def _attempt(
        self,
        record: AttemptRecord,
        request: AttemptRequest,
        send: MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]],
    ) -> None:
        with record.scope:
            outcome = await run_attempt(
                request,
                record.directory,
                pool=self.pool,
                job_id=self.job_id,
                priority=self.priority,
                timeout=self.timeout,
                kill_grace=self.kill_grace,
                env=self.env,
                argv_prefix=self.argv_prefix,
            )
            await send.send((record, outcome))

    def _start(self, tg: TaskGroup, record: AttemptRecord, send: MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]]) -> None:
        self.attempts.append(record)
        self.tried.add(record.key)
        self.running[record.index] = record
        self.emit(
            "attempt.started",
            {"attempt": record.index, "label": record.label, "digest": record.key.digest,
             **({"amp": record.key.amp} if self.backend == "poprt" else {})},  # only PopRT has the option
        )
        tg.start_soon(self._run_one, record, send.clone())

    async def run(self) -> ProveResult:
        send, receive = anyio.create_memory_object_stream[tuple[AttemptRecord, AttemptOutcome]](math.inf)
        failure: SharderdError | None = None
        async with send, receive, anyio.create_task_group() as tg:
            while True:
                try:
                    while self._may_start():
                        record = await self._next()
                        if record is None:
                            break
                        self._start(tg, record, send)
                except SharderdError as err:
                    # Planning failed (e.g. its worker died): stop the attempts, then report it
                    # as itself, not wrapped in the task group's exception group.
                    failure = err
                    for other in self.running.values():
                        other.scope.cancel()
                    self.running.clear()
                    break
                if not self.running:
                    break
                record, outcome = await receive.receive()
                self.running.pop(record.index, None)
                self._handle(record, outcome)
                self.emit(
                    "attempt.finished",
                    {
                        "attempt": record.index,
                        "result": outcome.outcome,
                        "duration_s": round(outcome.duration_s, 3),
                        "device": outcome.oom.device if outcome.oom else None,
                        "bytes_used": outcome.oom.bytes_used if outcome.oom else None,
                        "message": (outcome.message or "").splitlines()[0][:300] if outcome.message else "",
                    },
                )
                if self.done:
                    for other in self.running.values():
                        other.scope.cancel()
                    self.running.clear()
                    break
        if failure is not None:
            raise failure
        return self._result()

    def _result(self) -> ProveResult:
        best = self._best_ok()
        if best is not None:
            return ProveResult(best, tuple(self.attempts))
        if self.fatal is not None:
            raise self.fatal
        ooms = [a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "oom"]
        if ooms or self.infeasible is not None:
            raise self._does_not_fit(ooms)
        outcomes = ", ".join(f"#{a.index} {a.outcome.outcome if a.outcome else 'cancelled'}" for a in self.attempts)
        last = next((a.outcome for a in reversed(self.attempts) if a.outcome is not None), None)
        detail = ""
        if last is not None:
            detail = f"; last: {last.message.splitlines()[0] if last.message else ''} {last.stderr_tail[-300:].strip()}"
        raise CompileFailedError(
            f"no plan compiled after {len(self.attempts)} attempt(s) ({outcomes}){detail}",
            hint="see report.json attempts[] for each outcome; raise attempt_timeout if compiles time out",
        )

    def _does_not_fit(self, ooms: list[AttemptRecord]) -> PlanInfeasibleError:
        if not ooms:
            assert self.infeasible is not None
            return self.infeasible
        worst = ooms[-1]
        oom = worst.outcome.oom if worst.outcome else None
        device = oom.device if oom else None
        over = ""
        if oom is not None and oom.bytes_used is not None and self.target.bytes_per_tile:
            over = f" (worst tile {fmt_bytes(oom.bytes_used)} of {fmt_bytes(oom.tile_bytes or self.target.bytes_per_tile)})"
        base = f"the model does not fit on {self.devices} × {self.target.name}: {len(self.attempts)} compile(s) ran out of memory"
        where = f", last on device {device}{over}" if device is not None else ""
        why = ""
        min_devices = None
        if self.infeasible is not None:
            why = f"; with the corrections learned from them no split fits: {self.infeasible.message}"
            min_devices = self.infeasible.min_devices
        return PlanInfeasibleError(
            base + where + why,
            hint="use more devices, a smaller batch, or a larger available_memory_proportion budget",
            device=device,
            short_bytes=None if self.infeasible is None else self.infeasible.short_bytes,
            min_devices=min_devices,
        )
