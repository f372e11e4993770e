"""The inbox protocol: what is a job, when is it complete, and how a daemon takes it.

A job is ``inbox/<name>.onnx``, or a folder ``inbox/<name>/`` holding exactly one ``.onnx`` plus its
external data (moved in with one rename). An optional sidecar ``inbox/<name>.toml`` (either form) or
``<name>/sharderd.toml`` overrides options. Dotfiles, ``*.part``, ``*.tmp`` and ``*~`` are staging
names and never jobs; any other name (``notes.txt``, a lone ``x.toml``, an empty folder) is not a job
either and is left alone.

Bad jobs are claimed and failed rather than ignored, so ops find a readable reason in ``failed/``
instead of a file that silently sits in the inbox: a folder with two ``.onnx``, a model or sidecar
that is not a regular file, symbolic links, and hard links (any file of the job with more than one
name). The inbox never follows a link (a link would let a job read outside the inbox); ``claim``
renames the link itself. A hard link cannot be told from the file it shares an inode with, which
may live anywhere on the filesystem; reading it would read that file with the daemon's rights. Only links that look like a job are
claimed: ``<name>.onnx`` (file form) and suffix-less names (folder form); other links are ignored.

Completeness. A file written in place is complete once its stat signature (size, mtime, ctime,
inode of every file) has not changed for ``settle_seconds``. A file (or folder) renamed in is
complete at once: the rename is the writer's "done". Which entries were renamed in is the kernel's
word, not a guess: inotify's ``IN_MOVED_TO`` (``sharderd.daemon.inotify``), raised for a rename from
a staging name in the inbox (``.x.onnx.part`` → ``x.onnx``) and for one from elsewhere on the
filesystem alike, and never for a file created in place. (Timestamps cannot tell: a rename in the
same clock tick as the last write leaves ctime == mtime.) Such an entry is complete once its
signature is the same on two looks ``confirm_seconds`` apart, which catches a writer still writing
into a file it renamed in early.

Claiming is ``os.rename`` into ``processing/<job_id>/``: atomic, so of two daemons sharing an inbox
exactly one succeeds and the other sees the path gone. The settle window is the contract: a writer
that resumes after ``settle_seconds`` of silence is outside it.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, final

from sharderd.filenames import safe_name
from sharderd.fsutil import fsync_dir

__all__ = [
    "DIR_SIDECAR",
    "Candidate",
    "ClaimedJob",
    "FileStat",
    "Settler",
    "claim",
    "inspect_entry",
    "is_staging_name",
    "new_job_id",
    "scan_inbox",
]

DIR_SIDECAR: Final = "sharderd.toml"
"""Sidecar name inside a folder job."""

_STAGING_RE: Final = re.compile(r"^\.|\.part$|\.tmp$|~$")
_MODEL_RE: Final = re.compile(r"\.onnx$", re.IGNORECASE)

Kind = Literal["file", "dir"]


def is_staging_name(name: str) -> bool:
    """Dotfiles, ``*.part``, ``*.tmp``, ``*~``: names writers use before the final rename."""
    return _STAGING_RE.search(name) is not None


@dataclass(frozen=True, slots=True)
class FileStat:
    """One ``lstat`` of an entry of a job, as compared between looks."""

    rel: str
    """Path relative to the inbox (``x.onnx``, ``x.toml``, ``x``, ``x/w.bin``)."""
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, rel: str, st: os.stat_result) -> FileStat:
        return cls(rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An inbox entry that is (or claims to be) a job, at one look."""

    name: str
    """Job name: the file name without ``.onnx``, or the folder name, as ``filenames.safe_name``
    (printable UTF-8, bounded); the outbox folder is named by it, the log and status show it."""
    path: Path
    """``inbox/<name>.onnx`` or ``inbox/<name>``: what ``claim`` renames."""
    kind: Kind
    model: Path | None
    """The ``.onnx`` (inside the folder for a folder job); None for a bad job."""
    sidecar: Path | None
    signature: tuple[FileStat, ...]
    """The entry first, then its sidecar or (folder) every entry below it, sorted."""
    problem: str | None = None
    """Why this can never be a valid job; such a candidate is claimed and failed, never run."""

    @property
    def raw_name(self) -> str:
        """The job name as the filesystem has it (any bytes): ``name`` before ``safe_name``."""
        entry = self.path.name
        return _MODEL_RE.sub("", entry) if self.kind == "file" else entry


def scan_inbox(inbox: Path) -> list[Candidate]:
    """Every candidate in the inbox, sorted by path; raises ``OSError`` if the inbox is unreadable."""
    with os.scandir(inbox) as entries:
        names = sorted(e.name for e in entries)
    return [c for c in (inspect_entry(inbox, n) for n in names) if c is not None]


def inspect_entry(inbox: Path, entry: str) -> Candidate | None:
    """Classify one top-level inbox entry; None when it is not a job (or vanished meanwhile)."""
    if is_staging_name(entry):
        return None
    try:
        st = os.lstat(inbox / entry)
        if not stat.S_ISDIR(st.st_mode):
            return _inspect_file(inbox, entry, st)
    except FileNotFoundError:
        return None
    try:
        return _inspect_dir(inbox, entry, st)
    except FileNotFoundError:
        return None  # changing under our feet: the next look decides
    except PermissionError as exc:  # unreadable folder: a bad job, not a reason to stop scanning
        return Candidate(
            safe_name(entry),
            inbox / entry,
            "dir",
            None,
            None,
            (FileStat.of(entry, st),),
            f"cannot read folder {entry}: {exc.strerror}",
        )


def _inspect_file(inbox: Path, entry: str, st: os.stat_result) -> Candidate | None:
    path = inbox / entry
    is_model = _MODEL_RE.search(entry) is not None
    if stat.S_ISLNK(st.st_mode) and not is_model and not Path(entry).suffix:
        return Candidate(
            safe_name(entry),
            path,
            "dir",
            None,
            None,
            (FileStat.of(entry, st),),
            f"{entry} is a symbolic link; sharderd never follows links in the inbox",
        )
    if not is_model:
        return None
    name = _MODEL_RE.sub("", entry)
    signature = [FileStat.of(entry, st)]
    problem = _not_regular(entry, st, "the model")
    sidecar = inbox / f"{name}.toml"
    try:
        side = os.lstat(sidecar)
    except FileNotFoundError:
        sidecar_path = None
    else:
        sidecar_path = sidecar
        signature.append(FileStat.of(sidecar.name, side))
        problem = problem or _not_regular(sidecar.name, side, "the sidecar")
    return Candidate(
        safe_name(name),
        path,
        "file",
        None if problem else path,
        sidecar_path,
        tuple(signature),
        problem,
    )


def _inspect_dir(inbox: Path, entry: str, st: os.stat_result) -> Candidate | None:
    path = inbox / entry
    signature = [FileStat.of(entry, st)]
    models: list[str] = []
    problems: list[str] = []
    for rel, sub in _walk(path, entry):
        signature.append(FileStat.of(rel, sub))
        top_name = rel[len(entry) + 1 :]
        if os.sep not in top_name and _MODEL_RE.search(top_name) and not is_staging_name(top_name):
            models.append(top_name)
            problems.append(_not_regular(rel, sub, "the model") or "")
        elif top_name != DIR_SIDECAR:  # the sidecar is checked below
            problems.append(_hard_link(rel, sub, "the file") or "")
    if not models:
        return None  # an empty or half-filled folder is not a job yet
    sidecar: Path | None = None
    for side in (path / DIR_SIDECAR, inbox / f"{entry}.toml"):
        try:
            side_st = os.lstat(side)
        except FileNotFoundError:
            continue
        if sidecar is not None:
            problems.append(f"two sidecars: {entry}/{DIR_SIDECAR} and {entry}.toml; keep one")
        sidecar = side
        problems.append(
            _not_regular(side.relative_to(inbox).as_posix(), side_st, "the sidecar") or ""
        )
        if side.parent == inbox:
            signature.append(FileStat.of(side.name, side_st))
    if len(models) > 1:
        problems.append(
            f"folder {entry} holds {len(models)} models ({', '.join(sorted(models))}); a folder job holds exactly one .onnx"
        )
    problem = "; ".join(p for p in problems if p) or None
    model = None if problem else path / models[0]
    return Candidate(safe_name(entry), path, "dir", model, sidecar, tuple(signature), problem)


def _walk(path: Path, rel: str) -> Iterable[tuple[str, os.stat_result]]:
    """Every entry below ``path`` by ``lstat``, never through a link, sorted for stable signatures."""
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        sub_rel = f"{rel}{os.sep}{e.name}"
        st = e.stat(follow_symlinks=False)
        yield sub_rel, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(Path(e.path), sub_rel)


def _not_regular(rel: str, st: os.stat_result, what: str) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return f"{what} {rel} is a symbolic link; sharderd never follows links in the inbox"
    if not stat.S_ISREG(st.st_mode):
        return f"{what} {rel} is not a regular file"
    return _hard_link(rel, st, what)


def _hard_link(rel: str, st: os.stat_result, what: str) -> str | None:
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return (
            f"{what} {rel} is a hard link ({st.st_nlink} names for one file, maybe one outside the inbox); "
            "sharderd never reads such a file: copy it into the inbox instead of linking it"
        )
    return None


@dataclass(slots=True)
class _Track:
    signature: tuple[FileStat, ...]
    since: float
    fast: bool


@final
class Settler:
    """Decides when a candidate is complete from repeated looks; keyed by ``Candidate.path``.

    Feed every look to ``observe``; it answers True once the signature has been unchanged for
    ``settle_seconds``, or for ``confirm_seconds`` when the entry was renamed in (``renamed=True``:
    an ``IN_MOVED_TO`` named it since the last look). ``next_due`` says when to look again.
    """

    __slots__ = ("_confirm", "_now", "_settle", "_tracks")

    def __init__(
        self,
        settle_seconds: float,
        *,
        confirm_seconds: float = 0.1,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settle = settle_seconds
        self._confirm = min(confirm_seconds, settle_seconds)
        self._now = now
        self._tracks: dict[Path, _Track] = {}

    def observe(self, candidate: Candidate, *, renamed: bool = False) -> bool:
        """Record one look; True when the candidate is complete."""
        t = self._now()
        fast = renamed
        track = self._tracks.get(candidate.path)
        if track is None or track.signature != candidate.signature:
            self._tracks[candidate.path] = track = _Track(candidate.signature, t, fast)
        else:
            track.fast = track.fast or fast
        age = t - track.since
        return age >= self._settle or (track.fast and age >= self._confirm and track.since < t)

    def next_due(self) -> float | None:
        """Clock time at which some tracked candidate could become complete; None when idle."""
        return min(
            (
                tr.since + (self._confirm if tr.fast else self._settle)
                for tr in self._tracks.values()
            ),
            default=None,
        )

    def forget(self, path: Path) -> None:
        self._tracks.pop(path, None)

    def retain(self, paths: Iterable[Path]) -> None:
        """Drop every track whose path is not in ``paths`` (after a full scan)."""
        keep = set(paths)
        for path in [p for p in self._tracks if p not in keep]:
            del self._tracks[path]

    def __len__(self) -> int:
        return len(self._tracks)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job moved into ``processing/<job_id>/``; paths point there."""

    job_id: str
    name: str
    kind: Kind
    job_dir: Path
    entry: Path
    """The moved entry: ``job_dir/<name>.onnx`` or ``job_dir/<name>``."""
    model: Path | None
    sidecar: Path | None
    problem: str | None


def claim(
    candidate: Candidate, processing_dir: Path, job_id: str, *, dir_mode: int = 0o750
) -> ClaimedJob | None:
    """Move the candidate (and its inbox sidecar) into ``processing_dir/job_id``; None if it vanished.

    The model's rename is the claim: of several daemons only one rename can find the path. The
    sidecar follows; if it is gone by then the job runs with defaults.
    """
    job_dir = processing_dir / job_id
    job_dir.mkdir(mode=dir_mode)
    # its entry durable before the model moves in: else a power cut that keeps the inbox's loss
    # of the model (fsynced below) could lose the folder holding it
    fsync_dir(processing_dir)
    entry = job_dir / candidate.path.name
    try:
        candidate.path.rename(entry)
    except FileNotFoundError:
        job_dir.rmdir()
        return None
    except OSError:
        job_dir.rmdir()
        raise
    sidecar = None
    if candidate.sidecar is not None:
        inside = candidate.kind == "dir" and candidate.sidecar.parent == candidate.path
        sidecar = entry / candidate.sidecar.name if inside else job_dir / candidate.sidecar.name
        if not inside:
            try:
                candidate.sidecar.rename(sidecar)
            except FileNotFoundError:
                sidecar = None
    fsync_dir(job_dir)
    fsync_dir(candidate.path.parent)
    model = None if candidate.model is None else entry / candidate.model.relative_to(candidate.path)
    return ClaimedJob(
        job_id, candidate.name, candidate.kind, job_dir, entry, model, sidecar, candidate.problem
    )


def new_job_id(now: float | None = None) -> str:
    """``20250131T120000123Z-1a2b3c4d``: sorts by UTC creation time, unique by 32 random bits."""
    t = time.time() if now is None else now
    ms = int(t * 1000) % 1000
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(t))}{ms:03d}Z-{secrets.token_hex(4)}"
