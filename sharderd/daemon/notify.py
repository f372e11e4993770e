"""sd_notify in pure Python: readiness, status and watchdog pings to systemd over ``$NOTIFY_SOCKET``.

No libsystemd: the protocol is one ``KEY=VALUE`` line per field in a single datagram to an
``AF_UNIX``/``SOCK_DGRAM`` socket, named by a path or, with a leading ``@``, in the abstract
namespace. The socket is non-blocking: a full receive queue is a failed send, never a stalled event
loop. Notification is best effort: without ``$NOTIFY_SOCKET`` every call is a no-op, and a failed
send is logged once (``notify.failed``) and otherwise ignored, because the daemon's work does not
depend on systemd hearing about it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import final

from sharderd.logs import get_logger

__all__ = ["Notifier", "watchdog_interval"]

_log = get_logger(__name__)


@final
class Notifier:
    """Sends sd_notify messages; ``address=None`` reads ``$NOTIFY_SOCKET``, ``""`` disables it."""

    __slots__ = ("_address", "_failed", "_sock")

    def __init__(self, address: str | None = None) -> None:
        raw = os.environ.get("NOTIFY_SOCKET", "") if address is None else address
        self._address = "\0" + raw[1:] if raw.startswith("@") else raw
        self._sock: socket.socket | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def ready(self, status: str | None = None) -> bool:
        return self.send("READY=1", *_status(status))

    def status(self, text: str) -> bool:
        return self.send(*_status(text))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        return self.send("STOPPING=1", *_status(status))

    def extend_timeout(self, usec: int) -> bool:
        """Ask for ``usec`` more microseconds to start up or shut down (drain mode)."""
        return self.send(f"EXTEND_TIMEOUT_USEC={max(int(usec), 0)}")

    def send(self, *fields: str) -> bool:
        """Send one datagram; True when it was handed to the socket."""
        if not self._address:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(fields).encode(errors="replace"), self._address)
        except OSError as exc:
            self.close()
            if not self._failed:
                self._failed = True
                _log.warning(
                    "notify.failed", socket=self._address.replace("\0", "@"), error=str(exc)
                )
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status(text: str | None) -> tuple[str, ...]:
    return () if text is None else ("STATUS=" + " ".join(text.splitlines()),)


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), None when not requested.

    ``WATCHDOG_PID`` naming another process means the watchdog is not ours (we were started by a
    process that was itself supervised), so we do not ping.
    """
    env = os.environ if env is None else env
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID", "")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2 / 1_000_000
