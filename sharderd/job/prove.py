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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

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
from sharderd.job.session import PlanRequest, PlanSession
from sharderd.plan.choose import Compiled, best_compiled
from sharderd.plan.search import (
    AttemptKey,
    Correction,
    Observation,
    SearchState,
    amp_retry,
    hypothesis_scales,
    learn,
    observe,
    stage_views,
)
from sharderd.target import Target
from sharderd.units import fmt_bytes

__all__ = ["AttemptRecord", "Emit", "ProveResult", "Prover"]

Emit = Callable[[str, Mapping[str, Any]], None]
_MAX_ESCALATIONS = 12
_PERF_BAND = 0.9
"""optimal_perf compiles a plan if its predicted time, scaled by the best measured/predicted ratio,
is within this factor of the best measured period (seconds per batch at the measured throughput)."""


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
    request: PlanRequest
    """What planned it: the written result re-plans from exactly this (only the folder differs)."""
    outcome: AttemptOutcome | None = None
    correction: Correction | None = None
    measured_times: Mapping[str, float] | None = None
    """Node times the plan was made with (``cost_model = "measured"``), else None."""
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    cancelled_because: str | None = None
    """Why the attempt was stopped before it finished (a better plan compiled, the job stopped)."""

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
            "message": out.message if out else f"cancelled: {self.cancelled_because or 'the job stopped before it finished'}",
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
            data["benchmark"] = None if out.benchmark is None else out.benchmark.to_dict()
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
        self.infeasible: PlanInfeasibleError | None = None
        """Set once "does not fit" is settled: the model as measured has no split either."""
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

    # -- planning --------------------------------------------------------------------------

    def _request(self, margin: float, scale: tuple[float, ...], orders: tuple[str, ...] | None, write_dir: str | None, devices: int | None = None) -> PlanRequest:
        # No correction learned yet: say so (None), so the planner returns its least overfull split
        # for a compile to decide instead of refusing without a proof.
        learned = None if all(x == 1.0 for x in scale) else scale
        return PlanRequest(
            devices or self.devices, margin, learned, orders, write_dir=write_dir, stem=self.stem, measured_times=self.measured_times
        )

    async def _plan(self, *, margin: float, scale: tuple[float, ...], orders: tuple[str, ...] | None, amp: float) -> tuple[dict[str, Any], tuple[float, ...]] | None:
        """A plan whose (digest, amp) was never tried, escalating the last correction if needed."""
        state = self.state
        for _ in range(_MAX_ESCALATIONS):
            result = await self.session.plan(self._request(margin, scale, orders, None))
            if AttemptKey(result["plan"]["digest"], amp) not in self.tried:
                self.state = state
                return result, scale
            if orders is not None or margin != self.margin:
                return None  # a variant that reproduces a tried split adds nothing
            state = state.escalate(state.last_oom_device())
            scale = state.scales()
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
        request = self._request(margin, used_scale, orders, str(directory))
        result = await self.session.plan(request)
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
            request=request,
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
                record = None
                if err.fits_without_margin and self.margin > 1.0 and not self.state.observations:
                    # Only the margin rules it out: the compiler, not the prior, should decide.
                    self.margin = 1.0
                    self.state = replace(self.state, margin=1.0)
                    self.spec_margins = []
                    self.need_base = True
                    return await self._next()
                record = await self._verdict_check(err)
            if record is not None:
                return record
        if self.infeasible is None and not self._any_ok():
            spec = await self._speculative()
            if spec is not None:
                return spec
        if self.optimal_perf and self._any_ok():
            return await self._perf_variant()
        amp_running = any(a.key.amp != self.default_amp for a in self.running.values())
        if self.infeasible is not None and self.backend == "poprt" and not self._any_ok() and not amp_running:
            return self._amp_retry()  # one at a time: a higher proportion that compiles runs faster
        return None

    async def _speculative(self) -> AttemptRecord | None:
        """A variant for a free pool slot: a larger margin before any OOM, the systemic guess after."""
        if self.hypothesis_pending:
            self.hypothesis_pending = False
            guess = hypothesis_scales(self.state.model(), self.margin)
            if guess is not None:
                try:
                    record = await self._candidate("speculative: every device as corrected as the worst", self.margin, guess, None, self.default_amp)
                except PlanInfeasibleError:
                    record = None
                if record is not None:
                    return record
        if self.spec_margins and not self.state.observations:
            margin = self.spec_margins.pop(0)
            try:
                record = await self._candidate(f"speculative margin {margin:g}", margin, self.scale, None, self.default_amp)
            except PlanInfeasibleError:
                record = None
            if record is not None:
                return record
        return None

    async def _verdict_check(self, err: PlanInfeasibleError) -> AttemptRecord | None:
        """The corrected model has no split: is that true of every model the compiles allow?

        Without any compile the planner's own proof stands. Otherwise plan with the model exactly
        as measured (``SearchState.estimate``: no margin, no headroom): no split there settles
        "does not fit"; a split there is compiled, because the verdict would rest on the margin.
        """
        if not self.state.observations:
            self.infeasible = err
            return None
        estimate = self.state.estimate()
        try:
            planned = await self._plan(margin=1.0, scale=estimate, orders=None, amp=self.default_amp)
        except PlanInfeasibleError as settled:
            self.infeasible = settled
            return None
        if planned is None:  # its split was compiled already and ran out of memory
            self.infeasible = err
            return None
        return await self._candidate("verdict check: the model as measured, no margin", 1.0, estimate, None, self.default_amp)

    def _amp_retry(self) -> AttemptRecord | None:
        """At most one lower ``available_memory_proportion`` per level, and only when its share can close the gap."""
        ooms = [
            (o, a)
            for a in self.attempts
            for o in self.state.observations
            if o.attempt == a.index and not o.fits and a.outcome is not None and a.outcome.outcome == "oom"
        ]
        if not ooms:
            return None
        tried_amps = sorted({a.key.amp for _, a in ooms}, reverse=False)
        lowest = tried_amps[0]
        at_lowest = [(o, a) for o, a in ooms if a.key.amp == lowest]
        observation, base = min(at_lowest, key=lambda pair: pair[0].measured if pair[0].measured is not None else math.inf)
        amp = amp_retry(observation, lowest, self.config.search.amp_fallbacks)
        if amp is None:
            if not self.settle_note:
                self.settle_note = self._amp_note(observation)
            return None
        key = AttemptKey(base.key.digest, amp)
        if key in self.tried:
            return None
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
            request=base.request,
            measured_times=base.measured_times,
        )

    def _amp_note(self, observation: Observation) -> str:
        if observation.stage is None or observation.measured is None:
            return ""
        lowest = min(self.config.search.amp_fallbacks, default=observation.amp)
        share = observation.stage.activation_share * (1 - lowest / observation.amp) if observation.amp else 0.0
        return (
            f"; a lower available_memory_proportion was not tried: the conv/matmul temporaries it bounds are at most "
            f"{share * 100:.0f}% of device {observation.stage.device}'s worst tile even at {lowest:g}, "
            f"the gap is {(observation.measured - 1) / observation.measured * 100:.0f}%"
        )

    async def _perf_variant(self) -> AttemptRecord | None:
        if self.perf_variants is None:
            margins = sorted({self.margin, self.margin * 1.1, self.margin * 1.25, *self.config.search.speculative_margins})
            self.perf_variants = [(m, o) for m in margins for o in (None, ("file",), ("depth_first",))]
        best = self._best_ok()
        assert best is not None
        batch = self.config.plan.batch_size
        periods = {a.index: p for a in self.attempts if (p := a.measured_period_s(batch))}
        if not periods or best.index not in periods:
            return None
        ratio = min(periods[a.index] / a.predicted_s for a in self.attempts if a.index in periods and a.predicted_s > 0)
        best_period = periods[best.index]
        while self.perf_variants:
            margin, orders = self.perf_variants.pop(0)
            try:
                record = await self._candidate("optimal-perf variant", margin, self.state.scales(), orders, self.default_amp)
            except PlanInfeasibleError:
                continue
            if record is None:
                continue
            if record.predicted_s * ratio * _PERF_BAND < best_period:
                return record
            shutil.rmtree(record.directory, ignore_errors=True)
        return None

    # -- outcomes --------------------------------------------------------------------------

    def _any_ok(self) -> bool:
        return any(a.outcome is not None and a.outcome.outcome == "ok" for a in self.attempts)

    def _best_ok(self) -> AttemptRecord | None:
        oks = {a.index: a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "ok"}
        choice = best_compiled(
            [Compiled(a.index, a.predicted_s, a.throughput, a.outcome.benchmark.latency_s if a.outcome and a.outcome.benchmark else None) for a in oks.values()],
            by_measurement=self.optimal_perf or self.measured_times is not None,
        )
        return None if choice is None else oks[choice.attempt]

    def _handle(self, record: AttemptRecord, outcome: AttemptOutcome) -> None:
        record.outcome = outcome
        kind = outcome.outcome
        if kind in ("ok", "oom") and (kind == "ok" or outcome.oom is not None):
            views = stage_views(record.plan, self.target.memory_bytes)
            new = observe(
                record.index,
                views,
                kind="ok" if kind == "ok" else "oom",
                amp=record.key.amp,
                oom=outcome.oom,
                tile_bytes=self.target.bytes_per_tile,
                device_memory=outcome.device_memory,
                device_capacity=self.target.memory_bytes,
            )
            self.state, record.correction = learn(self.state, record.key, new)
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
            if record.key.amp == self.default_amp and self.infeasible is None:
                self.need_base = True
                self.hypothesis_pending = True
        elif kind == "invalid":
            if outcome.cause == "verification":
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
                reference_model=self.reference_model,
                precision=self.precision,
                input_shapes=self.input_shapes,
            ),
            tiles_per_device=self.target.tiles,
            benchmark=self.optimal_perf or self.backend == "onnxruntime",
            warmup=self.config.poprt.benchmark_warmup,
            runs=self.config.poprt.benchmark_runs,
            batch_size=self.config.plan.batch_size,
            precision=self.precision,
            input_shapes=self.input_shapes,
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
        self.state = replace(self.state, tried=self.state.tried | {record.key})
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
        try:
            await self._loop(send, receive)
        except anyio.get_cancelled_exc_class():
            for other in self.running.values():
                other.cancelled_because = self.stop_reason or "the job was cancelled (sharderd cancel, or the daemon stopping)"
            raise
        except _PlanningFailed as failed:
            failure = failed.error
        if failure is not None:
            raise failure
        return await self._result()

    async def _loop(
        self,
        send: MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]],
        receive: MemoryObjectReceiveStream[tuple[AttemptRecord, AttemptOutcome]],
    ) -> None:
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
                        other.cancelled_because = f"planning failed: {err.message}"
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
                        other.cancelled_because = f"attempt {record.index} compiled first and no running attempt can beat it"
                        other.scope.cancel()
                    self.running.clear()
                    break
        if failure is not None:
            raise _PlanningFailed(failure)

    async def _result(self) -> ProveResult:
        best = self._best_ok()
        if best is not None:
            return ProveResult(best, tuple(self.attempts))
        if self.fatal is not None:
            raise self.fatal
        ooms = [a for a in self.attempts if a.outcome is not None and a.outcome.outcome == "oom"]
        if self.infeasible is not None:
            raise await self._does_not_fit(ooms)
        if ooms:
            raise CompileFailedError(
                f"no plan fitted in {len(self.attempts)} compile(s) on {self.devices} × {self.target.name} "
                f"({len(ooms)} ran out of memory); the corrected model still allows splits, so this is not "
                "a proof that the model does not fit",
                hint=f"rerun with --max-attempts {self.max_attempts * 2} or --devices {self.devices + 1}",
            )
        outcomes = ", ".join(f"#{a.index} {a.outcome.outcome if a.outcome else 'cancelled'}" for a in self.attempts)
        last = next((a.outcome for a in reversed(self.attempts) if a.outcome is not None), None)
        detail = ""
        if last is not None:
            detail = f"; last: {last.message.splitlines()[0] if last.message else ''} {last.stderr_tail[-300:].strip()}"
        raise CompileFailedError(
            f"no plan compiled after {len(self.attempts)} attempt(s) ({outcomes}){detail}",
            hint="see report.json attempts[] for each outcome; raise attempt_timeout if compiles time out",
        )

    async def _does_not_fit(self, ooms: list[AttemptRecord]) -> PlanInfeasibleError:
        """The settled verdict, from the model that settled it: never a count that contradicts it."""
        assert self.infeasible is not None
        if not ooms:
            return self.infeasible  # the planner's own proof, before any compile
        worst = ooms[-1]
        oom = worst.outcome.oom if worst.outcome else None
        device = oom.device if oom else None
        over = ""
        if oom is not None and oom.bytes_used is not None and self.target.bytes_per_tile:
            over = f" (worst tile {fmt_bytes(oom.bytes_used)} of {fmt_bytes(oom.tile_bytes or self.target.bytes_per_tile)})"
        base = f"the model does not fit on {self.devices} × {self.target.name}: {len(ooms)} compile(s) ran out of memory"
        where = f", last on device {device}{over}" if device is not None else ""
        settled = self.infeasible
        short = ""
        if settled.device is not None and settled.short_bytes is not None and settled.short_bytes > 0:
            short = f": device {settled.device} would be short by {fmt_bytes(settled.short_bytes)}"
        why = (
            "; no split fits the memory model that reproduces every compile, even without a safety margin"
            + short
        )
        min_devices = await self._fewest_devices()
        more = f" Under that correction {min_devices} devices have a split." if min_devices else ""
        hint = (
            f"rerun with --devices {min_devices}" if min_devices
            else "use more devices or a smaller batch"
        )
        return PlanInfeasibleError(
            base + where + why + self.settle_note + "." + more,
            hint=hint,
            device=device,
            short_bytes=settled.short_bytes,
            min_devices=min_devices,
        )

    async def _fewest_devices(self, extra: int = 8) -> int | None:
        """The fewest devices above the requested count with a split under the measured model."""
        estimate = self.state.estimate()
        for devices in range(self.devices + 1, self.devices + extra + 1):
            scale = (*estimate, *(1.0,) * (devices - self.devices))
            try:
                await self.session.plan(self._request(1.0, scale, None, None, devices))
            except PlanInfeasibleError:
                continue
            return devices
        return None


class _PlanningFailed(Exception):
    """Carries a planning error out of the task group, so it surfaces as itself."""

    def __init__(self, error: SharderdError) -> None:
        super().__init__(error.message)
        self.error = error
