"""How a job ends, durably: published, a duplicate, failed, cancelled, or left for the next start.

The order of durable steps is what makes a restart safe (``journal.recover`` reads it back):
success is *publish → journal "succeeded" → input to done/*; failure is *journal "failed" →
``fail_job``*; a duplicate is *journal "duplicate" → input to done/*. A crash between any two steps
leaves a state recovery finishes (``daemon/recovery.py``) without running the job again.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, final

import anyio
import structlog

from sharderd.backends.pool import AttemptPool
from sharderd.config import Config
from sharderd.daemon.dedup import publish_pointer
from sharderd.daemon.dirs import DaemonDirs
from sharderd.daemon.intake import ClaimedJob
from sharderd.daemon.journal import IndexEntry, JobRecord, JobState, Journal
from sharderd.daemon.outbox import TMP_PREFIX, fail_job, publish, relocated, rename_unique
from sharderd.daemon.status import JobProgress, StatusBoard
from sharderd.errors import JobCancelledError, SharderdError
from sharderd.filenames import raw_bytes, text
from sharderd.fsutil import copy_synced, fsync_dir
from sharderd.job.run import JobResult, write_report
from sharderd.logs import get_logger

__all__ = [
    "REPORTS",
    "WORK_DIR",
    "JobContext",
    "JobFiling",
    "cancel_claimed",
    "fail_claimed",
    "job_facts",
]

WORK_DIR: Final = ".work"
"""Attempt files inside ``processing/<job_id>/``; a dotfile so no job name can collide with it."""
REPORTS: Final = ("report.json", "report.md", "report.html")
"""What a job's folder in ``done/`` or ``failed/`` holds of its result."""

_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class JobContext:
    """What every job of one daemon shares."""

    config: Config
    dirs: DaemonDirs
    journal: Journal
    pool: AttemptPool
    board: StatusBoard
    env: Mapping[str, str]
    """Environment of planning workers and attempts (``childenv.child_env()``)."""
    inflight: dict[str, anyio.Event] = field(default_factory=dict)
    """Content keys being computed now: a second job with the same key waits, then is a duplicate."""


def job_facts(job: ClaimedJob) -> dict[str, Any]:
    """report.json's ``job``: the job id, its name (``safe_name``) and the inbox entry it came
    from, as text and as its exact bytes (hex)."""
    return {"id": job.job_id, "name": job.name, **entry_facts(job)}


def entry_facts(job: ClaimedJob) -> dict[str, str]:
    """The inbox entry's name as text (``%XX`` for bytes that are not UTF-8) and exactly (hex)."""
    entry = job.entry.name if job.entry != job.job_dir else job.name
    return {"entry": text(entry), "entry_hex": raw_bytes(entry).hex()}


def fail_claimed(job: ClaimedJob, ctx: JobContext, error: SharderdError) -> JobState:
    """File ``job`` under ``failed/`` without running it (recovery: attempts used up)."""
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        return JobFiling(job, ctx, JobProgress(job.job_id, job.name)).fail(error, None)


def cancel_claimed(job: ClaimedJob, ctx: JobContext, by: str) -> JobState:
    """File a claimed job that never ran (pending when the request came) as cancelled."""
    with structlog.contextvars.bound_contextvars(job_id=job.job_id):
        return JobFiling(job, ctx, JobProgress(job.job_id, job.name)).cancelled(by)


@final
class JobFiling:
    """The bookkeeping of one job: its journal record, its folders, and how it ends."""

    def __init__(self, job: ClaimedJob, ctx: JobContext, progress: JobProgress) -> None:
        self.job = job
        self.ctx = ctx
        self.progress = progress
        self.work_root = job.job_dir / WORK_DIR
        self.out = ctx.dirs.outbox / f"{TMP_PREFIX}{job.job_id}"
        self.started = time.monotonic()
        self.record = ctx.journal.get(job.job_id) or JobRecord(job.job_id, job.name)
        self.bumped = False
        """This run's count is in the journal: a shutdown gives it back."""

    def journal(self, **changes: Any) -> None:
        """Record ``changes`` to the job's journal entry (durable before this returns)."""
        self.record = self.ctx.journal.record(replace(self.record, **changes))

    def succeed(self, key: str, result: JobResult) -> JobState:
        self.progress.stage = "publishing"
        self.progress.attempts_running = 0
        shutil.rmtree(self.work_root, ignore_errors=True)
        published = publish(self.out, self.ctx.dirs.outbox, self.job.name, **self._modes())
        # the index first: a terminal record is never ahead of it, whenever the daemon stops
        self.ctx.journal.remember(key, published, self.job.job_id)
        self.record = self.ctx.journal.record(
            replace(self.record, state="succeeded", result=str(published))
        )
        self.ctx.board.record_result(result.status)
        _log.info(
            "job.succeeded",
            name=self.job.name,
            result=str(published),
            status=result.status,
            compiles=len(result.report.get("attempts", [])),
            duration_s=self._duration(),
        )
        self.retire_input(published)
        return "succeeded"

    def duplicate(self, original: IndexEntry) -> JobState:
        """Journal it, then give the submitter ``outbox/<name>/`` saying whose result it is, then retire."""
        self.record = self.ctx.journal.record(
            replace(self.record, state="duplicate", result=original.result)
        )
        pointer = self.publish_pointer(original.job_id, Path(original.result))
        _log.info(
            "job.duplicate",
            name=self.job.name,
            original_job_id=original.job_id,
            result=original.result,
            outbox=str(pointer),
        )
        self.retire_input(pointer, duplicate=True)
        return "duplicate"

    def publish_pointer(self, original_job_id: str, original: Path) -> Path:
        """``outbox/<name>/`` of a duplicate: its reports and ``duplicate.json`` point at ``original``."""
        key, outbox = self.record.sha256 or "", self.ctx.dirs.outbox
        return publish_pointer(outbox, self.job, key, original_job_id, original, **self._modes())

    def _modes(self) -> dict[str, int]:
        daemon = self.ctx.config.daemon
        return {"file_mode": daemon.file_mode, "dir_mode": daemon.dir_mode}

    def fail(
        self,
        error: SharderdError | Mapping[str, Any],
        report: Mapping[str, Any] | None,
        *,
        exc_info: BaseException | None = None,
    ) -> JobState:
        """Journal the failure, then move the job to ``failed/<name>`` with ``error.json``/``error.md``."""
        info = dict(error.to_dict() if isinstance(error, SharderdError) else error)
        failed = self._file_failure(info, report, "failed")
        _log.error(
            "job.failed",
            name=self.job.name,
            reason=info.get("reason"),
            message=relocated(info.get("message"), self.job.job_dir, failed),
            failed=str(failed),
            duration_s=self._duration(),
            exc_info=exc_info,
        )
        return "failed"

    def cancelled(self, by: str) -> JobState:
        """Cancelled on request (its attempts are dead by now): file it under ``failed/``."""
        error = JobCancelledError(
            f"cancelled on request ({by})",
            hint="Nothing is wrong with the input; the retry command below runs it again.",
        )
        failed = self._file_failure(error.to_dict(), None, "cancelled")
        self.ctx.pool.forget(self.job.job_id)
        _log.warning(
            "job.cancelled",
            name=self.job.name,
            reason="requested",
            by=by,
            failed=str(failed),
            duration_s=self._duration(),
        )
        return "cancelled"

    def _file_failure(
        self, info: dict[str, Any], report: Mapping[str, Any] | None, state: JobState
    ) -> Path:
        """Journal ``state``, then move the job to ``failed/<name>`` with ``error.json``/``error.md``."""
        # first: a partial result may be what filled the disk
        shutil.rmtree(self.work_root, ignore_errors=True)
        shutil.rmtree(self.out, ignore_errors=True)
        info = {**entry_facts(self.job), **info}
        self.record = self.ctx.journal.record(replace(self.record, state=state, error=info))
        daemon = self.ctx.config.daemon
        if report is not None:
            write_report(report, self.job.job_dir)
            for name in REPORTS:
                (self.job.job_dir / name).chmod(daemon.file_mode)
        job, source = self.job, self.ctx.config.source
        failed = fail_job(
            job.job_dir,
            self.ctx.dirs.failed,
            job.name,
            info,
            model=job.model,
            config_path=source,
            **self._modes(),
        )
        self.record = self.ctx.journal.record(replace(self.record, result=str(failed)))
        return failed

    def retire_input(self, result: Path | None = None, *, duplicate: bool = False) -> None:
        """The input leaves ``processing/``: to ``done/<name>`` (``keep_input``), beside a copy of
        the result's reports, or deleted. A duplicate's input is deleted either way: its bytes are
        the original's, kept in the original's ``done/`` folder; its ``done/<name>`` holds the
        reports that say so. The copies are written with ``file_mode`` and fsynced, and so is the
        folder, before it moves: no cut leaves an empty report in ``done/``."""
        job = self.job
        shutil.rmtree(self.work_root, ignore_errors=True)
        if duplicate and job.entry != job.job_dir:
            _remove(job.entry)
        if self.ctx.config.daemon.keep_input:
            mode = self.ctx.config.daemon.file_mode
            for report in () if result is None else (result / name for name in REPORTS):
                with contextlib.suppress(FileNotFoundError):  # an older result may lack report.html
                    copy_synced(report, job.job_dir / report.name, mode=mode)
            fsync_dir(job.job_dir)
            rename_unique(job.job_dir, self.ctx.dirs.done, job.name)
        else:
            shutil.rmtree(job.job_dir)
        self.ctx.pool.forget(job.job_id)

    def interrupted(self) -> None:
        """Cancelled by shutdown: drop the partial result, give back this run's count, keep the job."""
        shutil.rmtree(self.out, ignore_errors=True)
        if self.bumped:
            self.record = self.ctx.journal.record(
                replace(self.record, state="claimed", attempts=max(0, self.record.attempts - 1))
            )
        self.ctx.pool.forget(self.job.job_id)
        _log.info(
            "job.cancelled",
            name=self.job.name,
            reason="shutdown",
            message="stays in processing/ and runs again at the next start",
        )

    def _duration(self) -> float:
        return round(time.monotonic() - self.started, 3)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
