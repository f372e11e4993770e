"""Files that readers never see torn, and folder entries that survive a power cut.

One way to replace a file for everyone who writes one: the model and its reports, the job
journal, ``status.json``, the metrics textfile, an attempt's outcome, a cancel request. A low
level helper with no sharderd imports, so the engine may use it too.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import TypedDict, Unpack

__all__ = [
    "WriteOptions",
    "atomic_write",
    "copy_synced",
    "fsync_dir",
    "make_dirs",
    "os_error_advice",
    "write_temp",
]

_TEMP_NAME_ROOM = 255 - len(".") - len(".01234567.tmp")
"""Bytes of the final name a temp file's name keeps: it fits in 255 whatever the final name."""


class WriteOptions(TypedDict, total=False):
    """How ``write_temp`` writes (and so ``atomic_write``); see ``write_temp``."""

    mode: int
    exact_mode: bool
    durable: bool


def atomic_write(path: Path, data: bytes | str, **options: Unpack[WriteOptions]) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, never a part.

    ``write_temp``, then a rename; when ``durable`` (the default) the folder is fsynced after it,
    so the new entry survives a crash. On any failure the temp file is removed.
    """
    tmp = write_temp(path, data, **options)
    try:
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if options.get("durable", True):
        fsync_dir(path.parent)


def write_temp(
    path: Path,
    data: bytes | str,
    *,
    mode: int = 0o666,
    exact_mode: bool = False,
    durable: bool = True,
) -> Path:
    """A new file beside ``path`` holding ``data``, to be renamed or linked onto ``path``.

    Its dotfile name is unique, so two writers never share one; on any failure (disk full) it is
    removed, so none is left for the next write to trip on.

    Args:
        mode: Permission bits, less the umask (as ``open`` does) unless ``exact_mode``: then
            exactly these, whatever the umask.
        durable: fsync the data; off for files rewritten within seconds (status, metrics).
    """
    # its name bounded: a name near the filesystem's 255 bytes must not fail for its temp file
    head = os.fsencode(path.name)[:_TEMP_NAME_ROOM]
    tmp = path.with_name(os.fsdecode(b".%s.%s.tmp" % (head, secrets.token_hex(4).encode())))
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with open(fd, "wb") as f:
            if exact_mode:
                os.fchmod(fd, mode)
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename, a new file) survive a power cut."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_synced(src: Path, dst: Path, *, mode: int) -> None:
    """Copy ``src``'s bytes to a new ``dst`` with exactly ``mode``, fsynced (not its folder)."""
    with open(src, "rb") as f:
        data = f.read()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with open(fd, "wb") as out:
        os.fchmod(fd, mode)
        out.write(data)
        out.flush()
        os.fsync(fd)


def make_dirs(path: Path, mode: int) -> None:
    """``mkdir -p`` whose every new folder survives a power cut: each is fsynced in its parent.

    Nothing happens when ``path`` is a folder already; ``FileExistsError`` when it is something
    else, ``NotADirectoryError`` when one of its parents is (as ``Path.mkdir(parents=True)``)."""
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            if not folder.is_dir():
                code = errno.EEXIST if folder == path else errno.ENOTDIR
                error = FileExistsError if folder == path else NotADirectoryError
                raise error(code, os.strerror(code), str(folder))
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:  # made meanwhile by someone else
            if not folder.is_dir():
                raise
            continue
        fsync_dir(folder.parent)


def os_error_advice(exc: OSError, where: str) -> str:
    """What to do about a failed write, by its ``errno`` (never by its text): a name too long is
    no matter of space or permissions."""
    if exc.errno == errno.ENAMETOOLONG:
        return (
            "a file name there is longer than the filesystem allows (255 bytes a name, 4096 a path): "
            "shorten the model's name or the folder's path"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free disk space on {where}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"give the sharderd user write access to {where}"
    return f"free space or fix permissions on {where}"
