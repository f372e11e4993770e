"""What one job's planning worker may spend: wall time answering, and resident memory.

The daemon gives each job's ``WorkerSession`` its ``[daemon] planning_timeout`` and
``planning_memory_bytes``. Time is the wall time the worker spends answering the job's requests,
summed over them (its idle time while compiles run does not count); memory is the worker's
resident set, read from ``/proc`` every ``MEMORY_SAMPLE_S`` while it answers. Past either, the
session kills the worker and the job fails with reason ``planning_limit``, naming the limit and the
key that raises it. A one-shot CLI run plans in its own process and has no such limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import anyio

from sharderd.errors import PlanningLimitError
from sharderd.procfs import resident_bytes
from sharderd.units import fmt_bytes

__all__ = ["MEMORY_SAMPLE_S", "MemoryWatch", "PlanningLimits"]

MEMORY_SAMPLE_S: Final = 0.1
"""Seconds between two readings of the worker's resident memory: the worker can go past the limit
by what it allocates in this time before it is stopped."""


@dataclass(frozen=True, slots=True)
class PlanningLimits:
    """The limits of one job's planning worker, and where they were set (for the hint)."""

    seconds: float
    """Wall seconds the worker may spend answering, summed over the job (``planning_timeout``)."""
    memory_bytes: int
    """Resident memory the worker may hold (``planning_memory_bytes``); 0: no limit."""
    config_file: str | None = None
    """The daemon's configuration file, named in the hint; None: it runs on defaults."""

    def time_error(self, model: str, spent: float) -> PlanningLimitError:
        return PlanningLimitError(
            f"planning {model} took longer than its {self.seconds:g} s limit "
            f"([daemon] planning_timeout); the planning worker was stopped after {spent:.1f} s",
            hint=self._hint("planning_timeout", f"{self.seconds:g} s", "longer"),
            limit="time",
            key="planning_timeout",
            allowed=self.seconds,
            used=round(spent, 3),
        )

    def memory_error(self, model: str, used: int) -> PlanningLimitError:
        return PlanningLimitError(
            f"planning {model} used {fmt_bytes(used)} of memory, more than its "
            f"{fmt_bytes(self.memory_bytes)} limit ([daemon] planning_memory_bytes = "
            f"{self.memory_bytes}); the planning worker was stopped",
            hint=self._hint("planning_memory_bytes", str(self.memory_bytes), "more memory"),
            limit="memory",
            key="planning_memory_bytes",
            allowed=self.memory_bytes,
            used=used,
        )

    def _hint(self, key: str, now: str, what: str) -> str:
        where = (
            f"in the [daemon] table of {self.config_file}"
            if self.config_file
            else "in the [daemon] table of the daemon's configuration file"
        )
        return (
            f"If the model really needs {what}, raise {key} {where} (now {now}), restart the daemon "
            "(`systemctl restart sharderd` under systemd), then retry the job with the command below."
        )


class MemoryWatch:
    """Reads a process's resident memory while it works; over the limit, cancels ``scope``."""

    def __init__(self, pid: int, limit: int) -> None:
        self.pid = pid
        self.limit = limit
        self.over: int | None = None
        """The reading that went past the limit, once one did."""

    async def run(self, scope: anyio.CancelScope) -> None:
        while True:
            used = resident_bytes(self.pid)
            if used is not None and used > self.limit:
                self.over = used
                scope.cancel()
                return
            await anyio.sleep(MEMORY_SAMPLE_S)
