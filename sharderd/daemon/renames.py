"""The kernel's word that an inbox entry was renamed in: inotify ``IN_MOVED_TO`` on the inbox.

watchfiles folds ``IN_CREATE`` and ``IN_MOVED_TO`` into one ``added`` change, so its events cannot
tell a file renamed in (complete: the rename is the writer's "done") from one being written in
place. Timestamps cannot either: a ``cp x .x.part && mv .x.part x`` within one clock tick leaves
ctime equal to mtime. ``IN_MOVED_TO`` is raised by exactly one thing, a rename whose target is in
the watched folder, whether the source was a staging name in the inbox (``.x.onnx.part`` → ``x.onnx``)
or a path elsewhere on the filesystem. This module reads only that event, non-recursively, on its
own inotify instance (Linux); ``RenameWatch.open`` returns None where inotify is unavailable, and
jobs then simply settle for ``settle_seconds``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path
from typing import Final, final

import anyio

__all__ = ["RenameWatch", "parse_events"]

_IN_MOVED_TO: Final = 0x00000080
_IN_Q_OVERFLOW: Final = 0x00004000
_IN_IGNORED: Final = 0x00008000
_IN_ONLYDIR: Final = 0x01000000
_IN_DONT_FOLLOW: Final = 0x02000000
_IN_NONBLOCK: Final = os.O_NONBLOCK
_IN_CLOEXEC: Final = os.O_CLOEXEC
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


def parse_events(data: bytes) -> tuple[list[str], bool, bool]:
    """``(names moved in, queue overflowed, watch gone)`` from one ``read`` of an inotify fd."""
    names: list[str] = []
    overflow = gone = False
    offset = 0
    while offset + _HEADER.size <= len(data):
        _, mask, _, length = _HEADER.unpack_from(data, offset)
        raw = data[offset + _HEADER.size : offset + _HEADER.size + length]
        offset += _HEADER.size + length
        overflow = overflow or bool(mask & _IN_Q_OVERFLOW)
        gone = gone or bool(mask & _IN_IGNORED)
        if mask & _IN_MOVED_TO:
            names.append(os.fsdecode(raw.rstrip(b"\0")))
    return names, overflow, gone


@final
class RenameWatch:
    """One inotify instance watching ``IN_MOVED_TO`` on one folder; close it when done."""

    __slots__ = ("_fd", "folder")

    def __init__(self, fd: int, folder: Path) -> None:
        self._fd = fd
        self.folder = folder

    @classmethod
    def open(cls, folder: Path) -> RenameWatch | None:
        """Watch ``folder``; None where inotify is unavailable. Raises ``OSError`` on other failures."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOSYS, errno.EINVAL):
                return None
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        mask = _IN_MOVED_TO | _IN_ONLYDIR | _IN_DONT_FOLLOW
        if _LIBC.inotify_add_watch(fd, os.fsencode(folder), mask) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch: {os.strerror(err)}", str(folder))
        return cls(fd, folder)

    async def next_batch(self) -> list[Path] | None:
        """Wait for renames; the entries renamed in, or None once the watch is gone (folder deleted)."""
        while True:
            await anyio.wait_readable(self._fd)
            try:
                data = os.read(self._fd, _READ_BYTES)
            except BlockingIOError:
                continue
            names, _, gone = parse_events(data)  # an overflow loses hints only: those jobs settle
            if names or gone:
                return None if gone and not names else [self.folder / n for n in names]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RenameWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
