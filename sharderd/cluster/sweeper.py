"""Kill attempt process groups whose Ray worker died: what a crashed raylet leaves behind.

``run_process`` kills an attempt's group on every way out it sees, but a Ray worker that is
SIGKILLed (its raylet crashed, ``ray.cancel(force=True)``, the OOM killer) runs no ``finally``, and
the attempt lives on in its own session. So each task records its attempt's group in a node-local
``sweep_dir`` (``<pgid>.json``: the group and the worker that owns it, by pid and start time), and a
sweeper on that node SIGKILLs every recorded group whose owner is gone.

The sweeper is ``python -m sharderd.cluster.sweeper SWEEP_DIR``: at most one per ``sweep_dir`` (an
``flock``), started detached by every task (it then outlives the raylet), polling twice a second
and exiting after a minute with nothing recorded. ``--once`` sweeps once and exits (for a timer).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import anyio

from sharderd.fsutil import atomic_write
from sharderd.procfs import read_stat

__all__ = [
    "LOCK_NAME",
    "ensure_sweeper",
    "main",
    "register",
    "start_time",
    "sweep_once",
    "sweeper_pid",
    "unregister",
]

LOCK_NAME: Final = "sweeper.lock"
_POLL_S: Final = 0.5
_IDLE_EXIT_S: Final = 60.0


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None."""
    proc = read_stat(pid)
    if proc is None or proc.state in "ZX":
        return None
    return proc.start_ticks


def register(sweep_dir: Path, pgid: int, owner: int) -> Path:
    """Record that ``owner`` (this Ray worker) runs the attempt group ``pgid``."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    entry = sweep_dir / f"{pgid}.json"
    record = {
        "pgid": pgid,
        "owner": owner,
        "owner_start": start_time(owner),
        "leader_start": start_time(pgid),
    }
    atomic_write(entry, json.dumps(record), durable=False)
    return entry


def unregister(entry: Path) -> None:
    entry.unlink(missing_ok=True)


def sweep_once(sweep_dir: Path) -> list[int]:
    """SIGKILL every recorded group whose owner is gone; return those groups."""
    killed = []
    for entry in sorted(sweep_dir.glob("*.json")) if sweep_dir.is_dir() else ():
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
            pgid, owner = int(data["pgid"]), int(data["owner"])
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        if data.get("owner_start") is not None and start_time(owner) == data["owner_start"]:
            continue  # its worker still runs it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
            killed.append(pgid)
        entry.unlink(missing_ok=True)
    return killed


def ensure_sweeper(sweep_dir: Path) -> None:
    """Start the node's sweeper, detached, unless one already holds the lock."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if _lock_held(sweep_dir / LOCK_NAME):
        return
    # The sweeper forks once and its parent exits at once, so nothing waits on it here.
    subprocess.run(
        [sys.executable, "-m", "sharderd.cluster.sweeper", str(sweep_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        check=False,
    )


def sweeper_pid(sweep_dir: Path) -> int | None:
    """The pid of the sweeper holding ``sweep_dir``'s lock, or None when none runs."""
    path = sweep_dir / LOCK_NAME
    if not path.exists() or not _lock_held(path):
        return None
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


def _lock_held(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


async def _loop(sweep_dir: Path) -> None:
    idle_since = anyio.current_time()
    while True:
        sweep_once(sweep_dir)
        if any(sweep_dir.glob("*.json")):
            idle_since = anyio.current_time()
        elif anyio.current_time() - idle_since > _IDLE_EXIT_S:
            return
        await anyio.sleep(_POLL_S)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    once = "--once" in args
    args = [a for a in args if a != "--once"]
    if len(args) != 1:
        print("usage: python -m sharderd.cluster.sweeper [--once] SWEEP_DIR", file=sys.stderr)
        return 2
    sweep_dir = Path(args[0])
    sweep_dir.mkdir(parents=True, exist_ok=True)
    if once:
        for pgid in sweep_once(sweep_dir):
            print(f"killed attempt process group {pgid}")
        return 0
    if os.fork() != 0:
        os._exit(0)  # detach: the caller returns at once, init (or a subreaper) reaps us
    fd = os.open(sweep_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another sweeper has this folder
    os.ftruncate(fd, 0)
    os.pwrite(
        fd, f"{os.getpid()}\n".encode(), 0
    )  # who holds it, for an operator (or a test) to stop
    anyio.run(_loop, sweep_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
