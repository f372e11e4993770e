"""What the daemon is doing now, for ``sharderd status`` (``status.json``) and systemd (``STATUS=``).

The board is the single place job tasks and the intake report progress to; a publisher task turns
it into a file and a status line. ``status.json`` is replaced atomically (temp file + rename in the
same folder), so a reader sees the old or the new content, never a torn one. It is not fsynced:
the runtime directory is a tmpfs, and after a power cut a stale status is worthless anyway.
``heartbeat`` is rewritten at least every ``heartbeat_interval_s`` even when nothing changes, so a
reader can tell a hung or dead daemon (heartbeat older than twice the interval) from an idle one.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, final

import anyio

from sharderd.backends.pool import AttemptPool

__all__ = ["STATUS_FILE", "DaemonState", "JobProgress", "StatusBoard", "iso_time"]

STATUS_FILE: Final = "status.json"

DaemonState = Literal["starting", "ready", "stopping", "stopped"]


def iso_time(t: float) -> str:
    """UTC ISO 8601 with milliseconds, as the log's ``ts``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


@dataclass(slots=True)
class JobProgress:
    """One running job as its task reports it (mutable: the job task owns it)."""

    job_id: str
    name: str
    priority: int = 0
    stage: str = "queued"
    """queued, hashing, planning, compiling, publishing."""
    attempts: int = 0
    """Compile attempts started in this run of the job."""
    attempts_running: int = 0
    started: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "priority": self.priority,
            "stage": self.stage,
            "attempts": self.attempts,
            "attempts_running": self.attempts_running,
            "started": iso_time(self.started),
        }


@final
class StatusBoard:
    """Queue counts and running jobs; ``changed()`` wakes whoever publishes them."""

    def __init__(self, runtime_dir: Path, *, pool: AttemptPool, version: str,
                 heartbeat_interval_s: float = 15.0) -> None:
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
        """Terminal states reached since start: succeeded, failed, duplicate."""
        self._changed = anyio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def wait_changed(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    def set_state(self, state: DaemonState) -> None:
        self.state = state
        self.changed()

    def set_pending(self, count: int) -> None:
        if count != self.pending:
            self.pending = count
            self.changed()

    def add(self, progress: JobProgress) -> None:
        self.running[progress.job_id] = progress
        self.changed()

    def remove(self, job_id: str, outcome: str | None) -> None:
        """The job's task ended; ``outcome`` is its terminal state, None when it was interrupted."""
        self.running.pop(job_id, None)
        if outcome is not None:
            self.finished[outcome] += 1
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
            },
            "running": [p.to_dict() for p in _by_start(self.running.values())],
            "pool": {"busy": self.pool.busy, "waiting": self.pool.waiting, "max_parallel": self.pool.max_parallel},
        }

    def status_line(self) -> str:
        """One line for systemd's ``STATUS=``: counts only, so it changes only when they do."""
        compiling = sum(1 for p in self.running.values() if p.stage == "compiling")
        done = self.finished
        return (f"{self.state}: {self.pending} pending, {len(self.running)} running ({compiling} compiling), "
                f"{done['succeeded']} succeeded, {done['failed']} failed, {done['duplicate']} duplicate")

    def write(self, now: float | None = None) -> Path:
        """Replace ``status.json`` atomically; returns its path."""
        text = json.dumps(self.snapshot(now), indent=1) + "\n"
        tmp = self.path.with_name(f".{STATUS_FILE}.{self.pid}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.path)
        return self.path


def _by_start(jobs: Iterable[JobProgress]) -> list[JobProgress]:
    return sorted(jobs, key=lambda p: (p.started, p.job_id))
