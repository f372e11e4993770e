"""Streams an attempt's stderr from ``shared_dir`` into the daemon log while its Ray task runs.

The node writes the file; the driver tails it, so a cluster attempt logs like a local one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from sharderd.logs import get_logger

__all__ = ["StderrStream"]

_STDERR_LINES: Final = 2000
"""Stderr lines of one attempt streamed into the daemon log at most (the tail is in the report)."""

_log = get_logger(__name__)


class StderrStream:
    """Tails an attempt's ``stderr.log`` in ``shared_dir`` into ``attempt.stderr`` log lines."""

    def __init__(self, path: Path, attempt: str) -> None:
        self.path = path
        self.attempt = attempt
        self.offset = 0
        self.partial = b""
        self.lines = 0

    def poll(self, *, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except OSError:
            data = b""
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial:
            complete, self.partial = [*complete, self.partial], b""
        for raw in complete:
            if self.lines == _STDERR_LINES:
                _log.info(
                    "attempt.stderr",
                    attempt=self.attempt,
                    line=f"(more stderr not logged; first {_STDERR_LINES} lines above)",
                )
            self.lines += 1
            if self.lines <= _STDERR_LINES and raw.strip():
                _log.info(
                    "attempt.stderr", attempt=self.attempt, line=raw.decode(errors="replace")[:2000]
                )
