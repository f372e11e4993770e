"""Prove a plan by compiling it: the loop around the pure search (``plan.search``): plan what
``next_attempts`` asks for, start what it approved when a pool slot is free, feed every answer to
``learn``. It decides nothing the verdict rests on; it plans, writes, compiles and reports."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from sharderd.backends.attempt import run_attempt
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import attempt_options
from sharderd.config import Config, SearchOptions
from sharderd.errors import NoSplitError, SharderdError
from sharderd.job.attempts import AttemptRecord, ProveResult, correction, finished
from sharderd.job.codec import ModelSummary
from sharderd.job.session import PlanRequest, PlanSession, ProbeRequest
from sharderd.job.verdict import ending, fewest_devices
from sharderd.plan.observations import AttemptKey, stage_views
from sharderd.plan.search import learn, next_attempts
from sharderd.plan.search_state import (
    Attempt,
    Planned,
    SearchState,
    Settings,
    Started,
    Unplanned,
    Verdict,
)
from sharderd.target import Target

__all__ = ["AttemptRecord", "Emit", "ProveResult", "Prover"]

Emit = Callable[[str, Mapping[str, Any]], None]
Outcomes = MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]]


@dataclass(slots=True, kw_only=True)
class Prover:
    session: PlanSession
    model: Path
    """The user's model (the onnxruntime backend checks the stages against it)."""
    stem: str
    devices: int
    config: Config
    search: SearchOptions
    job_id: str
    priority: int
    max_devices: int | None
    """Set when the job asked for ``devices = "auto"``: every plan says so (``Plan.max_devices``)."""
    summary: ModelSummary
    backend: str
    target: Target
    workdir: Path
    pool: AttemptPool
    emit: Emit
    env: Mapping[str, str] | None = None
    argv_prefix: list[str] | None = None
    attempts: list[AttemptRecord] = field(default_factory=list)
    state: SearchState = field(init=False)
    _prepared: dict[Attempt, AttemptRecord] = field(init=False, default_factory=dict)
    """A probe or AMP retry written while planned, until the search approves its compile."""

    def __post_init__(self) -> None:
        poprt, config, plan = self.backend == "poprt", self.config, self.config.plan
        settings = Settings(
            devices=self.devices,
            margin=plan.safety_margin,
            default_amp=config.poprt.available_memory_proportion if poprt else 0.0,
            fallbacks=tuple(config.search.amp_fallbacks) if poprt else (),
            speculative_margins=tuple(config.search.speculative_margins),
            max_attempts=self.search.max_attempts,
            optimal_perf=self.search.optimal_perf,
            calibrate=plan.cost_model == "measured" and self.backend == "onnxruntime",
            probe=poprt,
            amp_per_stage=poprt and config.search.amp_per_stage,
        )
        self.state = SearchState(settings, plan.safety_margin)

    async def run(self) -> ProveResult:
        send, receive = anyio.create_memory_object_stream[tuple[AttemptRecord, AttemptOutcome]](
            math.inf
        )
        reason = "the job was cancelled (sharderd cancel, or the daemon stopping)"
        failure: SharderdError | None = None
        try:
            async with send, receive, anyio.create_task_group() as tg:
                while True:
                    wanted = next_attempts(self.state)
                    if isinstance(wanted, Verdict):
                        try:  # an outcome already in may contradict it: the compile wins
                            self._finish(*receive.receive_nowait())
                            continue
                        except anyio.WouldBlock:
                            break
                    if wanted and self._slot_free():
                        try:
                            await self._advance(tg, wanted[0], send)
                        except SharderdError as err:  # planning failed (e.g. its worker died)
                            failure = err
                            self._cancel_running(f"planning failed: {err.message}")
                            break
                        continue
                    self._finish(*await receive.receive())
                if isinstance(wanted, Verdict):
                    reason = _why_stopped(wanted)
                    self._cancel_running(reason)
        except anyio.get_cancelled_exc_class():
            self._cancel_running(reason, cancel=False)
            raise
        if failure is not None:
            raise failure
        assert isinstance(wanted, Verdict)
        state = self.state

        def measured(devices: int) -> PlanRequest:
            scale = (*state.scales(), *(1.0,) * (devices - self.devices))
            as_measured = replace(state.plan_attempt("verdict"), scale=scale)
            return self._request(as_measured, devices=devices)

        result = await ending(
            self.attempts,
            wanted,
            devices=self.devices,
            target=self.target,
            backend=self.backend,
            max_attempts=state.settings.max_attempts,
            fewest=lambda: fewest_devices(self.session, measured, self.devices),
        )
        if result.contradiction is not None:
            self.emit("verdict.contradiction", asdict(result.contradiction))
        return result

    def _input_shapes(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in self.summary.input_shapes.items()}

    def _slot_free(self) -> bool:
        running = len(self.state.running())
        if running >= max(1, self.search.parallel):
            return False
        return not running or self.pool.busy + self.pool.waiting < self.pool.max_parallel

    def _cancel_running(self, reason: str, *, cancel: bool = True) -> None:
        for a in self.state.running():
            record = self.attempts[a.index]
            record.cancelled_because = record.cancelled_because or reason
            if cancel:
                record.scope.cancel()

    def _request(
        self, attempt: Attempt, write_dir: str | None = None, devices: int | None = None
    ) -> PlanRequest:
        """No correction learned yet is None, so the planner returns its least overfull split for
        a compile to decide instead of refusing without a proof."""
        scale, content = attempt.scale, attempt.content
        return PlanRequest(
            devices or self.devices,
            attempt.margin,
            None if all(x == 1.0 for x in scale) else scale,
            attempt.orders,
            write_dir=write_dir,
            stem=self.stem,
            measured_times=dict(self.state.measured_times or ()) or None,
            content=None if content.identity else content,
            matmul_serialization=attempt.serialize,
            max_devices=self.max_devices,
        )

    async def _advance(self, tg: TaskGroup, wanted: Attempt | Planned, send: Outcomes) -> None:
        """Plan ``wanted`` and tell the search what the planner said, or start the compile it
        approved."""
        if isinstance(wanted, Attempt):
            try:
                planned = await self._plan(wanted)
            except NoSplitError as err:
                self.state = learn(self.state, Unplanned(wanted, err))
                return
            self.state = learn(self.state, planned or Unplanned(wanted))
            return
        record = self._prepared.pop(wanted.attempt, None) or await self._write(wanted)
        self.attempts.append(record)
        started = Started(
            record.index,
            wanted.attempt,
            record.key,
            record.predicted_s,
            serializable=record.serializable,
        )
        self.state = learn(self.state, started)
        amp: dict[str, Any] = {"amp": record.key.amp} if self.backend == "poprt" else {}
        if record.key.stage_amps is not None:
            amp["stage_amps"] = list(record.key.stage_amps)
        self.emit(
            "attempt.started",
            {"attempt": record.index, "label": record.label, "digest": record.key.digest, **amp},
        )
        tg.start_soon(self._run_one, record, send.clone())

    async def _plan(self, attempt: Attempt) -> Planned | None:
        """What the planner makes of ``attempt`` (None: the probe has no node to compile). A probe
        or an AMP retry is written now (its record kept until the search approves it); a plan's
        files only once approved."""
        index = len(self.attempts)
        if attempt.kind in ("probe", "amp"):
            if attempt.kind == "probe":
                prepared = await self._probe(attempt, index)
            else:
                prepared = await self._amp_record(attempt, index)
            if prepared is None:
                return None
            self._prepared = {attempt: prepared}
            return Planned(attempt, prepared.key, prepared.predicted_s)
        dry = await self.session.plan(self._request(attempt))
        key = AttemptKey(dry.plan.digest, attempt.amp, serialize=attempt.serialize)
        return Planned(attempt, key, dry.plan.bottleneck_s)

    async def _write(self, planned: Planned) -> AttemptRecord:
        """The approved split's files, written for its compile."""
        attempt, index = planned.attempt, len(self.attempts)
        directory = self._fresh(index)
        request = self._request(attempt, str(directory))
        written = await self.session.plan(request)
        assert written.files is not None
        record = AttemptRecord(
            index=index,
            label=attempt.label,
            key=replace(planned.key, digest=written.plan.digest),
            margin=attempt.margin,
            scale=attempt.scale,
            orders=attempt.orders,
            plan=written.plan,
            views=stage_views(written.plan, self.target.memory_bytes),
            model=written.files.model,
            directory=directory,
            request=request,
            measured_times=request.measured_times,
        )
        self.emit(
            "plan.finished",
            {
                "label": attempt.label,
                "digest": record.key.digest,
                "bottleneck_s": record.predicted_s,
                "ratio_to_bound": written.plan.ratio_to_bound,
                "memory_scale": list(attempt.scale),
            },
        )
        return record

    async def _amp_record(self, attempt: Attempt, index: int) -> AttemptRecord:
        """An AMP retry: the same split at a lower global AMP (the same file), or, per stage,
        written again with ``__available_memory`` on the lowered stages' conv/matmul nodes."""
        assert attempt.of is not None
        base = self.attempts[attempt.of]
        key = replace(base.key, amp=attempt.amp, stage_amps=attempt.stage_amps)
        directory = self.workdir / f"attempt-{index}"
        retry = replace(base, index=index, label=attempt.label, key=key, directory=directory)
        had = base.request is not None and base.request.stage_amps is not None
        if (attempt.stage_amps is None and not had) or base.request is None:
            return retry
        own = (
            None
            if attempt.stage_amps is None
            else tuple(None if a == attempt.amp else a for a in attempt.stage_amps)
        )
        request = replace(base.request, write_dir=str(self._fresh(index)), stage_amps=own)
        planned = await self.session.plan(request)
        if planned.plan.digest != base.key.digest or planned.files is None:  # deterministic
            raise SharderdError("internal error: re-planning a split for an AMP retry changed it")
        return replace(retry, model=planned.files.model, request=request)

    async def _probe(self, attempt: Attempt, index: int) -> AttemptRecord | None:
        """The node needing most of a device alone, to compile alone (``plan.probe``)."""
        path = self._fresh(index) / f"{self.stem}.probe.onnx"
        found = await self.session.probe(ProbeRequest(str(path), attempt.serialize))
        if found is None:
            return None
        self.emit("probe.planned", {"node": found.name, "need": round(found.need, 4)})
        serial = dict(attempt.serialize).get(found.name)
        return AttemptRecord(
            index=index,
            label=f"probe: node {found.name!r} alone on one device"
            + (f", matmul serialized ×{serial}" if serial else ""),
            key=AttemptKey(f"probe:{found.name}", attempt.amp, serialize=attempt.serialize),
            margin=1.0,
            scale=(1.0,),
            orders=None,
            plan=None,
            views=(found.view,),
            model=found.model,
            directory=self.workdir / f"attempt-{index}",
            request=None,
            probe_node=found.name,
            serializable=(found.name, found.serial_factor) if found.serial_factor else None,
        )

    def _fresh(self, index: int) -> Path:
        """The attempt's folder, emptied: a probe writes its model there before it starts."""
        directory = self.workdir / f"attempt-{index}"
        if directory.exists():
            shutil.rmtree(directory)
        return directory

    async def _run_one(self, record: AttemptRecord, send: Outcomes) -> None:
        probe, poprt = record.probe_node is not None, self.backend == "poprt"
        options = attempt_options(
            self.backend,
            self.config,
            amp=record.key.amp if poprt else None,
            profile=self.state.settings.calibrate and self.state.measured_times is None,
            stages_dir=str(record.directory / "stages"),
            reference_model=self.model,
            precision=self.summary.precision,
            input_shapes=self._input_shapes(),
        )
        request = AttemptRequest(
            backend=self.backend,
            model=str(record.model),
            artifact=str(record.directory / f"{self.stem}.{'popef' if poprt else 'artifact'}"),
            num_devices=1 if probe else self.devices,
            options=options,
            tiles_per_device=self.target.tiles,
            benchmark=not probe and (self.state.settings.optimal_perf or not poprt),
            warmup=self.config.poprt.benchmark_warmup,
            runs=self.config.poprt.benchmark_runs,
            batch_size=self.config.plan.batch_size,
            precision=self.summary.precision,
            input_shapes=None if probe else self._input_shapes(),
        )
        record.directory.mkdir(parents=True, exist_ok=True)
        async with send:
            with record.scope:
                outcome = await run_attempt(
                    request,
                    record.directory,
                    pool=self.pool,
                    job_id=self.job_id,
                    priority=self.priority,
                    timeout=self.search.attempt_timeout,
                    kill_grace=self.search.kill_grace,
                    env=self.env,
                    argv_prefix=self.argv_prefix,
                )
                await send.send((record, outcome))

    def _finish(self, record: AttemptRecord, outcome: AttemptOutcome) -> None:
        record.outcome = outcome
        event = finished(record, outcome, self.target, self.config.plan.batch_size)
        self.state = learn(self.state, event)
        record.correction = correction(record.views, event.observations, self.state.content())
        oom = outcome.oom
        first_line = (outcome.message or "").splitlines()[0][:300] if outcome.message else ""
        self.emit(
            "attempt.finished",
            {
                "attempt": record.index,
                "result": outcome.outcome,
                "duration_s": round(outcome.duration_s, 3),
                "device": oom.device if oom else None,
                "bytes_used": oom.bytes_used if oom else None,
                "message": first_line,
            },
        )


def _why_stopped(verdict: Verdict) -> str:
    if verdict.kept is not None:
        return f"attempt {verdict.kept} compiled and no running attempt can beat it"
    if verdict.error is not None:
        return f"the search ended: {verdict.error.message.splitlines()[0]}"
    if verdict.proof is not None:
        return f"the probe (attempt {verdict.proof}) proved that no split fits"
    if verdict.failed is not None:
        return f"attempt {verdict.failed[1]} failed ({verdict.failed[0]})"
    return "the search ended without a fitting split"
