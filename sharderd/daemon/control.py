"""Cancel requests: files, so they need no port and survive a restart (retry is ``daemon/retry.py``).

Cancel. ``sharderd cancel JOB_ID`` writes ``state_dir/control/cancel-<job_id>`` (temp file, then
rename); anyone who may drop jobs may also drop ``inbox/<name>.cancel``, which cancels every pending
or running job of that name. The daemon's control task calls ``ControlWatch.poll`` every second:
two ``stat`` calls, and a listing only when a folder's mtime changed (and every rescan interval
anyway, for filesystems with coarse mtimes). Each request is acted on, then deleted. One that
matches nothing is deleted too, with a ``cancel.ignored`` line, so it cannot cancel a later job
of the same name. A request written while the daemon is down is honoured at its next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, final

import anyio
import anyio.abc

from sharderd.daemon.intake import is_staging_name
from sharderd.daemon.queue import JobQueue, Seen, Waiting
from sharderd.daemon.status import StatusBoard
from sharderd.errors import EXIT_BAD_INPUT, SharderdError
from sharderd.filenames import safe_name
from sharderd.fsutil import atomic_write, make_dirs
from sharderd.isotime import iso_time
from sharderd.logs import get_logger

__all__ = [
    "CANCEL_SUFFIX",
    "CONTROL_DIR",
    "CancelRequest",
    "Canceller",
    "ControlWatch",
    "JobNotFoundError",
    "ensure_control_dir",
    "is_job_id",
    "request_cancel",
]

CONTROL_DIR: Final = "control"
"""``state_dir/control``: requests to the daemon, one file each."""
CANCEL_SUFFIX: Final = ".cancel"
_CANCEL_PREFIX: Final = "cancel-"
_POLL_S: Final = 1.0
"""How often the daemon looks for cancel requests (two ``stat`` calls when there are none)."""
_JOB_ID: Final = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.-]*")

_log = get_logger(__name__)


class JobNotFoundError(SharderdError):
    """The job a request names is not known (exit 2: the name or id is wrong)."""

    exit_code = EXIT_BAD_INPUT
    reason = "not_found"


def is_job_id(text: str) -> bool:
    return _JOB_ID.fullmatch(text) is not None


def ensure_control_dir(state_dir: Path, mode: int) -> Path:
    """Create ``state_dir/control`` (the daemon does, with ``dir_mode``: only its users may cancel by id)."""
    path = state_dir / CONTROL_DIR
    make_dirs(path, mode)
    return path


# -- cancel ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """One request file; exactly one of ``job_id`` and ``name`` is set."""

    path: Path
    job_id: str | None
    name: str | None
    by: str
    """Who asked, for the log and ``error.json``."""

    def matches(self, job_id: str, name: str) -> bool:
        return job_id == self.job_id if self.job_id is not None else name == self.name

    def done(self) -> None:
        """The request was acted on (or matched nothing): remove it."""
        with contextlib.suppress(OSError):  # unremovable: it matches nothing next time, and says so
            self.path.unlink(missing_ok=True)


def find_job(
    state_dir: Path, status: Mapping[str, Any] | None, job_id: str
) -> tuple[str, str] | None:
    """``(name, state)`` of a job the daemon knows, else None.

    ``state`` is ``running`` or ``pending`` (from ``status.json``), else the journal's state
    (``claimed`` ... ``succeeded``). A pending job is known only to the daemon, by its status file.
    """
    for key, state in (("running", "running"), ("pending_jobs", "pending")):
        for job in (status or {}).get(key) or ():
            if isinstance(job, Mapping) and job.get("job_id") == job_id:
                return str(job.get("name")), state
    if not is_job_id(job_id):
        return None
    try:
        record = json.loads((state_dir / "journal" / f"{job_id}.json").read_text(encoding="utf-8"))
        return str(record["name"]), str(record["state"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return (job_id, "claimed") if (state_dir / "processing" / job_id).is_dir() else None


def request_cancel(state_dir: Path, job_id: str) -> Path:
    """Write ``state_dir/control/cancel-<job_id>`` atomically; the daemon acts on it within a second.

    Raises:
        JobNotFoundError: ``job_id`` is not a job id.
        SharderdError: The control folder is missing (the daemon never ran here) or not writable.
    """
    if not is_job_id(job_id):
        raise JobNotFoundError(
            f"{job_id!r} is not a job id (they look like 20250131T120000123Z-1a2b3c4d)"
        )
    control = state_dir / CONTROL_DIR
    if not control.is_dir():
        raise SharderdError(
            f"{control} does not exist: no daemon has run with state_dir {state_dir}",
            hint="Check --config: it must name the daemon's configuration.",
        )
    final = control / f"{_CANCEL_PREFIX}{job_id}"
    body = json.dumps(
        {
            "job_id": job_id,
            "requested": iso_time(time.time()),
            "uid": os.getuid(),
            "pid": os.getpid(),
        }
    )
    try:  # 0644 whatever our umask: the daemon (another user) must read it
        atomic_write(final, body + "\n", mode=0o644, exact_mode=True, durable=False)
    except PermissionError:
        raise SharderdError(
            f"cannot write to {control}: permission denied",
            hint="Run it as the daemon's user, e.g. `sudo -u sharderd sharderd cancel ...`, or as root.",
        ) from None
    return final


@final
class ControlWatch:
    """Finds cancel requests in the control folder and the inbox without listing them every second."""

    __slots__ = ("_full_every", "_key", "_next_full", "_now", "control", "inbox")

    def __init__(
        self,
        inbox: Path,
        control: Path,
        *,
        full_every_s: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inbox = inbox
        self.control = control
        self._full_every = full_every_s
        self._now = now
        self._key: tuple[int, ...] = ()
        self._next_full = 0.0

    def poll(self) -> list[CancelRequest]:
        """The requests present now, when either folder changed since the last look (or it is time)."""
        key = tuple(n for path in (self.control, self.inbox) for n in _mtime_key(path))
        t = self._now()
        if key == self._key and t < self._next_full:
            return []
        self._key, self._next_full = key, t + self._full_every
        return [*self._by_id(), *self._by_name()]

    def _by_id(self) -> Iterator[CancelRequest]:
        for entry in _names(self.control):
            job_id = entry.removeprefix(_CANCEL_PREFIX)
            if entry.startswith(_CANCEL_PREFIX) and is_job_id(job_id):
                path = self.control / entry
                yield CancelRequest(path, job_id, None, _requester(path))

    def _by_name(self) -> Iterator[CancelRequest]:
        for entry in _names(self.inbox):
            if entry.endswith(CANCEL_SUFFIX) and not is_staging_name(entry):
                name = re.sub(
                    r"\.onnx$", "", entry.removesuffix(CANCEL_SUFFIX), flags=re.IGNORECASE
                )
                if name:  # jobs are named by safe_name: so is the request
                    yield CancelRequest(self.inbox / entry, None, safe_name(name), f"inbox/{entry}")


def _mtime_key(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_mtime_ns)


def _names(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name for e in entries)
    except OSError:
        return []


def _requester(path: Path) -> str:
    try:
        uid = json.loads(path.read_text(encoding="utf-8")).get("uid")
    except (OSError, ValueError, AttributeError):
        uid = None
    return "sharderd cancel" if uid is None else f"sharderd cancel, uid {uid}"


@final
class Canceller:
    """The daemon's side of a request: cancel every running, pending or resumable job it names.

    A running job's scope is cancelled (``run_job`` kills its attempts within ``kill_grace``, then
    files it); a pending one is claimed and filed without running (``claim``); a resumable one is
    filed at once (``file_cancelled``).
    """

    def __init__(
        self,
        watch: ControlWatch,
        *,
        board: StatusBoard,
        scopes: Mapping[str, anyio.CancelScope],
        queue: JobQueue,
        claim: Callable[[Seen, str], None],
        file_cancelled: Callable[[Waiting, str], None],
        changed: Callable[[], None],
    ) -> None:
        self.watch = watch
        self.board = board
        self.scopes = scopes
        self.queue = queue
        self._claim = claim
        self._file_cancelled = file_cancelled
        self._changed = changed

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Act on cancel requests; polled: they are rare, and files survive a restart."""
        task_status.started()
        while True:
            for request in self.watch.poll():
                self.cancel(request)
            await anyio.sleep(_POLL_S)

    def cancel(self, request: CancelRequest) -> None:
        """Cancel what ``request`` names, then drop the request."""
        hits = 0
        for job_id, progress in list(self.board.running.items()):
            scope = self.scopes.get(job_id)
            if scope is None or not request.matches(job_id, progress.name):
                continue
            hits += 1
            if progress.cancel_requested is None:
                progress.cancel_requested = request.by
                scope.cancel()  # run_job kills its attempts (kill_grace), then files the job
                _log.info(
                    "cancel.requested",
                    job_id=job_id,
                    name=progress.name,
                    by=request.by,
                    stage=progress.stage,
                )
        for seen in self.queue.inbox.take(request.matches):
            hits += 1
            _log.info(
                "cancel.requested",
                job_id=seen.job_id,
                name=seen.candidate.name,
                by=request.by,
                stage="pending",
            )
            self._claim(seen, request.by)
        for waiting in self.queue.take_backlog(request.matches):
            hits += 1
            job = waiting.job
            _log.info(
                "cancel.requested", job_id=job.job_id, name=job.name, by=request.by, stage="pending"
            )
            self._file_cancelled(waiting, request.by)
        request.done()
        self._changed()
        if not hits:
            _log.warning(
                "cancel.ignored",
                job_id=request.job_id,
                name=request.name,
                by=request.by,
                message="no pending or running job matches; the request was removed",
            )
