"""One claimed job, run: options, content key, the planning worker and its compiles.

``attempts`` is bumped before every run of the planning worker, so a job whose worker (or the
whole daemon) keeps dying stops at ``max_worker_crashes`` (unset: its ``max_attempts``) across
restarts; a worker killed by a signal (``WorkerDiedError.signal``) or an attempt lost with its
cluster node runs the job again. A shutdown that cancels a job is not a crash: its count is given
back and the job stays in ``processing/`` for the next start. A cancel *request* (the job's
``JobProgress.cancel_requested`` set before its scope is cancelled) ends the job instead: its
attempts are dead by the time the cancellation reaches ``run_job``, and it is filed under
``failed/`` with reason ``cancelled``.
How each ending is made durable is ``daemon/filing.py``.

Failures are values here: an expected one (``SharderdError``) and an unexpected one (a bug) both
end the one job in ``failed/`` with ``error.json`` and ``error.md``; only cancellation propagates.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast, final

import anyio
import structlog

from sharderd.cluster.errors import AttemptLostError
from sharderd.config import search_options
from sharderd.daemon.dedup import content_key, effective_options, exclusive
from sharderd.daemon.filing import JobContext, JobFiling, job_facts
from sharderd.daemon.intake import ClaimedJob
from sharderd.daemon.journal import JobState
from sharderd.daemon.outbox import tmp_dir_for
from sharderd.daemon.sidecar import JobOptions, load_sidecar
from sharderd.daemon.status import JobProgress
from sharderd.errors import (
    BadJobError,
    ConfigError,
    InternalError,
    SharderdError,
    StorageError,
    WorkerCrashedError,
    WorkerDiedError,
    sole_exception,
)
from sharderd.filenames import safe_name
from sharderd.job.limits import PlanningLimits
from sharderd.job.run import JobFailed, JobResult, JobSpec, shard_job
from sharderd.logs import get_logger
from sharderd.target import BUILTIN_TARGETS

__all__ = ["JobRun", "run_job"]

_log = get_logger(__name__)


async def run_job(job: ClaimedJob, ctx: JobContext, progress: JobProgress) -> JobState:
    """Run ``job`` to a terminal state and return it; cancellation leaves it for the next start."""
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        run = JobRun(job, ctx, progress)
        try:
            return await run.run()
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if progress.cancel_requested is None:
                    run.files.interrupted()
                else:
                    run.files.cancelled(progress.cancel_requested)
            raise
        except OSError as exc:  # disk full, permissions; if filing it fails too, the daemon retries
            return run.files.fail(StorageError.of(exc), None)
        except Exception as exc:  # a bug must cost this job, never the daemon
            return run.files.fail(InternalError.of(exc), None, exc_info=exc)


@final
class JobRun:
    """One run of one job; owned by its task, so plainly mutable."""

    def __init__(self, job: ClaimedJob, ctx: JobContext, progress: JobProgress) -> None:
        self.job = job
        self.ctx = ctx
        self.progress = progress
        self.files = JobFiling(job, ctx, progress)
        self.work = self.files.work_root

    async def run(self) -> JobState:
        job, files = self.job, self.files
        files.journal(name=job.name, state="claimed")
        if job.problem is not None or job.model is None:
            return files.fail(BadJobError(job.problem or "the job holds no model"), None)
        try:
            options = self._options()
            effective = effective_options(self.ctx.config, options)
        except ConfigError as err:
            return files.fail(err, None)
        self.progress.priority = options.priority
        self.progress.stage = "hashing"
        self.ctx.board.changed()
        key = await content_key(job, effective)
        crashes = self.ctx.config.daemon.worker_crash_limit(options.max_attempts)
        files.journal(sha256=key, priority=options.priority, max_attempts=crashes)
        async with exclusive(self.ctx.inflight, key, on_wait=self._waiting_for_twin):
            original = self.ctx.journal.lookup(key)
            if original is not None and original.job_id != job.job_id:
                return files.duplicate(original)
            try:
                result = await self._shard(options)
            except Exception as exc:
                leaf = sole_exception(exc)
                if isinstance(leaf, JobFailed):
                    return files.fail(leaf.error, leaf.report)
                if isinstance(leaf, SharderdError):
                    return files.fail(leaf, None)
                raise
            return files.succeed(key, result)

    def _options(self) -> JobOptions:
        config = self.ctx.config
        targets = {*config.custom_targets, *BUILTIN_TARGETS}
        perf = config.search.optimal_perf
        return load_sidecar(
            self.job.sidecar, config.daemon, optimal_perf=perf, known_targets=targets
        )

    def _waiting_for_twin(self) -> None:
        self.progress.stage = "waiting for a job with the same content"
        self.ctx.board.changed()

    async def _shard(self, options: JobOptions) -> JobResult:
        """Run ``shard_job``, again after a worker killed by a signal, up to the crash limit."""
        job, ctx, files = self.job, self.ctx, self.files
        crashes = ctx.config.daemon.worker_crash_limit(options.max_attempts)
        crash_key = ctx.config.daemon.worker_crash_key()
        assert job.model is not None
        config = replace(
            ctx.config,
            plan=options.plan_config(ctx.config.plan),
            plan_given=ctx.config.plan_given | set(options.plan_overrides),
        )
        search = search_options(
            config,
            daemon=True,
            backend=options.backend,
            optimal_perf=options.optimal_perf,
            max_attempts=options.max_attempts,
        )
        spec = JobSpec(
            model=job.model,
            out_dir=files.out,
            stem=safe_name(job.model.name.removesuffix(".onnx")),
            devices=options.devices,
            config=config,
            search=search,
            target=options.target,
            job_id=job.job_id,
            priority=options.priority,
            isolate_planning=True,
            auto_devices=options.auto_devices,
            report_extra={"job": job_facts(job)},
            planning_limits=PlanningLimits(
                ctx.config.daemon.planning_timeout,
                ctx.config.daemon.planning_memory_bytes,
                None if ctx.config.source is None else str(ctx.config.source),
            ),
        )
        files.journal(state="planning")
        while True:
            if files.record.attempts >= crashes:
                raise WorkerCrashedError(
                    f"the planning worker (or sharderd itself) died in each of {files.record.attempts} runs "
                    f"({crash_key} = {crashes})",
                    hint="It was killed by a signal each time, most often the kernel's OOM killer: check "
                    "`journalctl -k` for it, give the host more memory, or raise MemoryMax for the service.",
                )
            files.record = ctx.journal.bump_attempts(job.job_id)
            files.bumped = True
            self._reset_dirs()
            try:
                result = await shard_job(
                    spec, pool=ctx.pool, workdir=self.work, emit=self._emit, env=ctx.env
                )
            except Exception as exc:
                files.bumped = False
                leaf = sole_exception(exc)
                error = leaf.error if isinstance(leaf, JobFailed) else leaf
                signum = error.signal if isinstance(error, WorkerDiedError) else None
                # a cluster node died: a new try, like a signal
                lost = isinstance(error, AttemptLostError)
                if signum is None and not lost:
                    raise
                if files.record.attempts >= crashes:
                    continue  # the check above ends the job
                _log.warning(
                    "job.retried",
                    reason="attempt_lost" if lost else "worker_crashed",
                    signal=signum,
                    message=cast("WorkerDiedError | AttemptLostError", error).message,
                    attempts=files.record.attempts,
                    max_attempts=crashes,
                )
                continue
            files.bumped = False
            return result

    def _reset_dirs(self) -> None:
        """Fresh folders for this run; the work folder is named by the run, so an attempt orphaned
        by a killed daemon can never leave a result where this run looks for one."""
        files = self.files
        shutil.rmtree(files.work_root, ignore_errors=True)
        shutil.rmtree(files.out, ignore_errors=True)
        self.work = files.work_root / f"run-{files.record.attempts}"
        self.work.mkdir(parents=True)
        tmp_dir_for(self.ctx.dirs.outbox, self.job.job_id)

    def _emit(self, event: str, fields: Mapping[str, Any]) -> None:
        p = self.progress
        if event == "backend.selected":
            p.backend = str(fields.get("backend"))
        elif event == "plan.started":
            p.stage = "planning"
        elif event == "attempt.started":
            if self.files.record.state != "compiling":  # the journal's word for attempts running
                self.files.journal(state="compiling")
            p.stage = "compiling" if p.backend == "poprt" else "verifying"
            p.attempts += 1
            p.attempts_running += 1
        elif event == "attempt.finished":
            self.ctx.board.attempt_finished(
                p, str(fields.get("result")), float(fields.get("duration_s") or 0.0)
            )
        self.ctx.board.changed()
        _log.info(event, **fields)
