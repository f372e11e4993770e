"""``sharderd status``: is the daemon alive, and what is it doing, from files alone (no port).

The daemon rewrites ``status.json`` (0644) in its runtime folder at least every
``heartbeat_interval_s``; it is *stale* when its pid is gone or its heartbeat is older than twice
that, which catches a hung event loop as well as a ``kill -9``. The counts of the last 24 h come
from ``status.json`` while the daemon is up; otherwise from the journal, when this user may read
it (after a crash that is the only source).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from sharderd.config import Config, DaemonConfig, load_config
from sharderd.daemon.dirs import runtime_dir
from sharderd.daemon.status import STATUS_FILE, recent_outcomes
from sharderd.errors import SharderdError

__all__ = ["OPS_CONFIG", "DaemonStatus", "ops_config", "read_status", "render_text", "status_json"]

OPS_CONFIG: Final = Path("/etc/sharderd/sharderd.toml")
"""The config ``status``, ``retry`` and ``cancel`` read without ``--config`` when it exists: the unit's."""
_OUTCOMES: Final = ("succeeded", "failed", "duplicate", "cancelled")


def ops_config(path: Path | None) -> Config:
    """``path``, else the unit's config when it exists, else the built-in defaults."""
    return load_config(path or (OPS_CONFIG if OPS_CONFIG.is_file() else None))


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """What ``status`` found: the daemon's own report, and the verdict on it."""

    path: Path
    """The ``status.json`` read (or looked for)."""
    up: bool
    problem: str | None
    """Why the daemon is not up: ``stale: ...``, ``stopped ...``, ``not running: ...``."""
    report: Mapping[str, Any] | None
    """``status.json`` as the daemon wrote it; None when there is none."""
    heartbeat_age_s: float | None
    last_24h: Mapping[str, int] | None
    last_24h_source: str | None
    """``daemon`` (``status.json``) or ``journal``."""
    hint: str | None = None
    """What to try when nothing was found: usually ``--config``, when the built-in defaults were read."""


def read_status(config: Config, now: float | None = None) -> DaemonStatus:
    """Read and judge ``status.json``.

    Raises:
        SharderdError: It exists but this user may not read it.
    """
    t = time.time() if now is None else now
    daemon = config.daemon
    path = runtime_dir(daemon) / STATUS_FILE
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        found = _verdict(path, None, f"not running: there is no {path}", None, daemon, t)
        return replace(found, hint=_config_hint(config))
    except PermissionError:
        raise SharderdError(
            f"cannot read {path}: permission denied",
            hint="Run as the daemon's user or root; an older daemon wrote it 0640 (restarting it fixes that).",
        ) from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return _verdict(path, None, f"unknown: {path} is unreadable ({exc})", None, daemon, t)
    age = _age(report.get("heartbeat"), t)
    interval = float(report.get("heartbeat_interval_s") or 15.0)
    pid = report.get("pid")
    problem = None
    if report.get("state") == "stopped":
        problem = f"stopped: the daemon (pid {pid}) exited cleanly at {report.get('heartbeat')}"
    elif not isinstance(pid, int) or not _alive(pid):
        problem = f"stale: pid {pid} is gone; last heartbeat {_span(age)} ago"
    elif age is None or age > 2 * interval:
        problem = (
            f"stale: pid {pid} runs but its last heartbeat was {_span(age)} ago "
            f"(expected every {interval:g} s): its event loop is stuck"
        )
    return _verdict(path, report, problem, age, daemon, t)


def _config_hint(config: Config) -> str | None:
    """Without ``--config`` (and no ``/etc/sharderd/sharderd.toml``) the default folders were read, which
    a daemon started with its own file does not use: say so, with the file in this folder if there is one."""
    if config.source is not None:
        return None
    here = Path("sharderd.toml")
    example = f": `sharderd status --config {here}`" if here.is_file() else ""
    return (
        f"No --config was given and {OPS_CONFIG} does not exist, so these are the built-in default folders. "
        f"If the daemon runs with its own sharderd.toml, pass it with --config FILE{example}."
    )


def _verdict(
    path: Path,
    report: Mapping[str, Any] | None,
    problem: str | None,
    age: float | None,
    daemon: DaemonConfig,
    now: float,
) -> DaemonStatus:
    recent, source = None, None
    if problem is None and report is not None and isinstance(report.get("last_24h"), Mapping):
        recent, source = dict(report["last_24h"]), "daemon"
    else:
        journal = daemon.state_dir.absolute() / "journal"
        try:
            if (
                journal.is_dir()
            ):  # no journal, no counts: "0 succeeded" would be a claim about nothing
                counts = Counter(state for _, state in recent_outcomes(journal, now))
                recent, source = {o: counts[o] for o in _OUTCOMES}, "journal"
        except PermissionError:
            pass
    return DaemonStatus(path, problem is None, problem, report, age, recent, source)


def status_json(status: DaemonStatus) -> dict[str, Any]:
    """``status --json``: the verdict, with ``status.json`` as the daemon wrote it under ``daemon``."""
    return {
        "up": status.up,
        "problem": status.problem,
        "status_file": str(status.path),
        "heartbeat_age_s": None
        if status.heartbeat_age_s is None
        else round(status.heartbeat_age_s, 3),
        "last_24h": status.last_24h,
        "last_24h_source": status.last_24h_source,
        "hint": status.hint,
        "daemon": status.report,
    }


def render_text(status: DaemonStatus, now: float | None = None) -> str:
    """The report for a terminal: verdict, queue, pool, then one line per running and pending job."""
    t = time.time() if now is None else now
    r = status.report or {}
    version = r.get("version", "")
    if status.up:
        lines = [
            f"sharderd {version} is up: pid {r.get('pid')}, {r.get('state')} since {r.get('since')} "
            f"({_span(_age(r.get('since'), t))}), heartbeat {_span(status.heartbeat_age_s)} ago"
        ]
    else:
        lines = [f"sharderd is not up: {status.problem}"]
        if status.hint:
            lines.append(status.hint)
        if status.report is not None:
            lines.append(
                f"last report (sharderd {version}, pid {r.get('pid')}, up since {r.get('since')}):"
            )
    if status.report is not None:
        queue, pool = r.get("queue") or {}, r.get("pool") or {}
        lines.append(
            f"queue: {queue.get('pending', 0)} pending, {queue.get('running', 0)} processing"
        )
        waiting = int(pool.get("waiting", 0))
        lines.append(
            f"pool: {pool.get('busy', 0)} of {pool.get('max_parallel', '?')} attempt slots busy, "
            f"{waiting} attempt{'' if waiting == 1 else 's'} waiting for one"
        )
        results = r.get("results")
        if isinstance(results, Mapping):
            shown = ", ".join(f"{n} {status}" for status, n in results.items())
            lines.append(f"succeeded since start, by what proved them: {shown}")
    if status.last_24h is not None:
        counts = ", ".join(f"{status.last_24h.get(o, 0)} {o}" for o in _OUTCOMES)
        lines.append(
            f"last 24 h: {counts}"
            + (" (from the journal)" if status.last_24h_source == "journal" else "")
        )
    running = [j for j in r.get("running") or () if isinstance(j, Mapping)]
    if running:
        lines += ["", "processing:"]
        rows = [("job id", "name", "stage", "attempts", "for")]
        for job in running:
            stage = str(job.get("stage")) + (" (cancelling)" if job.get("cancelling") else "")
            attempts = f"{job.get('attempts', 0)} ({job.get('attempts_running', 0)} running)"
            rows.append(
                (
                    str(job.get("job_id")),
                    str(job.get("name")),
                    stage,
                    attempts,
                    _span(_age(job.get("started"), t)),
                )
            )
        lines += _table(rows)
    pending = [j for j in r.get("pending_jobs") or () if isinstance(j, Mapping)]
    if pending:
        more = int((r.get("queue") or {}).get("pending", 0)) - len(pending)
        lines += ["", "pending:" + (f" (first {len(pending)}, {more} more)" if more > 0 else "")]
        lines += _table(
            [("job id", "name"), *((str(j.get("job_id")), str(j.get("name"))) for j in pending)]
        )
    return "\n".join(lines) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs and is a sharderd (a recycled pid running something else is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # /proc hides it (hidepid): trust the signal check
    return b"sharderd" in cmdline


def _age(stamp: object, now: float) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return now - dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def _span(seconds: float | None) -> str:
    """``4 s``, ``3m 12s``, ``2h 05m``, ``3d 4h``."""
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
