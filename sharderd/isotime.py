"""Timestamps as the daemon writes them: UTC ISO 8601 with milliseconds, like the log's ``ts``."""

from __future__ import annotations

import time

__all__ = ["iso_time"]


def iso_time(t: float) -> str:
    """``2025-01-31T12:00:00.123Z`` for the Unix time ``t``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
