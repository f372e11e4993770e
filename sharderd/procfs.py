"""The process table as ``/proc/<pid>/stat`` tells it: one parser for whoever must find processes.

The attempt pool asks whether a process group still has live members; the daemon finds its own
children and the attempts an earlier, killed daemon left behind. Both read the same fields, so
both read them here. Linux only: without ``/proc`` the table is empty.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["PROC", "ProcStat", "processes", "read_stat", "resident_bytes"]

PROC: Final = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` line that sharderd acts on."""

    pid: int
    state: str
    """``R``, ``S``, ``D``, ``Z`` (zombie awaiting its reaper), ``X`` (dead), ..."""
    ppid: int
    pgrp: int
    start_ticks: int | None
    """When it started, in clock ticks since boot (field 22): with the pid, names one process."""


def read_stat(pid: int | str) -> ProcStat | None:
    """One process's fields; None when it is gone (or its line cannot be read)."""
    try:
        with open(PROC / str(pid) / "stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses; the fields after the last ")" are fixed.
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 3:
        return None
    start = int(fields[19]) if len(fields) >= 20 else None
    return ProcStat(int(pid), fields[0], int(fields[1]), int(fields[2]), start)


def processes() -> Iterator[ProcStat]:
    """Every process in ``/proc``; ones vanishing meanwhile are skipped."""
    try:
        entries = list(os.scandir(PROC))
    except OSError:
        return
    for entry in entries:
        if entry.name.isdigit() and (found := read_stat(entry.name)) is not None:
            yield found


_PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int | None:
    """The process's resident memory now (``/proc/<pid>/statm``, field 2); None when it is gone."""
    try:
        with open(PROC / str(pid) / "statm", encoding="ascii") as f:
            fields = f.read().split()
    except OSError:
        return None
    return int(fields[1]) * _PAGE if len(fields) >= 2 else None
