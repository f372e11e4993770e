"""The inbox watcher: what changed in the inbox, told to the dispatcher as fast as the kernel knows.

inotify through ``watchfiles`` (or our own polling scan, ``watch_mode = "poll"`` and network
filesystems), plus the kernel's ``IN_MOVED_TO`` renames (``daemon/renames.py``), the fast path of
``Settler``. The watcher is restarted when the inbox becomes a different folder (recreated), and
after errors with a backoff from 0.5 s to 30 s; meanwhile the periodic rescan keeps finding jobs.
It reports readiness once the watch exists, which the watch thread proves by its first look at
the stop flag: a file dropped after that is seen.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final, NoReturn, final

import anyio
import anyio.abc
import anyio.from_thread
from watchfiles import Change, awatch

from sharderd.config import DaemonConfig
from sharderd.daemon.intake import InboxFilter, is_staging_name
from sharderd.daemon.renames import RenameWatch
from sharderd.errors import sole_exception
from sharderd.logs import get_logger

__all__ = ["InboxEvents", "InboxWatcher", "watch_mode"]

_log = get_logger(__name__)

_DEBOUNCE_MS: Final = 500
_STEP_MS: Final = 50
_TIMEOUT_MS: Final = 1000
"""The watch thread returns this often even without changes, bounding any wait for it to stop."""
_BACKOFF_S: Final = (0.5, 30.0)
_NETWORK_FS: Final = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "virtiofs",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
    }
)
"""Mounts where inotify misses writes made by other hosts; ``watch_mode = "auto"`` polls them."""


@final
class InboxEvents:
    """What the watcher and the rescans tell the dispatcher: entries to look at, renames, a full scan."""

    __slots__ = ("_wake", "dirty", "full_scan", "renamed")

    def __init__(self) -> None:
        self.dirty: set[Path] = set()
        self.renamed: set[Path] = set()
        """Inbox entries an ``IN_MOVED_TO`` named since the last dispatch: complete once confirmed."""
        self.full_scan = False
        self._wake = anyio.Event()

    def wake(self) -> None:
        self._wake.set()

    def request_scan(self) -> None:
        self.full_scan = True
        self._wake.set()

    async def wait(self, delay: float) -> tuple[set[Path], frozenset[Path], bool]:
        """Sleep until woken or ``delay`` passes; then ``(dirty, renamed, full_scan)``, all reset."""
        with anyio.move_on_after(delay):
            await self._wake.wait()
        self._wake = anyio.Event()
        taken = self.dirty, frozenset(self.renamed), self.full_scan
        self.dirty, self.renamed, self.full_scan = set(), set(), False
        return taken


@final
class _WatchStop:
    """awatch's stop flag. The watch thread polls ``is_set``; its first look sets ``armed`` in the
    event loop, which proves the watch exists. Only a plain bool crosses the thread boundary."""

    __slots__ = ("_looked", "_set", "armed")

    def __init__(self) -> None:
        self.armed = anyio.Event()
        self._set = False
        self._looked = False

    def is_set(self) -> bool:
        """Called in awatch's worker thread."""
        if not self._looked:
            self._looked = True
            with contextlib.suppress(RuntimeError):  # the event loop is already gone: nobody waits
                anyio.from_thread.run_sync(self.armed.set)
        return self._set

    @property
    def stopped(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True


@final
class InboxWatcher:
    """Keeps a watch on the inbox; ``run`` is a task of the intake group (``tg.start``)."""

    def __init__(
        self, daemon: DaemonConfig, events: InboxEvents, *, mode: str, force_polling: bool | None
    ) -> None:
        self.inbox = daemon.inbox
        self.daemon = daemon
        self.events = events
        self.mode = mode
        """How it watches, for the log (``watch_mode``)."""
        self._force_polling = force_polling
        self.lost = False
        """A watch event on the inbox itself, or a failed scan: the next check restarts the watch."""
        self._stop = _WatchStop()
        self._inbox_id: tuple[int, int] | None = None

    def stop(self) -> None:
        """End the current watch; ``run`` starts a new one (or is being cancelled)."""
        self._stop.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Watch, restarted on request (a recreated inbox) or after errors; started once watching."""
        with contextlib.suppress(OSError):  # gone already: the first rescan recreates it
            self._inbox_id = _dir_id(self.inbox)
        announced = False
        polling = self._force_polling
        backoff = _BACKOFF_S[0]
        restarts = 0
        while True:
            stop = self._stop = _WatchStop()
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._consume, stop, polling)
                    await stop.armed.wait()
                    mode = "poll" if polling else "inotify"
                    if restarts:
                        _log.info(
                            "watch.restarted", inbox=str(self.inbox), mode=mode, restarts=restarts
                        )
                    else:
                        _log.info("watch.started", inbox=str(self.inbox), mode=mode)
                    if not announced:
                        announced = True
                        task_status.started()
                    backoff = _BACKOFF_S[0]
            except Exception as exc:
                error = sole_exception(exc)
                limit = _is_watch_limit(error)
                _log.error(
                    "watch.failed",
                    inbox=str(self.inbox),
                    error=f"{type(error).__name__}: {error}",
                    retry_in_s=backoff,
                    fallback="poll" if limit and not polling else None,
                    hint=(
                        "inotify limits reached: raise fs.inotify.max_user_watches / max_user_instances "
                        '(sysctl), or set watch_mode = "poll"'
                    )
                    if limit
                    else "the periodic rescan keeps finding new jobs meanwhile",
                )
                polling = polling or limit
                if not announced:
                    announced = True
                    task_status.started()  # the rescan still finds jobs; do not block start-up on the watcher
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_S[1])
            restarts += 1

    def check_inbox(self) -> None:
        """Recreate a deleted inbox; restart the watcher when the inbox is a different folder now.

        The inode alone cannot tell: a folder recreated at once often gets the old inode back. So a
        watch event on the inbox itself, or a failed scan, also marks the watch as lost.
        """
        try:
            if not self.inbox.is_dir():
                self.inbox.mkdir(mode=self.daemon.dir_mode, parents=True)
                self.lost = True
            current = _dir_id(self.inbox)
        except OSError as exc:
            _log.error(
                "watch.failed", inbox=str(self.inbox), error=f"cannot recreate the inbox: {exc}"
            )
            return
        if current != self._inbox_id or self.lost:
            self._inbox_id = current
            self.lost = False
            self._stop.set()  # the watcher loop starts a new one and logs watch.restarted

    async def _consume(self, stop: _WatchStop, polling: bool | None) -> None:
        """Watch the inbox itself, not below it: a recursive watch (and watchfiles' poller at any
        depth) follows a symlinked folder in the inbox and walks what it names (``/etc``, ``/``).
        Polling is our own full scan, which only ``lstat``s; a folder job filled in place is seen by
        its settle looks or the rescan."""
        if polling:
            stop.armed.set()
            while not stop.stopped:
                await anyio.sleep(self.daemon.poll_interval)
                self.events.request_scan()
            return
        try:
            renames = RenameWatch.open(self.inbox)
        except OSError as exc:  # inotify limits: only the fast path is lost, renamed-in jobs settle
            renames = None
            _log.warning(
                "watch.renames_unavailable",
                inbox=str(self.inbox),
                error=str(exc),
                message="jobs renamed in wait settle_seconds like jobs written in place",
            )
        try:
            async with anyio.create_task_group() as tg:
                if renames is not None:
                    tg.start_soon(self._renames, renames)
                async for changes in awatch(
                    self.inbox,
                    watch_filter=InboxFilter(self.inbox),
                    debounce=_DEBOUNCE_MS,
                    step=_STEP_MS,
                    stop_event=stop,
                    rust_timeout=_TIMEOUT_MS,
                    force_polling=polling,
                    poll_delay_ms=int(self.daemon.poll_interval * 1000),
                    recursive=False,
                    ignore_permission_denied=True,
                ):
                    self._on_changes(changes)
                tg.cancel_scope.cancel()
        finally:
            if renames is not None:
                renames.close()

    async def _renames(self, watch: RenameWatch) -> None:
        """Feed the renames the kernel reports to the dispatcher (the fast path of ``Settler``)."""
        while (batch := await watch.next_batch()) is not None:
            top = {p for p in batch if not is_staging_name(p.name)}
            if top:
                self.events.renamed |= top
                self.events.dirty |= top
                self.events.wake()

    def _on_changes(self, changes: Iterable[tuple[Change, str]]) -> None:
        inbox = self.inbox
        for _, raw in changes:
            path = Path(raw)
            if path == inbox or not path.is_relative_to(inbox):
                self.events.full_scan = True
                self.lost = self.lost or path == inbox  # the inbox itself went or came
                continue
            self.events.dirty.add(inbox / path.relative_to(inbox).parts[0])
        self.events.wake()


def watch_mode(daemon: DaemonConfig) -> tuple[str, bool | None]:
    """``(description, force_polling)``; ``None`` lets ``WATCHFILES_FORCE_POLLING`` decide."""
    if daemon.watch_mode == "poll":
        return "poll", True
    if daemon.watch_mode == "inotify":
        return "inotify", False
    fstype = _network_fs(daemon.inbox)
    return (f"poll (auto: {fstype})", True) if fstype else ("auto", None)


def _network_fs(path: Path) -> str | None:
    """The type of the mount holding ``path`` when it is a network or FUSE filesystem."""
    try:
        lines = (
            Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace").splitlines()
        )
    except OSError:
        return None
    real = os.path.realpath(path)
    best, fstype = "", ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, fstype = mount, tail[0]
    return fstype if fstype in _NETWORK_FS or fstype.startswith("fuse") else None


def _is_watch_limit(error: BaseException) -> bool:
    return isinstance(error, OSError) and ("limit" in str(error).lower() or error.errno in (28, 24))


def _dir_id(path: Path) -> tuple[int, int]:
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{path} is not a directory")
    return st.st_dev, st.st_ino
