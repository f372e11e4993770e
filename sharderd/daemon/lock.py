"""One daemon per ``state_dir``: an ``flock`` held for the daemon's life.

Two daemons claiming from one inbox would each trust a rename to be exactly-once, which a network
filesystem does not promise (a lost and resent rename reply, attribute caching). The supported
topology is one claiming daemon per inbox and state_dir; more hosts join as Ray workers. The lock
is released by the kernel when the process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Final

from sharderd.errors import ConfigError

__all__ = ["LOCK_NAME", "StateLock"]

LOCK_NAME: Final = "daemon.lock"


class StateLock:
    """Hold ``state_dir/daemon.lock`` or refuse to start, naming the daemon that holds it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, state_dir: Path) -> StateLock:
        """Take the lock and write our pid into it.

        Raises:
            ConfigError: Another daemon holds it (the message names its pid).
        """
        path = state_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise ConfigError(
                f"another sharderd daemon{f' (pid {holder})' if holder else ''} already runs on state_dir "
                f"{state_dir}: one daemon per state_dir and inbox",
                hint="Stop it first (`systemctl stop sharderd`), or give this one its own inbox, outbox and "
                "state_dir. To add compile capacity, join more hosts as Ray workers instead ([cluster] "
                "in docs/daemon.md).",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _read(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        return str(int(os.pread(fd, 32, 0).decode().strip()))
    return ""
