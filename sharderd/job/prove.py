"""Prove a plan by compiling it, learning from every outcome, stopping as early as possible.

The loop: compile the best plan; with a free pool slot, also a speculative variant. Each outcome
becomes observations (``plan.search.learn``) from which the memory model is derived again, and
the exact planner re-solves; a split is never compiled twice with the same options. What to
compile next is ``NextAttempt``; how the search ends (the kept plan, or "does not fit" only when
the model as measured has no split) is ``Verdict``; docs/search.md has the rules.
"""

from __future__ import annotations

import math
from dataclasses import replace

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sharderd.backends.attempt import run_attempt
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import attempt_options
from sharderd.errors import (
    CompileFailedError,
    SharderdError,
    VerificationError,
)
from sharderd.job.attempts import AttemptRecord, ProveResult
from sharderd.job.next_attempt import NextAttempt
from sharderd.job.prover_state import Emit
from sharderd.job.session import PlanRequest
from sharderd.job.verdict import ending, fewest_devices, probe_proof
from sharderd.plan.search import (
    learn,
    observe,
    stage_views,
)

__all__ = ["AttemptRecord", "Emit", "ProveResult", "Prover"]


class Prover(NextAttempt):
    """One job's search: starts attempts, hands each outcome to the policy, stops as early as it can."""

    # -- outcomes --------------------------------------------------------------------------

    def _handle(self, record: AttemptRecord, outcome: AttemptOutcome) -> None:
        record.outcome = outcome
        kind = outcome.outcome
        if kind in ("ok", "oom") and (kind == "ok" or outcome.oom is not None):
            views = stage_views(record.plan, self.target.memory_bytes, record.contents)
            new = observe(
                record.index,
                views,
                kind="ok" if kind == "ok" else "oom",
                amp=record.key.amp,
                oom=outcome.oom,
                tile_bytes=self.target.bytes_per_tile,
            )
            self.state, record.correction = learn(self.state, record.key, new, views)
        if record.probe is not None:
            # A probe teaches memory only: it is never a result, and a probe PopRT rejects
            # (an op that will not compile alone) says nothing about the plan.
            if kind == "oom" and record.key.amp <= self.lowest_amp:
                self.proof = probe_proof(record, outcome, self.devices, self.target)
                self.stop_reason = f"attempt {record.index} proved no split fits: {record.probe} alone ran out of memory"
                self.done = True
            elif kind == "oom" and outcome.oom is not None and self.infeasible is None:
                self.need_base = True
            return
        if kind == "ok":
            times = (outcome.details or {}).get("node_times_s")
            if self.calibrate and self.measured_times is None and times:
                self.measured_times = dict(times)
                self.calibrate_pending = True
                return
            better_running = [
                a for a in self.running.values() if a.predicted_s < record.predicted_s
            ]
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

    async def _run_one(
        self,
        record: AttemptRecord,
        send: MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]],
    ) -> None:
        request = AttemptRequest(
            backend=self.backend,
            model=record.files["model"],
            artifact=str(
                record.directory
                / f"{self.stem}.{'popef' if self.backend == 'poprt' else 'artifact'}"
            ),
            num_devices=1 if record.probe is not None else self.devices,
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
            benchmark=record.probe is None and (self.optimal_perf or self.backend == "onnxruntime"),
            warmup=self.config.poprt.benchmark_warmup,
            runs=self.config.poprt.benchmark_runs,
            batch_size=self.config.plan.batch_size,
            precision=self.precision,
            input_shapes=None if record.probe is not None else self.input_shapes,
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

    def _start(
        self,
        tg: TaskGroup,
        record: AttemptRecord,
        send: MemoryObjectSendStream[tuple[AttemptRecord, AttemptOutcome]],
    ) -> None:
        self.attempts.append(record)
        self.state = replace(self.state, tried=self.state.tried | {record.key})
        self.running[record.index] = record
        self.emit(
            "attempt.started",
            {
                "attempt": record.index,
                "label": record.label,
                "digest": record.key.digest,
                **({"amp": record.key.amp} if self.backend == "poprt" else {}),
            },  # only PopRT has the option
        )
        tg.start_soon(self._run_one, record, send.clone())

    async def run(self) -> ProveResult:
        send, receive = anyio.create_memory_object_stream[tuple[AttemptRecord, AttemptOutcome]](
            math.inf
        )
        failure: SharderdError | None = None
        try:
            await self._loop(send, receive)
        except anyio.get_cancelled_exc_class():
            for other in self.running.values():
                other.cancelled_because = (
                    self.stop_reason
                    or "the job was cancelled (sharderd cancel, or the daemon stopping)"
                )
            raise
        except _PlanningFailed as failed:
            failure = failed.error
        if failure is not None:
            raise failure
        estimate, content = self.state.scales(), self.state.estimate_content()

        def measured(devices: int) -> PlanRequest:
            scale = (*estimate, *(1.0,) * (devices - self.devices))
            return self._request(1.0, scale, None, None, devices, content=content)

        return await ending(
            self.attempts,
            self._best_ok(),
            fatal=self.fatal,
            proof=self.proof,
            settled=self.infeasible,
            note=self.settle_note,
            devices=self.devices,
            target=self.target,
            max_attempts=self.max_attempts,
            fewest=lambda: fewest_devices(self.session, measured, self.devices),
        )

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
                        "message": (outcome.message or "").splitlines()[0][:300]
                        if outcome.message
                        else "",
                    },
                )
                if self.done:
                    for other in self.running.values():
                        other.cancelled_because = (
                            self.stop_reason
                            or f"attempt {record.index} compiled first and no running attempt can beat it"
                        )
                        other.scope.cancel()
                    self.running.clear()
                    break
        if failure is not None:
            raise _PlanningFailed(failure)


class _PlanningFailed(Exception):
    """Carries a planning error out of the task group, so it surfaces as itself."""

    def __init__(self, error: SharderdError) -> None:
        super().__init__(error.message)
        self.error = error
