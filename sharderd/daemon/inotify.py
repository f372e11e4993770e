"""The inbox's inotify watch, read by sharderd itself: every change, any file name, renames told apart.

One inotify instance on the inbox folder, not below it (a recursive watch would follow a symlinked
folder in the inbox and walk what it names). Each read gives the names that changed, as bytes: a
name that is not UTF-8 (a latin-1 ``été`` from an old script) is reported like any other (as
``os.fsdecode`` gives it). watchfiles cannot do that: its Rust core fails the whole batch with
"Unable to decode path" and stops the watch, so sharderd reads the kernel's events directly.

It also tells the one thing watchfiles cannot: which entries were *renamed in*. ``IN_MOVED_TO`` is
raised by exactly one thing, a rename whose target is in the watched folder, whether the source was
a staging name in the inbox (``.x.onnx.part`` → ``x.onnx``) or a path elsewhere on the filesystem;
a file created in place raises ``IN_CREATE`` instead, and timestamps cannot tell the two apart (a
``cp x .x.part && mv .x.part x`` within one clock tick leaves ctime equal to mtime). The settler
takes a renamed-in entry as complete once confirmed (``daemon/intake.py``).

A full event queue (``IN_Q_OVERFLOW``) loses names: the batch then asks for a full scan. The watch
is gone (``IN_IGNORED``) when the inbox is deleted or moved away; the watcher then starts anew.
``InboxInotify.open`` returns None where inotify is unavailable (not Linux): the daemon polls.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final, final

import anyio

__all__ = ["InboxInotify", "InotifyBatch", "parse_events"]

_IN_MODIFY: Final = 0x00000002
_IN_ATTRIB: Final = 0x00000004
_IN_CLOSE_WRITE: Final = 0x00000008
_IN_MOVED_FROM: Final = 0x00000040
_IN_MOVED_TO: Final = 0x00000080
_IN_CREATE: Final = 0x00000100
_IN_DELETE: Final = 0x00000200
_IN_DELETE_SELF: Final = 0x00000400
_IN_MOVE_SELF: Final = 0x00000800
_IN_Q_OVERFLOW: Final = 0x00004000
_IN_IGNORED: Final = 0x00008000
_IN_ONLYDIR: Final = 0x01000000
_IN_DONT_FOLLOW: Final = 0x02000000
_IN_EXCL_UNLINK: Final = 0x04000000
_WATCHED: Final = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
)
_GONE: Final = _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF
_HEADER: Final = struct.Struct("iIII")
"""``struct inotify_event``: wd, mask, cookie, len; then ``len`` bytes of NUL-padded name."""
_READ_BYTES: Final = 64 * 1024


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (AttributeError, OSError):  # not Linux / not glibc
        return None
    return libc


_LIBC: Final = _libc()


@dataclass(frozen=True, slots=True)
class InotifyBatch:
    """What one or more reads of the watch reported."""

    changed: frozenset[str] = frozenset()
    """Entries of the folder that were created, written, renamed in or out, or deleted."""
    moved_in: frozenset[str] = frozenset()
    """The subset renamed in (``IN_MOVED_TO``): complete once confirmed."""
    overflow: bool = False
    """The kernel dropped events: names are missing, only a full scan knows."""
    gone: bool = False
    """The watch ended: the folder was deleted or moved away."""


def parse_events(data: bytes) -> InotifyBatch:
    """The batch one ``read`` of an inotify fd holds."""
    changed: set[str] = set()
    moved_in: set[str] = set()
    overflow = gone = False
    offset = 0
    while offset + _HEADER.size <= len(data):
        _, mask, _, length = _HEADER.unpack_from(data, offset)
        raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
        offset += _HEADER.size + length
        overflow = overflow or bool(mask & _IN_Q_OVERFLOW)
        gone = gone or bool(mask & _GONE)
        name = os.fsdecode(raw.rstrip(b"\0"))
        if name:
            changed.add(name)
            if mask & _IN_MOVED_TO:
                moved_in.add(name)
    return InotifyBatch(frozenset(changed), frozenset(moved_in), overflow, gone)


@final
class InboxInotify:
    """One inotify instance watching one folder's entries; close it when done."""

    __slots__ = ("_fd", "folder")

    def __init__(self, fd: int, folder: Path) -> None:
        self._fd = fd
        self.folder = folder

    @classmethod
    def open(cls, folder: Path) -> InboxInotify | None:
        """Watch ``folder``; None where inotify is unavailable. Raises ``OSError`` on other failures
        (the per-user limits on instances and watches: ``EMFILE``, ``ENOSPC``)."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EINVAL):
                return None
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        mask = _WATCHED | _IN_ONLYDIR | _IN_DONT_FOLLOW | _IN_EXCL_UNLINK
        if _LIBC.inotify_add_watch(fd, os.fsencode(folder), mask) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch: {os.strerror(err)}", str(folder))
        return cls(fd, folder)

    async def next_batch(self) -> InotifyBatch:
        """Wait until something happened; then all the events queued by now, as one batch."""
        while True:
            await anyio.wait_readable(self._fd)
            batch = self.read_now()
            if batch.changed or batch.overflow or batch.gone:
                return batch

    def read_now(self) -> InotifyBatch:
        """Every event queued now (none: an empty batch), without waiting."""
        changed: set[str] = set()
        moved_in: set[str] = set()
        overflow = gone = False
        while True:
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                break
            batch = parse_events(data)
            changed |= batch.changed
            moved_in |= batch.moved_in
            overflow = overflow or batch.overflow
            gone = gone or batch.gone
        return InotifyBatch(frozenset(changed), frozenset(moved_in), overflow, gone)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> InboxInotify:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
