"""What a daemon does at start for the jobs an earlier run left in ``processing/``.

``journal.recover`` reads the journal and the folders back; here each job gets its due: a decided
outcome is finished, a job whose worker kept dying is failed once it reached ``max_attempts``, a
journal entry without a folder is marked lost, and the rest are resumed, highest priority first.
Attempts a killed daemon left running are killed first, so none writes into a folder reused now.
"""

from __future__ import annotations

from sharderd.daemon.jobs import (
    JobContext,
    WorkerCrashedError,
    fail_claimed,
    finish_recovered,
    mark_lost,
    reclaim,
)
from sharderd.daemon.journal import recover
from sharderd.daemon.procs import kill_strays
from sharderd.daemon.queue import Waiting
from sharderd.logs import get_logger

__all__ = ["recover_jobs"]

_log = get_logger(__name__)


def recover_jobs(ctx: JobContext) -> list[Waiting]:
    """Finish, fail or mark lost what an earlier run decided; return the jobs to resume, in order."""
    dirs, board = ctx.dirs, ctx.board
    strays = kill_strays(dirs.processing)
    report = recover(
        dirs.state_dir,
        dirs.outbox,
        max_attempts=ctx.config.daemon.max_attempts,
        journal=ctx.journal,
    )
    for found in report.finish:
        board.finished[finish_recovered(found, ctx)] += 1
    for found in report.to_fail:
        attempts = found.record.attempts if found.record else 0
        error = WorkerCrashedError(
            f"sharderd stopped unexpectedly during each of the {attempts} runs of this job (max_attempts reached)",
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
