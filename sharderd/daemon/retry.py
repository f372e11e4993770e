"""Bring a failed job back into the inbox: ``sharderd retry NAME``.

It moves the input of ``failed/NAME/`` (the model file or folder, and
an inbox-style sidecar ``<name>.toml``) back into the inbox: the sidecar first, then the model,
each with one rename that never replaces anything, so the daemon sees a complete job arrive. What
stays behind (``error.json``, ``error.md``, the reports) is removed with the emptied folder: the
journal keeps the failed run's error under its old job id, which ``retry`` prints. A folder that
holds anything else is left in place, and said so.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sharderd.daemon.control import JobNotFoundError
from sharderd.daemon.intake import inspect_entry
from sharderd.daemon.outbox import rename_unique
from sharderd.errors import ConfigError

__all__ = ["RetryResult", "retry_failed"]

_LEFT_BEHIND: Final = frozenset(
    {"error.json", "error.md", "report.json", "report.md", "report.html"}
)
"""What a failed job's folder holds besides its input; removed by ``retry``."""


@dataclass(frozen=True, slots=True)
class RetryResult:
    """What ``retry_failed`` did."""

    name: str
    """The job name the daemon will see."""
    moved: tuple[Path, ...]
    """The inbox entries created (sidecar first)."""
    old_job_id: str | None
    """The failed run's job id (from ``error.json``): its journal record keeps the error."""
    reason: str | None
    """Why it failed last time."""
    left: Path | None
    """The failed folder, when it held files ``retry`` does not know and so was kept."""


def retry_failed(failed_dir: Path, inbox: Path, name: str) -> RetryResult:
    """Move ``failed_dir/name``'s input back into ``inbox``; see the module docstring.

    Raises:
        JobNotFoundError: No such failed job, or it holds no input.
        ConfigError: The inbox already has an entry of that job's name.
    """
    folder = failed_dir / name
    if (
        not name
        or "/" in name
        or name.startswith(".")
        or not folder.is_dir()
        or folder.is_symlink()
    ):
        known = (
            sorted(
                p.name for p in failed_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
            )
            if failed_dir.is_dir()
            else []
        )
        listing = ", ".join(known[:20]) + (
            f" and {len(known) - 20} more" if len(known) > 20 else ""
        )
        raise JobNotFoundError(
            f"no failed job named {name!r} in {failed_dir}",
            hint=f"Failed jobs: {listing}." if known else "There are no failed jobs.",
        )
    candidates = [
        c
        for c in (inspect_entry(folder, e.name) for e in sorted(folder.iterdir()))
        if c is not None
    ]
    if len(candidates) != 1:
        what = (
            "no model"
            if not candidates
            else f"{len(candidates)} inputs ({', '.join(c.path.name for c in candidates)})"
        )
        raise JobNotFoundError(
            f"{folder} holds {what}; move what should run into the inbox by hand"
        )
    job = candidates[0]
    outside_sidecar = (
        job.sidecar if job.sidecar is not None and job.sidecar.parent == folder else None
    )
    taken = [
        p.name
        for p in (inbox / job.path.name, inbox / job.raw_name, inbox / f"{job.raw_name}.toml")
        if os.path.lexists(p)
    ]
    if taken:
        raise ConfigError(
            f"the inbox already has {', '.join(sorted(set(taken)))}: retrying {name} would mix two jobs",
            hint="Wait until that job is claimed, or move it away, then retry.",
        )
    error = _read_error(folder)
    moved: list[Path] = []
    try:
        for src in (outside_sidecar, job.path):
            if src is not None:
                moved.append(_move_in(src, inbox))
    except BaseException:
        for path in reversed(moved):  # put the sidecar back: no half job left in the inbox
            with contextlib.suppress(OSError):
                rename_unique(path, folder, path.name)
        raise
    return RetryResult(
        job.name, tuple(moved), _str(error.get("job_id")), _str(error.get("reason")), _clear(folder)
    )


def _move_in(src: Path, inbox: Path) -> Path:
    """Rename ``src`` into ``inbox`` under its own name, never replacing an entry that appeared meanwhile."""
    dest = rename_unique(src, inbox, src.name)
    if dest.name != src.name:  # someone dropped the same name just now: undo, refuse
        rename_unique(dest, src.parent, src.name)
        raise ConfigError(f"{inbox / src.name} appeared while retrying; nothing was moved for it")
    return dest


def _read_error(folder: Path) -> Mapping[str, Any]:
    try:
        data = json.loads((folder / "error.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def _clear(folder: Path) -> Path | None:
    """Remove what a failed job leaves besides its input; None when the folder is gone."""
    for entry in folder.iterdir():
        if entry.name in _LEFT_BEHIND:
            entry.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        return folder
    return None
