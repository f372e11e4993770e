"""The daemon's folders: created with ``dir_mode``, checked usable, on one filesystem.

Claiming a job and publishing a result are renames, atomic only within one filesystem, so the
inbox, ``state_dir`` and the outbox must share one; each must be writable by the daemon's user.
``status.json`` goes to ``runtime_dir``, else systemd's ``$RUNTIME_DIRECTORY``, else ``state_dir``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sharderd.config import DaemonConfig
from sharderd.errors import ConfigError
from sharderd.fsutil import make_dirs

__all__ = ["DaemonDirs", "check_layout", "check_same_filesystem", "prepare_dirs", "runtime_dir"]


def check_same_filesystem(inbox: Path, processing: Path, outbox: Path, *more: Path) -> None:
    """Refuse folders on different filesystems: claims and results are renames, atomic only within one."""
    paths = {"inbox": inbox, "processing": processing, "outbox": outbox} | {p.name: p for p in more}
    try:
        devices = {label: path.stat().st_dev for label, path in paths.items()}
    except OSError as exc:
        raise ConfigError(
            f"cannot check the filesystem of {exc.filename}: {exc.strerror}"
        ) from None
    if len(set(devices.values())) > 1:
        where = ", ".join(
            f"{label} {path} (device {os.major(devices[label])}:{os.minor(devices[label])})"
            for label, path in paths.items()
        )
        raise ConfigError(
            f"sharderd needs its folders on one filesystem, but they are not: {where}",
            hint="Claiming a job and publishing a result are renames, which are atomic only within one "
            "filesystem. Put inbox, outbox and state_dir on the same mount.",
        )


@dataclass(frozen=True, slots=True)
class DaemonDirs:
    """Every folder the daemon uses, created by ``prepare_dirs``."""

    inbox: Path
    outbox: Path
    state_dir: Path
    processing: Path
    """``state_dir/processing``: claimed jobs, one ``<job_id>/`` each."""
    failed: Path
    done: Path
    journal: Path
    index: Path
    """``state_dir/index``: content hash → first result, for duplicate detection."""
    runtime: Path
    """Where ``status.json`` goes."""


def prepare_dirs(config: DaemonConfig, *, create_inbox: bool = True) -> DaemonDirs:
    """Create every folder (mode ``dir_mode``) and check it is usable; ``ConfigError`` names the path."""
    state = config.state_dir
    runtime = runtime_dir(config)
    dirs = DaemonDirs(
        inbox=config.inbox,
        outbox=config.outbox,
        state_dir=state,
        processing=state / "processing",
        failed=state / "failed",
        done=state / "done",
        journal=state / "journal",
        index=state / "index",
        runtime=runtime,
    )
    check_layout(config)
    if not create_inbox and not config.inbox.is_dir():
        raise ConfigError(f"inbox {config.inbox} does not exist or is not a directory")
    for label in (
        "inbox",
        "outbox",
        "state_dir",
        "processing",
        "failed",
        "done",
        "journal",
        "index",
        "runtime",
    ):
        _ensure_dir(getattr(dirs, label), config.dir_mode, label)
    check_same_filesystem(dirs.inbox, dirs.processing, dirs.outbox, dirs.failed, dirs.done)
    return dirs


def runtime_dir(config: DaemonConfig) -> Path:
    """Where ``status.json`` lives: ``runtime_dir``, else ``$RUNTIME_DIRECTORY``, else ``state_dir``."""
    env = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return (config.runtime_dir or (Path(env) if env else config.state_dir)).absolute()


def check_layout(dirs: DaemonConfig) -> None:
    """Inbox and outbox apart, neither inside the other, and ``state_dir`` outside the inbox."""
    inbox, outbox, state = (p.absolute() for p in (dirs.inbox, dirs.outbox, dirs.state_dir))
    if inbox == outbox or outbox.is_relative_to(inbox) or inbox.is_relative_to(outbox):
        raise ConfigError(
            f"inbox {dirs.inbox} and outbox {dirs.outbox} must be separate folders, neither inside the other"
        )
    if state.is_relative_to(inbox):
        raise ConfigError(f"state_dir {dirs.state_dir} must not be inside the inbox {dirs.inbox}")


def _ensure_dir(path: Path, mode: int, label: str) -> None:
    try:
        make_dirs(path, mode)  # each new folder fsynced in its parent: a power cut keeps it
    except FileExistsError:
        raise ConfigError(f"{label} {path} exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(
            f"cannot create {label} {path}: {exc.strerror}",
            hint="Create it, or make its parent writable by the sharderd user.",
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{label} {path} is not writable by this user (uid {os.getuid()})",
            hint="sharderd moves files in and out of it; give the sharderd user write access.",
        )
