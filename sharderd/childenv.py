"""The environment of a child process (planning worker, compile attempt), without systemd's own.

systemd hands ``NOTIFY_SOCKET`` and the watchdog variables to the daemon alone: a child that
inherited them could send ``READY=1`` or watchdog pings in the daemon's name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

__all__ = ["SYSTEMD_ONLY_ENV", "child_env"]

SYSTEMD_ONLY_ENV: Final = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default ``os.environ``) without :data:`SYSTEMD_ONLY_ENV`."""
    source = os.environ if env is None else env
    return {key: value for key, value in source.items() if key not in SYSTEMD_ONLY_ENV}
