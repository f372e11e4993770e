"""Jobs waiting to start: inbox entries from detection to claim, and claimed jobs not running yet.

An inbox entry is *seen* from its first look until it is claimed: it settles (``Settler``), then
is ready, and the ready entry with the highest sidecar ``priority`` (then the oldest) is claimed
first. Claimed jobs wait in the *backlog* (resumed after a restart, or retried after a storage
fault) and start before new claims. A job whose own bookkeeping could not be written (disk full)
is *stuck*: at each rescan it gets what a restart would give it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import final

from sharderd.config import Config
from sharderd.daemon.intake import (
    Candidate,
    ClaimedJob,
    Settler,
    claim,
    inspect_entry,
    new_job_id,
    scan_inbox,
)
from sharderd.daemon.journal import JobRecord, Journal, RecoveredJob
from sharderd.daemon.outbox import find_published
from sharderd.daemon.sidecar import load_sidecar
from sharderd.logs import get_logger

__all__ = ["Inbox", "JobQueue", "Seen", "Waiting"]

_log = get_logger(__name__)

Match = Callable[[str, str], bool]
"""``match(job_id, name)``: whether a request (a cancel) names the job."""


@dataclass(slots=True)
class Seen:
    """An inbox entry from its first look until it is claimed."""

    job_id: str
    candidate: Candidate
    order: int
    ready: bool = False
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Waiting:
    """A claimed job that is not running."""

    job: ClaimedJob
    priority: int


@final
class Inbox:
    """Candidates from detection to claim: settling (``Settler``), then ready in priority order."""

    def __init__(self, inbox: Path, config: Config) -> None:
        self.inbox = inbox
        self.config = config
        self.settler = Settler(config.daemon.settle_seconds)
        self.seen: dict[Path, Seen] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self.seen)

    def scan(self, renamed: frozenset[Path] = frozenset()) -> None:
        """Look at every entry; forget the ones that are gone."""
        candidates = scan_inbox(self.inbox)
        present = {c.path for c in candidates}
        for path in [p for p in self.seen if p not in present]:
            self._vanished(path)
        for candidate in candidates:
            self._observe(candidate, renamed=candidate.path in renamed)

    def look(self, paths: Iterable[Path], renamed: frozenset[Path]) -> None:
        for path in paths:
            candidate = inspect_entry(self.inbox, path.name)
            if candidate is None:
                self._vanished(path)
            else:
                self._observe(candidate, renamed=path in renamed)

    def settling(self) -> list[Path]:
        return [p for p, s in self.seen.items() if not s.ready]

    def due(self) -> float | None:
        """``time.monotonic()`` value at which a settling entry may be complete."""
        return self.settler.next_due()

    def listing(self) -> Iterator[tuple[str, str]]:
        """``(job_id, name)`` of every entry, in detection order."""
        return ((s.job_id, s.candidate.name) for s in self.seen.values())

    def take(self, match: Match) -> list[Seen]:
        """Remove and return the entries ``match(job_id, name)`` selects, settled or not."""
        taken = [s for s in self.seen.values() if match(s.job_id, s.candidate.name)]
        for seen in taken:
            self.settler.forget(seen.candidate.path)
            del self.seen[seen.candidate.path]
        return taken

    def take_ready(self) -> Seen | None:
        """The ready entry to claim next, checked once more; None when none is ready."""
        while True:
            ready = [s for s in self.seen.values() if s.ready]
            if not ready:
                return None
            best = min(ready, key=lambda s: (-s.priority, s.order))
            path = best.candidate.path
            again = inspect_entry(self.inbox, path.name)
            if again is None:
                self._vanished(path)
            elif again.signature != best.candidate.signature:
                self._observe(again, renamed=False)  # written to again: settle anew
            else:
                del self.seen[path]
                return best

    def _observe(self, candidate: Candidate, *, renamed: bool) -> None:
        seen = self.seen.get(candidate.path)
        if seen is None:
            seen = self.seen[candidate.path] = Seen(new_job_id(), candidate, self._order)
            self._order += 1
            _log.info(
                "job.detected",
                job_id=seen.job_id,
                name=candidate.name,
                path=str(candidate.path),
                kind=candidate.kind,
                moved_in=renamed,
            )
        elif seen.ready and seen.candidate.signature == candidate.signature:
            return
        seen.candidate = candidate
        seen.ready = self.settler.observe(candidate, renamed=renamed)
        if seen.ready:
            self.settler.forget(candidate.path)
            seen.priority = self._priority(candidate)

    def _priority(self, candidate: Candidate) -> int:
        """The sidecar's priority; a bad sidecar counts as 0 here and fails the job once claimed."""
        if candidate.sidecar is None or candidate.problem is not None:
            return 0
        try:
            return load_sidecar(candidate.sidecar, self.config.daemon).priority
        except Exception:
            # even a parser bug (RecursionError on deep nesting) must not stop the intake
            return 0

    def _vanished(self, path: Path) -> None:
        self.settler.forget(path)
        seen = self.seen.pop(path, None)
        if seen is not None:
            _log.debug(
                "job.skipped",
                job_id=seen.job_id,
                name=seen.candidate.name,
                reason="vanished before it was claimed",
            )


@final
class JobQueue:
    """Everything waiting to start: the inbox's entries, the backlog and the stuck jobs."""

    def __init__(self, config: Config, *, processing: Path, journal: Journal) -> None:
        self.inbox = Inbox(config.daemon.inbox, config)
        self.processing = processing
        self.journal = journal
        self.dir_mode = config.daemon.dir_mode
        self.backlog: list[Waiting] = []
        """Claimed jobs to start before any new claim (resumed after a restart), in order."""
        self.stuck: list[Waiting] = []
        """Jobs whose bookkeeping failed (disk full?); retried at the next rescan."""

    def next_ready(self) -> Waiting | None:
        """The job to start next: the backlog's first, else the best ready inbox entry, claimed."""
        if self.backlog:
            waiting = self.backlog.pop(0)
            job = waiting.job
            _log.info("job.resumed", job_id=job.job_id, name=job.name, priority=waiting.priority)
            return waiting
        while (seen := self.inbox.take_ready()) is not None:
            if (claimed := self.claim(seen)) is not None:
                return claimed
        return None

    def claim(self, seen: Seen) -> Waiting | None:
        """Move ``seen`` into ``processing/`` and journal it; None when it is gone or taken."""
        candidate = seen.candidate
        try:
            job = claim(candidate, self.processing, seen.job_id, dir_mode=self.dir_mode)
        except OSError as exc:
            _log.error(
                "job.skipped",
                job_id=seen.job_id,
                name=candidate.name,
                reason=f"cannot claim: {exc}",
            )
            return None
        if job is None:
            _log.debug(
                "job.skipped",
                job_id=seen.job_id,
                name=candidate.name,
                reason="taken before the claim",
            )
            return None
        try:
            self.journal.record(
                JobRecord(job.job_id, job.name, state="claimed", priority=seen.priority)
            )
        except OSError as exc:
            # disk full: the job task tries to record it again, else it waits as stuck
            _log.error(
                "daemon.error",
                job_id=job.job_id,
                name=job.name,
                error=str(exc),
                message="could not journal the claim",
            )
        _log.info(
            "job.claimed",
            job_id=job.job_id,
            name=job.name,
            kind=job.kind,
            priority=seen.priority,
            path=str(job.entry),
        )
        return Waiting(job, seen.priority)

    def pending(self) -> tuple[int, Iterator[tuple[str, str]]]:
        """How many jobs wait, and ``(job_id, name)`` of each: the backlog first, then the inbox."""
        backlog = ((w.job.job_id, w.job.name) for w in self.backlog)
        return len(self.inbox) + len(self.backlog), itertools.chain(backlog, self.inbox.listing())

    def take_backlog(self, match: Match) -> list[Waiting]:
        """Remove and return the backlog jobs ``match(job_id, name)`` selects."""
        kept: list[Waiting] = []
        taken: list[Waiting] = []
        for waiting in self.backlog:
            (taken if match(waiting.job.job_id, waiting.job.name) else kept).append(waiting)
        self.backlog = kept
        return taken

    def park(self, job: ClaimedJob, priority: int, what: str) -> None:
        """Filing ``job`` failed (called in the ``except``; logs its traceback): it stays in
        ``processing/`` until ``retry_stuck``. ``what`` says what could not be done."""
        self.stuck.append(Waiting(job, priority))
        message = f"{what}; it stays in processing/ and is tried again at the next rescan"
        _log.exception("daemon.error", job_id=job.job_id, name=job.name, message=message)

    def retry_stuck(self, outbox: Path, finish: Callable[[RecoveredJob], None]) -> None:
        """Give each stuck job what a restart would: ``finish`` a decided outcome, else queue it again."""
        stuck, self.stuck = self.stuck, []
        for waiting in stuck:
            job = waiting.job
            try:
                record = self.journal.get(job.job_id)
                published = (
                    None
                    if record and record.terminal
                    else find_published(outbox, job.name, job.job_id)
                )
                if published is None and (record is None or not record.terminal):
                    self.backlog.append(waiting)
                    continue
                finish(RecoveredJob(job.job_id, job.name, job.job_dir, record, published))
            except (OSError, ValueError) as exc:
                self.stuck.append(waiting)
                _log.error(
                    "daemon.error",
                    job_id=job.job_id,
                    name=job.name,
                    error=str(exc),
                    message="still cannot finish the job's bookkeeping; it stays in processing/",
                )
