"""What a daemon does at start for the jobs an earlier run left in ``processing/``.

``journal.recover`` reads the journal and the folders back; here each job gets its due: a decided
outcome is finished, a job whose worker kept dying is failed once it reached
``max_worker_crashes`` (unset: ``max_attempts``), a journal entry without a folder is marked lost,
and the rest are resumed, highest priority first.
Attempts a killed daemon left running are killed first, so none writes into a folder reused now.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import structlog

from sharderd.daemon.filing import REPORTS, WORK_DIR, JobContext, JobFiling, fail_claimed
from sharderd.daemon.intake import ClaimedJob, inspect_entry, is_staging_name
from sharderd.daemon.journal import JobRecord, JobState, Journal, RecoveredJob, recover
from sharderd.daemon.outbox import JOB_MARKER
from sharderd.daemon.procs import kill_strays
from sharderd.daemon.queue import Waiting
from sharderd.daemon.status import JobProgress
from sharderd.errors import WorkerCrashedError
from sharderd.logs import get_logger

__all__ = ["finish_recovered", "mark_lost", "reclaim", "recover_jobs"]

_log = get_logger(__name__)


def recover_jobs(ctx: JobContext) -> list[Waiting]:
    """Finish, fail or mark lost what an earlier run decided; return the jobs to resume, in order."""
    dirs, board = ctx.dirs, ctx.board
    strays = kill_strays(dirs.processing)
    report = recover(
        dirs.state_dir,
        dirs.outbox,
        max_attempts=ctx.config.daemon.worker_crash_limit(ctx.config.daemon.max_attempts),
        journal=ctx.journal,
    )
    for found in report.finish:
        board.finished[finish_recovered(found, ctx)] += 1
    for found in report.to_fail:
        attempts = found.record.attempts if found.record else 0
        error = WorkerCrashedError(
            f"sharderd stopped unexpectedly during each of the {attempts} runs of this job "
            f"({ctx.config.daemon.worker_crash_key()} reached)",
            hint="The planning worker or a compile may be exhausting the host's memory, which kills the whole "
            "service; check `journalctl -k` for the OOM killer and `journalctl -u sharderd` for this job id.",
        )
        board.finished[fail_claimed(reclaim(found), ctx, error)] += 1
    for record in report.stale:
        mark_lost(record, ctx.journal)
    resumed = [Waiting(reclaim(f), f.record.priority if f.record else 0) for f in report.resume]
    _log.info(
        "journal.recovered",
        resume=len(report.resume),
        finished=len(report.finish),
        failed=len(report.to_fail),
        lost=len(report.stale),
        removed=[str(p) for p in report.removed],
        killed_strays=strays,
    )
    return sorted(resumed, key=lambda w: (-w.priority, w.job.job_id))


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
            ctx.journal.record(replace(record, state="succeeded", result=str(found.result)))
            if record.sha256:
                ctx.journal.remember(record.sha256, found.result, found.job_id)
            _log.info("job.succeeded", name=found.name, result=str(found.result), recovered=True)
            run.retire_input(found.result)
            return "succeeded"
        if record.state == "duplicate" and record.result:
            run.retire_input(run.publish_pointer(_marker(Path(record.result)), Path(record.result)))
            return record.state
        if record.state in ("succeeded", "duplicate"):
            run.retire_input(Path(record.result) if record.result else None)
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
