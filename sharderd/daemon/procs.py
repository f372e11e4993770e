"""The daemon's processes: kill its children on a forced stop, and what a killed daemon left behind.

Planning workers and attempts each lead their own process group (``start_new_session``), so
killing a child means killing its group. The process table comes from ``sharderd.procfs``, the
parser the attempt pool uses too.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from sharderd.procfs import PROC, processes

__all__ = ["kill_children", "kill_strays"]


def kill_children() -> None:
    """SIGKILL the process group of every child: planning workers and attempts lead their own."""
    me = os.getpid()
    for proc in list(processes()):
        if proc.ppid == me:
            _kill_group(proc.pid, proc.pgrp)


def kill_strays(processing: Path) -> list[int]:
    """SIGKILL attempts an earlier, killed daemon left running (their cwd is in ``processing/``).

    Under systemd the cgroup is emptied when the daemon dies; started by hand, an orphaned compile
    would keep its device and CPU, and keep writing into a job folder this run is about to reuse.
    """
    inside = str(processing) + os.sep
    killed = []
    for proc in list(processes()):
        try:
            cwd = str((PROC / str(proc.pid) / "cwd").readlink())
        except OSError:
            continue
        if cwd.startswith(inside):
            _kill_group(proc.pid, proc.pgrp)
            killed.append(proc.pid)
    return killed


def _kill_group(pid: int, pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pgid == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
