"""What a daemon does at start for the jobs an earlier run left in ``processing/``.

``journal.recover`` reads the journal and the folders back; here each job gets its due: a decided
outcome is finished, a job whose worker kept dying is failed once it reached
``max_worker_crashes`` (unset: ``max_attempts``), a journal entry without a folder is marked lost,
and the rest are resumed, highest priority first. A job none of that works for (its record
unreadable, its files not what a claim leaves) is filed ``unrecoverable``: recovery never stops the
start.
Attempts a killed daemon left running are killed first, so none writes into a folder reused now.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog

from sharderd.daemon.filing import REPORTS, WORK_DIR, JobContext, JobFiling, fail_claimed
from sharderd.daemon.intake import ClaimedJob, inspect_entry, is_staging_name
from sharderd.daemon.journal import JobRecord, JobState, Journal, RecoveredJob, recover
from sharderd.daemon.outbox import JOB_MARKER, fail_job
from sharderd.daemon.procs import kill_strays
from sharderd.daemon.queue import Waiting
from sharderd.daemon.status import JobProgress, StatusBoard
from sharderd.errors import WorkerCrashedError
from sharderd.logs import get_logger

__all__ = ["finish_recovered", "mark_lost", "quarantine", "reclaim", "recover_jobs"]

_log = get_logger(__name__)


def recover_jobs(ctx: JobContext) -> list[Waiting]:
    """Finish, fail or mark lost what an earlier run decided; return the jobs to resume, in order.

    No job stops the start: one whose recovery raises (a damaged record, a name or file nobody
    foresaw) is filed under ``failed/`` with reason ``unrecoverable`` (``quarantine``)."""
    dirs, board = ctx.dirs, ctx.board
    strays = kill_strays(dirs.processing)
    report = recover(
        dirs.state_dir,
        dirs.outbox,
        max_attempts=ctx.config.daemon.worker_crash_limit(ctx.config.daemon.max_attempts),
        journal=ctx.journal,
    )
    for found in report.finish:
        _count(board, _guarded(found, ctx, lambda f: finish_recovered(f, ctx)))
    for found in report.to_fail:
        _count(
            board, _guarded(found, ctx, lambda f: fail_claimed(reclaim(f), ctx, _crashed(f, ctx)))
        )
    for found in report.unreadable:
        _count(board, quarantine(found, ctx, found.problem or "its journal record is unreadable"))
    _settle_records(report.unindexed, report.stale, ctx.journal)
    resumed = []
    for found in report.resume:
        try:
            job = reclaim(found)
        except Exception as exc:  # an entry nobody foresaw: file it, start anyway
            _count(board, quarantine(found, ctx, f"{type(exc).__name__}: {exc}", exc))
        else:
            resumed.append(Waiting(job, found.record.priority if found.record else 0))
    _log.info(
        "journal.recovered",
        resume=len(resumed),
        finished=len(report.finish),
        failed=len(report.to_fail),
        unrecoverable=len(report.unreadable),
        lost=len(report.stale),
        reindexed=len(report.unindexed),
        removed=[str(p) for p in report.removed],
        killed_strays=strays,
    )
    for error in report.errors:
        _log.warning(
            "daemon.error", error=error, message="found at start-up; the daemon starts anyway"
        )
    return sorted(resumed, key=lambda w: (-w.priority, w.job.job_id))


def quarantine(
    found: RecoveredJob, ctx: JobContext, why: str, exc: BaseException | None = None
) -> JobState | None:
    """File a job recovery cannot finish under ``failed/<name>`` (reason ``unrecoverable``) without
    reading its journal record: an unreadable record is set aside, a fresh one says ``failed``. If
    even that fails, the job stays in ``processing/`` for the next start; None then."""
    error = {
        "reason": "unrecoverable",
        "message": f"sharderd could not recover this job at start-up: {why}",
        "hint": "The input is kept as it was claimed. Check it, then run the retry command below "
        "(a model that was published already is in the outbox).",
        "exit_code": 1,
    }
    with structlog.contextvars.bound_contextvars(job_id=found.job_id):
        daemon = ctx.config.daemon
        try:
            if found.record is None:
                ctx.journal.set_aside(found.job_id)
            failed = fail_job(
                found.job_dir,
                ctx.dirs.failed,
                found.name,
                error,
                config_path=ctx.config.source,
                file_mode=daemon.file_mode,
                dir_mode=daemon.dir_mode,
            )
        except Exception:
            _log.exception(
                "daemon.error",
                name=found.name,
                error=why,
                message="cannot file the job; it stays in processing/ until the next start",
            )
            return None
        _log.error(
            "job.failed",
            name=found.name,
            reason="unrecoverable",
            message=error["message"],
            failed=str(failed),
            exc_info=exc,
        )
        attempts = found.record.attempts if found.record else 0
        record = JobRecord(
            found.job_id, found.name, "failed", attempts, error=error, result=str(failed)
        )
        try:
            ctx.journal.record(record)
        except OSError as err:  # the folder is filed; the journal only keeps the history
            _log.warning("daemon.error", error=str(err), message="cannot journal the filed job")
        return "failed"


def _settle_records(
    unindexed: tuple[JobRecord, ...], stale: tuple[JobRecord, ...], journal: Journal
) -> None:
    """Index again the ``succeeded`` jobs the index lacks; mark the records of vanished jobs lost."""
    for record in unindexed:  # a daemon before this one journaled the success before indexing it
        with contextlib.suppress(OSError, ValueError):
            if record.sha256 and record.result and Path(record.result).is_dir():
                journal.remember(record.sha256, Path(record.result), record.job_id)
    for record in stale:
        try:
            mark_lost(record, journal)
        except (OSError, ValueError) as exc:
            _log.error(
                "daemon.error",
                job_id=record.job_id,
                error=str(exc),
                message="cannot mark the job lost",
            )


def _crashed(found: RecoveredJob, ctx: JobContext) -> WorkerCrashedError:
    attempts = found.record.attempts if found.record else 0
    return WorkerCrashedError(
        f"sharderd stopped unexpectedly during each of the {attempts} runs of this job "
        f"({ctx.config.daemon.worker_crash_key()} reached)",
        hint="The planning worker or a compile may be exhausting the host's memory, which kills the whole "
        "service; check `journalctl -k` for the OOM killer and `journalctl -u sharderd` for this job id.",
    )


def _guarded(
    found: RecoveredJob, ctx: JobContext, finish: Callable[[RecoveredJob], JobState]
) -> JobState | None:
    """``finish(found)``; should it raise, ``quarantine`` the job instead."""
    try:
        return finish(found)
    except Exception as exc:
        return quarantine(found, ctx, f"{type(exc).__name__}: {exc}", exc)


def _count(board: StatusBoard, outcome: JobState | None) -> None:
    if outcome is not None:
        board.finished[outcome] += 1


def reclaim(found: RecoveredJob) -> ClaimedJob:
    """Rebuild the ``ClaimedJob`` of a folder left in ``processing/`` by an earlier run."""
    job_dir = found.job_dir
    # An interrupted attempt's hard links to the job's data would look like links made by a dropper.
    shutil.rmtree(job_dir / WORK_DIR, ignore_errors=True)
    entries = [p.name for p in sorted(job_dir.iterdir()) if not _is_bookkeeping(p.name)]
    candidates = [c for c in (inspect_entry(job_dir, e) for e in entries) if c is not None]
    if len(candidates) == 1:
        c = candidates[0]
        return ClaimedJob(
            found.job_id, c.name, c.kind, job_dir, c.path, c.model, c.sidecar, c.problem
        )
    problem = (
        f"processing/{found.job_id} holds no model any more"
        if not candidates
        else f"processing/{found.job_id} holds {len(candidates)} inputs ({', '.join(c.path.name for c in candidates)})"
    )
    return ClaimedJob(found.job_id, found.name, "dir", job_dir, job_dir, None, None, problem)


def finish_recovered(found: RecoveredJob, ctx: JobContext) -> JobState:
    """Complete the bookkeeping of a job whose outcome was decided before the daemon stopped."""
    with structlog.contextvars.bound_contextvars(job_id=found.job_id):
        record = found.record or JobRecord(found.job_id, found.name, state="claimed")
        run = JobFiling(reclaim(found), ctx, JobProgress(found.job_id, found.name))
        if found.result is not None and not record.terminal:
            if record.sha256:  # the index first, as ``JobFiling.succeed`` does
                ctx.journal.remember(record.sha256, found.result, found.job_id)
            ctx.journal.record(replace(record, state="succeeded", result=str(found.result)))
            _log.info("job.succeeded", name=found.name, result=str(found.result), recovered=True)
            run.retire_input(found.result)
            return "succeeded"
        if record.state == "duplicate":
            original = Path(record.result) if record.result else None
            pointer = None if original is None else run.publish_pointer(_marker(original), original)
            run.retire_input(pointer, duplicate=True)
            return record.state
        if record.state == "succeeded":
            result = Path(record.result) if record.result else None
            if record.sha256 and result is not None and result.is_dir():
                ctx.journal.remember(record.sha256, result, found.job_id)  # no-op when indexed
            run.retire_input(result)
            return record.state
        error = dict(
            record.error
            or {"reason": "error", "message": "the job failed before sharderd restarted"}
        )
        return run.fail(error, None)


def mark_lost(record: JobRecord, journal: Journal) -> None:
    """A journal entry whose ``processing/`` folder is gone: nothing can run it, so it failed."""
    error = {
        "reason": "lost",
        "message": f"processing/{record.job_id} vanished while the job was {record.state}",
        "hint": None,
        "exit_code": 1,
    }
    journal.record(replace(record, state="failed", error=error))
    _log.warning(
        "job.failed",
        job_id=record.job_id,
        name=record.name,
        reason="lost",
        message=error["message"],
    )


def _marker(result: Path) -> str:
    """The job id a published result was made by (its ``.sharderd-job``), or ``unknown``."""
    try:
        return (result / JOB_MARKER).read_text(encoding="utf-8").strip() or "unknown"
    except OSError:
        return "unknown"


def _is_bookkeeping(entry: str) -> bool:
    return (
        is_staging_name(entry)
        or entry.endswith(".toml")
        or entry in {*REPORTS, "error.json", "error.md"}
    )
