"""What the daemon is doing now, for ``sharderd status`` (``status.json``) and systemd (``STATUS=``).

The board is the single place job tasks and the intake report progress to; a publisher task turns
it into a file and a status line. ``status.json`` is replaced atomically (temp file + rename in the
same folder), so a reader sees the old or the new content, never a torn one. It is not fsynced:
the runtime directory is a tmpfs, and after a power cut a stale status is worthless anyway.
``heartbeat`` is rewritten at least every ``heartbeat_interval_s`` even when nothing changes, so a
reader can tell a hung or dead daemon (heartbeat older than twice the interval) from an idle one.
It is written 0644 whatever the service's umask: it holds nothing secret, and operators who are not
in the service's group read it with ``sharderd status``. The board also keeps what the metrics
export (``DaemonFigures``) and the outcomes of the last 24 h, seeded from the journal at start-up,
so neither needs read access to ``state_dir``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, final

import anyio

from sharderd.backends.pool import AttemptPool
from sharderd.backends.registry import PROVEN_STATUS
from sharderd.daemon.journal import TERMINAL_STATES
from sharderd.daemon.metrics import AttemptStats, DaemonFigures
from sharderd.filenames import text_values
from sharderd.fsutil import atomic_write
from sharderd.isotime import iso_time

__all__ = [
    "RECENT_S",
    "STATUS_FILE",
    "DaemonState",
    "JobProgress",
    "StatusBoard",
    "recent_outcomes",
]

STATUS_FILE: Final = "status.json"
RECENT_S: Final = 24 * 3600.0
"""Window of the ``last_24h`` outcome counts."""
_RESULTS: Final = tuple(PROVEN_STATUS.values())
_PENDING_LISTED: Final = 100
"""Pending jobs listed by id in ``status.json`` (the count is always exact)."""

DaemonState = Literal["starting", "ready", "stopping", "stopped"]


@dataclass(slots=True)
class JobProgress:
    """One running job as its task reports it (mutable: the job task owns it)."""

    job_id: str
    name: str
    priority: int = 0
    stage: str = "queued"
    """queued, hashing, planning, compiling (PopRT attempts), verifying (onnxruntime attempts:
    nothing is compiled), publishing."""
    backend: str | None = None
    """The backend proving the job, once chosen (``auto`` resolved)."""
    attempts: int = 0
    """Compile attempts started in this run of the job."""
    attempts_running: int = 0
    attempts_finished: int = 0
    """Compile attempts that reached an outcome; the rest of ``attempts`` were killed unfinished."""
    started: float = field(default_factory=time.time)
    cancel_requested: str | None = None
    """Who asked to cancel the job (``sharderd cancel``, ``inbox/<name>.cancel``); None: nobody."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "priority": self.priority,
            "stage": self.stage,
            "backend": self.backend,
            "attempts": self.attempts,
            "attempts_running": self.attempts_running,
            "started": iso_time(self.started),
            "cancelling": self.cancel_requested is not None,
        }


@final
class StatusBoard:
    """Queue counts and running jobs; ``changed()`` wakes whoever publishes them."""

    def __init__(
        self,
        runtime_dir: Path,
        *,
        pool: AttemptPool,
        version: str,
        heartbeat_interval_s: float = 15.0,
    ) -> None:
        self.path = runtime_dir / STATUS_FILE
        self.pool = pool
        self.version = version
        self.heartbeat_interval_s = heartbeat_interval_s
        self.pid = os.getpid()
        self.since = time.time()
        self.state: DaemonState = "starting"
        self.pending = 0
        """Jobs seen in the inbox (settling or waiting for a slot), plus recovered jobs not yet restarted."""
        self.running: dict[str, JobProgress] = {}
        self.finished: Counter[str] = Counter()
        """Terminal states reached since start: succeeded, failed, duplicate, cancelled."""
        self.results: Counter[str] = Counter()
        """Succeeded jobs since start by their report's ``status``: compiled, verified, not_compiled."""
        self.pending_jobs: tuple[tuple[str, str], ...] = ()
        """``(job_id, name)`` of the first pending jobs, in claim order."""
        self.attempts = AttemptStats()
        self.recent: deque[tuple[float, str]] = deque()
        """``(time, outcome)`` of jobs that ended in the last ``RECENT_S``, oldest first."""
        self.last_success: float | None = None
        self._changed = anyio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def wait_changed(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    def set_state(self, state: DaemonState) -> None:
        self.state = state
        self.changed()

    def set_pending(self, count: int, jobs: Iterable[tuple[str, str]] = ()) -> None:
        """``count`` jobs wait; ``jobs`` names them (``(job_id, name)``, claim order first)."""
        listed = tuple(itertools.islice(jobs, _PENDING_LISTED))
        if count != self.pending or listed != self.pending_jobs:
            self.pending = count
            self.pending_jobs = listed
            self.changed()

    def seed_recent(self, journal_dir: Path, now: float | None = None) -> None:
        """Count the outcomes the journal holds from the last 24 h (before this start)."""
        for t, outcome in recent_outcomes(journal_dir, now):
            self.recent.append((t, outcome))
            if outcome == "succeeded":
                self.last_success = max(t, self.last_success or t)

    def record_outcome(self, outcome: str, at: float | None = None) -> None:
        """A job ended with ``outcome`` (a terminal journal state)."""
        t = time.time() if at is None else at
        self.finished[outcome] += 1
        self.recent.append((t, outcome))
        if outcome == "succeeded":
            self.last_success = t
        self.changed()

    def record_result(self, status: str) -> None:
        """A job succeeded with report ``status`` (``backends.registry.PROVEN_STATUS``)."""
        self.results[status] += 1
        self.changed()

    def attempt_finished(self, progress: JobProgress, outcome: str, duration_s: float) -> None:
        progress.attempts_finished += 1
        progress.attempts_running = max(0, progress.attempts_running - 1)
        self.attempts.observe(outcome, duration_s)
        self.changed()

    def add(self, progress: JobProgress) -> None:
        self.running[progress.job_id] = progress
        self.changed()

    def remove(self, job_id: str, outcome: str | None) -> None:
        """The job's task ended; ``outcome`` is its terminal state, None when it was interrupted."""
        progress = self.running.pop(job_id, None)
        if progress is not None:
            self.attempts.cancelled(progress.attempts - progress.attempts_finished)
        if outcome is not None:
            self.record_outcome(outcome)
        self.changed()

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        t = time.time() if now is None else now
        return {
            "pid": self.pid,
            "version": self.version,
            "state": self.state,
            "since": iso_time(self.since),
            "heartbeat": iso_time(t),
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "queue": {
                "pending": self.pending,
                "running": len(self.running),
                "succeeded": self.finished["succeeded"],
                "failed": self.finished["failed"],
                "duplicate": self.finished["duplicate"],
                "cancelled": self.finished["cancelled"],
            },
            "results": {status: self.results[status] for status in _RESULTS},
            "last_24h": self._recent_counts(t),
            "running": [p.to_dict() for p in _by_start(self.running.values())],
            "pending_jobs": [
                {"job_id": job_id, "name": name} for job_id, name in self.pending_jobs
            ],
            "pool": {
                "busy": self.pool.busy,
                "waiting": self.pool.waiting,
                "max_parallel": self.pool.max_parallel,
            },
        }

    def figures(self, now: float | None = None) -> DaemonFigures:
        """What the metrics export, as of ``now``."""
        return DaemonFigures(
            version=self.version,
            up=self.state != "stopped",
            start_time=self.since,
            now=time.time() if now is None else now,
            jobs=dict(self.finished),
            results=dict(self.results),
            attempts=dict(self.attempts.outcomes),
            cumulative_buckets=self.attempts.cumulative(),
            duration_sum_s=self.attempts.seconds,
            duration_count=self.attempts.count,
            pending=self.pending,
            processing=len(self.running),
            pool_busy=self.pool.busy,
            pool_waiting=self.pool.waiting,
            pool_slots=self.pool.max_parallel,
            last_success=self.last_success,
        )

    def _recent_counts(self, now: float) -> dict[str, int]:
        while self.recent and self.recent[0][0] < now - RECENT_S:
            self.recent.popleft()
        counts = Counter(outcome for _, outcome in self.recent)
        return {
            outcome: counts[outcome]
            for outcome in ("succeeded", "failed", "duplicate", "cancelled")
        }

    def status_line(self) -> str:
        """One line for systemd's ``STATUS=``: counts only, so it changes only when they do."""
        compiling = sum(1 for p in self.running.values() if p.stage == "compiling")
        verifying = sum(1 for p in self.running.values() if p.stage == "verifying")
        done = self.finished
        return (
            f"{self.state}: {self.pending} pending, {len(self.running)} running ({compiling} compiling"
            + (f", {verifying} verifying" if verifying else "")
            + "), "
            f"{done['succeeded']} succeeded, {done['failed']} failed, {done['duplicate']} duplicate"
        )

    def write(self, now: float | None = None) -> Path:
        """Replace ``status.json`` atomically (mode 0644); returns its path."""
        text = json.dumps(text_values(self.snapshot(now)), indent=1) + "\n"
        atomic_write(self.path, text, mode=0o644, exact_mode=True, durable=False)
        return self.path


def _by_start(jobs: Iterable[JobProgress]) -> list[JobProgress]:
    return sorted(jobs, key=lambda p: (p.started, p.job_id))


def recent_outcomes(
    journal_dir: Path, now: float | None = None, window_s: float = RECENT_S
) -> list[tuple[float, str]]:
    """``(time, state)`` of the journal's jobs that reached a terminal state within ``window_s``.

    Only records written within the window are read (their mtime says so), so a journal of years
    costs a directory listing. Torn or unreadable records are skipped and nothing is changed; a
    missing folder holds nothing, an unreadable one raises ``PermissionError``.
    """
    t = time.time() if now is None else now
    since = t - window_s
    found = []
    try:
        entries = list(os.scandir(journal_dir))
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(".json"):
            continue
        try:
            if entry.stat().st_mtime < since:
                continue
            record = json.loads(Path(entry.path).read_text(encoding="utf-8"))
            state, updated = record["state"], record["updated"]
            at = dt.datetime.fromisoformat(updated).timestamp()
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if state in TERMINAL_STATES and since <= at <= t:
            found.append((at, str(state)))
    return sorted(found)
