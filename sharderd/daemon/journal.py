"""Crash-safe job state: one JSON file per job, plus a content index for duplicates.

Every write is temp file → fsync → rename → fsync of the folder, so after a crash or ``kill -9`` each
``journal/<job_id>.json`` holds either the previous or the new record, never a torn one; leftover temp
files are ignored and swept by ``load_all``. ``attempts`` is bumped *before* a worker starts, so a
worker that takes the whole daemon down still counts, and a job that keeps crashing stops at
``max_attempts`` across restarts.

The index ``index/<sha256>.json`` maps a content key (model + effective options) to the first result.
It is created with ``link()``, which never replaces, so of two jobs racing with the same content
exactly one becomes the original. An entry whose result folder has been deleted no longer counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final, Literal, final, get_args

from sharderd.daemon.outbox import TMP_PREFIX, find_published
from sharderd.filenames import safe_name, text_values
from sharderd.fsutil import atomic_write, fsync_dir, write_temp
from sharderd.isotime import iso_time

__all__ = [
    "TERMINAL_STATES",
    "IndexEntry",
    "JobRecord",
    "JobState",
    "Journal",
    "RecoveredJob",
    "RecoveryReport",
    "recover",
]

JobState = Literal[
    "detected", "claimed", "planning", "compiling", "succeeded", "failed", "duplicate", "cancelled"
]
TERMINAL_STATES: Final[frozenset[str]] = frozenset(
    {"succeeded", "failed", "duplicate", "cancelled"}
)
_STATES: Final = frozenset(get_args(JobState))
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_JOB_ID: Final = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.-]*")
_MODE: Final = 0o640
"""Journal and index files, less the umask: the journal names every job and where it went."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the journal knows about one job."""

    job_id: str
    name: str
    state: JobState = "detected"
    attempts: int = 0
    """Worker starts so far (plan worker and compiles), counted before each start."""
    max_attempts: int | None = None
    """The job's own limit (sidecar); None: the daemon's."""
    sha256: str | None = None
    result: str | None = None
    """The outbox folder; for a duplicate the original's; for a failure the ``failed/`` folder."""
    error: Mapping[str, Any] | None = None
    """``SharderdError.to_dict()`` (or the crash details) of a failed job."""
    priority: int = 0
    created: str = ""
    """UTC ISO time of the first ``record``; set by the journal."""
    updated: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """The record ``asdict`` wrote; ``ValueError`` (or ``TypeError``) for anything else, so a
        damaged record is refused here, not by whatever reads a field later."""
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        if (
            record.state not in _STATES
            or not all(isinstance(v, str) for v in (record.job_id, record.name))
            or not all(_is_int(v) for v in (record.attempts, record.priority))
            or not (record.max_attempts is None or _is_int(record.max_attempts))
            or not all(v is None or isinstance(v, str) for v in (record.sha256, record.result))
            or not (record.error is None or isinstance(record.error, Mapping))
        ):
            raise ValueError(f"bad job record {data!r}")
        return record


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    sha256: str
    result: str
    job_id: str
    time: str = ""


@final
class Journal:
    """The job records under ``state_dir/journal`` and the index under ``state_dir/index``."""

    __slots__ = ("index_dir", "journal_dir", "now", "state_dir")

    def __init__(self, state_dir: Path, *, now: Callable[[], float] = time.time) -> None:
        self.state_dir = state_dir
        self.journal_dir = state_dir / "journal"
        self.index_dir = state_dir / "index"
        self.now = now

    def load_all(
        self, *, on_corrupt: Callable[[Path, str], object] | None = None
    ) -> dict[str, JobRecord]:
        """Every record by job id, oldest id first. Temp files are removed; unreadable records skipped."""
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        records: dict[str, JobRecord] = {}
        for path in sorted(self.journal_dir.iterdir()):
            if path.name.startswith("."):
                path.unlink(missing_ok=True)  # a write that never reached its rename
                continue
            if path.suffix != ".json":
                continue
            try:
                record = JobRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError) as exc:
                if on_corrupt is not None:
                    on_corrupt(path, str(exc))
                continue
            records[record.job_id] = record
        return records

    def get(self, job_id: str) -> JobRecord | None:
        try:
            return JobRecord.from_dict(json.loads(self._path(job_id).read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None

    def record(self, job: JobRecord) -> JobRecord:
        """Write ``job`` durably, stamping ``created`` (first time) and ``updated``; returns what was written."""
        stamp = iso_time(self.now())
        job = replace(job, created=job.created or stamp, updated=stamp)
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        # text_values: an error message may name a path that is not UTF-8 (as %XX in the file)
        text = json.dumps(text_values(asdict(job)), indent=1, sort_keys=True, default=str)
        atomic_write(self._path(job.job_id), text, mode=_MODE)
        return job

    def bump_attempts(self, job_id: str) -> JobRecord:
        """Count one more worker start; call it before the start. ``KeyError`` for an unknown job."""
        job = self.get(job_id)
        if job is None:
            raise KeyError(job_id)
        return self.record(replace(job, attempts=job.attempts + 1))

    def set_aside(self, job_id: str) -> Path | None:
        """Rename an unreadable record to ``<job_id>.json.unreadable`` (kept for a look, never read
        again); the path it got, or None when there was none."""
        path = self._path(job_id)
        aside = path.with_name(f"{path.name}.unreadable")
        try:
            path.rename(aside)
        except FileNotFoundError:
            return None
        fsync_dir(self.journal_dir)
        return aside

    def remove(self, job_id: str) -> None:
        self._path(job_id).unlink(missing_ok=True)
        fsync_dir(self.journal_dir)

    def indexed(self, sha256: str) -> bool:
        """Whether the index has an entry for ``sha256`` (a bad key has none)."""
        try:
            return self._index_path(sha256).exists()
        except ValueError:
            return False

    def lookup(self, sha256: str) -> IndexEntry | None:
        """The first result for this content, if it still exists."""
        entry = self._read_index(sha256)
        return entry if entry is not None and Path(entry.result).exists() else None

    def remember(self, sha256: str, result: Path, job_id: str) -> IndexEntry:
        """Make ``result`` the original for ``sha256`` unless a live one exists; returns the winner."""
        self.index_dir.mkdir(parents=True, exist_ok=True)
        final = self._index_path(sha256)
        entry = IndexEntry(sha256, str(result), job_id, iso_time(self.now()))
        tmp = write_temp(final, json.dumps(asdict(entry), sort_keys=True), mode=_MODE)
        try:
            while True:
                try:
                    os.link(tmp, final)
                    break
                except FileExistsError:
                    existing = self.lookup(sha256)
                    if existing is not None:
                        return existing
                    final.unlink(
                        missing_ok=True
                    )  # its result is gone: this job becomes the original
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.index_dir)
        return entry

    def _read_index(self, sha256: str) -> IndexEntry | None:
        path = self._index_path(sha256)
        try:
            return IndexEntry(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None

    def _path(self, job_id: str) -> Path:
        if not _JOB_ID.fullmatch(job_id):
            raise ValueError(f"bad job id {job_id!r}")
        return self.journal_dir / f"{job_id}.json"

    def _index_path(self, sha256: str) -> Path:
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"bad content key {sha256!r}: expected 64 lowercase hex digits")
        return self.index_dir / f"{sha256}.json"


@dataclass(frozen=True, slots=True)
class RecoveredJob:
    """A folder found in ``processing/`` at start-up."""

    job_id: str
    name: str
    job_dir: Path
    record: JobRecord | None
    """None when the daemon died between the claim and the first journal write (or the record
    is unreadable: ``problem``)."""
    result: Path | None = None
    """Its published result, when the daemon died after publishing but before recording it."""
    problem: str | None = None
    """Why nothing can tell what became of it (its journal record is unreadable)."""


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What a restart must do; every folder in ``processing/`` is in exactly one of the first three."""

    resume: tuple[RecoveredJob, ...] = ()
    """Unfinished: queue again, oldest first."""
    to_fail: tuple[RecoveredJob, ...] = ()
    """Attempts used up (a worker kept crashing): move to ``failed/`` without another try."""
    finish: tuple[RecoveredJob, ...] = ()
    """Outcome already decided (terminal record or published result): finish the bookkeeping only."""
    stale: tuple[JobRecord, ...] = ()
    """Non-terminal records whose ``processing/`` folder is gone; nothing can run, mark them."""
    removed: tuple[Path, ...] = ()
    """Swept: ``outbox/.tmp-*`` and ``index/.*.tmp`` leftovers and empty claim folders."""
    unreadable: tuple[RecoveredJob, ...] = ()
    """Unpublished jobs whose journal record is unreadable (torn, damaged): what they did is
    unknown, so they are filed under ``failed/`` rather than run again (``problem`` says why)."""
    unindexed: tuple[JobRecord, ...] = ()
    """``succeeded`` records of jobs no longer in ``processing/`` whose content is missing from the
    index (a daemon before this one wrote it after the record): remembered again."""
    errors: tuple[str, ...] = ()
    """What did not stop the start but is wrong: leftovers that could not be removed (tried again
    at the next start), unreadable records of jobs no longer in ``processing/``."""


def recover(
    state_dir: Path, outbox: Path, *, max_attempts: int = 8, journal: Journal | None = None
) -> RecoveryReport:
    """Sort out ``processing/`` after an unclean stop; run it before the first claim.

    Nothing here stops a start: an unreadable record makes its job ``unreadable``, a leftover that
    cannot be removed is one of ``errors``. Only an unreadable ``processing/`` itself raises."""
    journal = journal or Journal(state_dir)
    corrupt: dict[str, str] = {}
    records = journal.load_all(on_corrupt=lambda path, why: corrupt.setdefault(path.stem, why))
    removed: list[Path] = []
    errors: list[str] = []
    leftovers = [*outbox.glob(f"{TMP_PREFIX}*"), *journal.index_dir.glob(".*.tmp")]
    processing = state_dir / "processing"
    resume, to_fail, finish, unreadable = [], [], [], []
    seen: set[str] = set()
    for job_dir in sorted(processing.iterdir()) if processing.is_dir() else ():
        if not job_dir.is_dir() or job_dir.is_symlink():
            continue
        if not any(job_dir.iterdir()):
            leftovers.append(job_dir)
            continue
        seen.add(job_dir.name)
        record = records.get(job_dir.name)
        name = safe_name(record.name if record is not None else _guess_name(job_dir))
        result = (
            None
            if record is not None and record.terminal
            else find_published(outbox, name, job_dir.name)
        )
        problem = corrupt.get(job_dir.name) if record is None else None
        if problem is not None:
            problem = f"its journal record ({journal.journal_dir / job_dir.name}.json) is unreadable: {problem}"
        job = RecoveredJob(job_dir.name, name, job_dir, record, result, problem)
        limit = (record.max_attempts if record and record.max_attempts else None) or max_attempts
        if result is not None or (record is not None and record.terminal):
            finish.append(job)
        elif problem is not None:
            unreadable.append(job)
        elif record is not None and record.attempts >= limit:
            to_fail.append(job)
        else:
            resume.append(job)
    for path in sorted(leftovers):  # ``.tmp-*`` results, ``remember``s cut short, empty claims
        try:
            removed.append(_remove(path))
        except OSError as exc:
            errors.append(f"cannot remove {path}: {exc.strerror or exc}")
    stale = tuple(
        r
        for r in records.values()
        if not r.terminal and r.state != "detected" and r.job_id not in seen
    )
    unindexed = tuple(
        r
        for r in records.values()
        if r.state == "succeeded"
        and r.sha256
        and r.job_id not in seen
        and not journal.indexed(r.sha256)
    )
    errors += [
        f"journal record {job_id}.json is unreadable ({why}); no job of it is left in processing/"
        for job_id, why in sorted(corrupt.items())
        if job_id not in seen
    ]
    return RecoveryReport(
        tuple(resume),
        tuple(to_fail),
        tuple(finish),
        stale,
        tuple(removed),
        tuple(unreadable),
        unindexed,
        tuple(errors),
    )


def _remove(path: Path) -> Path:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    return path


def _guess_name(job_dir: Path) -> str:
    """The job name from what ``claim`` left: ``<name>.onnx`` or a ``<name>/`` folder."""
    entries = sorted(
        p for p in job_dir.iterdir() if p.suffix != ".toml" and not p.name.startswith("error.")
    )
    if len(entries) == 1:
        only = entries[0]
        return only.stem if only.suffix.lower() == ".onnx" else only.name
    return job_dir.name
