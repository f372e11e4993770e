"""The inbox watcher: what changed in the inbox, told to the dispatcher as fast as the kernel knows.

inotify on the inbox folder, read by sharderd itself (``daemon/inotify.py``: any file name, and the
renames that make a job complete at once, the fast path of ``Settler``), or our own polling scan
(``watch_mode = "poll"`` and network filesystems). The watcher is restarted when the inbox becomes
a different folder (recreated), and after errors with a backoff from 0.5 s to 30 s; meanwhile the
periodic rescan keeps finding jobs. It reports readiness once the kernel's watch exists: a file
dropped after that is seen.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import Final, NoReturn, final

import anyio
import anyio.abc

from sharderd.config import DaemonConfig
from sharderd.daemon.inotify import InboxInotify, InotifyBatch
from sharderd.daemon.intake import is_staging_name
from sharderd.logs import get_logger

__all__ = ["InboxEvents", "InboxWatcher", "watch_mode"]

_log = get_logger(__name__)

_STEP_S: Final = 0.05
"""Least time between two batches told to the dispatcher."""
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
        self._force_polling = bool(force_polling)
        self.lost = False
        """The watch ended (the inbox went), or a scan failed: the next check restarts the watch."""
        self._scope = anyio.CancelScope()
        self._inbox_id: tuple[int, int] | None = None

    def stop(self) -> None:
        """End the current watch; ``run`` starts a new one (or is being cancelled)."""
        self._scope.cancel()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Watch, restarted on request (a recreated inbox) or after errors; started once watching.

        The kernel's watch exists when ``InboxInotify.open`` returns, so a file dropped after
        ``started()`` raises an event."""
        with contextlib.suppress(OSError):  # gone already: the first rescan recreates it
            self._inbox_id = _dir_id(self.inbox)
        announced = False
        polling = self._force_polling
        backoff = _BACKOFF_S[0]
        restarts = 0
        while True:
            self._scope = scope = anyio.CancelScope()
            try:
                watch = None if polling else InboxInotify.open(self.inbox)
                mode = "poll" if watch is None else "inotify"
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
                with scope:
                    if watch is None:
                        await self._poll()
                    else:
                        with watch:
                            await self._consume(watch)
            except Exception as error:  # OSError mostly; a bug must cost the watch, not the daemon
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

        The inode alone cannot tell: a folder recreated at once often gets the old inode back. So the
        end of the watch (the inbox deleted or moved), or a failed scan, also marks it as lost.
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
            self.stop()  # the watcher loop starts a new one and logs watch.restarted

    async def _poll(self) -> NoReturn:
        """Our own full scan every ``poll_interval`` (network filesystems): it only ``lstat``s, so a
        folder job filled in place is seen by its settle looks or the rescan."""
        while True:
            await anyio.sleep(self.daemon.poll_interval)
            self.events.request_scan()

    async def _consume(self, watch: InboxInotify) -> NoReturn:
        """Tell the dispatcher what changed, batch by batch; a batch every ``_STEP_S`` at most, so
        a file being written in place (an event per write) wakes it 20 times a second, not 10,000."""
        while True:
            batch = await watch.next_batch()
            self._on_batch(batch)
            if batch.gone:  # nothing more will come: wait for check_inbox to start a new watch
                await anyio.sleep_forever()
            await anyio.sleep(_STEP_S)

    def _on_batch(self, batch: InotifyBatch) -> None:
        inbox, events = self.inbox, self.events
        if batch.overflow or batch.gone:
            events.full_scan = True
        self.lost = self.lost or batch.gone
        events.dirty |= {inbox / n for n in batch.changed if not is_staging_name(n)}
        events.renamed |= {inbox / n for n in batch.moved_in if not is_staging_name(n)}
        events.wake()


def watch_mode(daemon: DaemonConfig) -> tuple[str, bool | None]:
    """``(description, force_polling)``; ``None`` (``auto`` on a local disk): inotify where the
    system has it."""
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
