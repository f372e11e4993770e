"""Start-up checks and the state a daemon holds for its life, opened before any task exists.

A failure here is a plain ``ConfigError`` (exit 2, nothing claimed): what ``preflight`` refuses
(running as root without ``allow_root``, ``metrics_port`` without prometheus-client, ``auto`` on an
IPU target without poprt, ...), a folder that cannot be created or shared, another daemon on the
same ``state_dir`` (``daemon.lock``), a Ray cluster that cannot be joined.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sharderd.backends.ipus import IpuPool
from sharderd.backends.pool import AttemptPool
from sharderd.config import Config, DaemonConfig
from sharderd.daemon.control import ensure_control_dir
from sharderd.daemon.dirs import DaemonDirs, prepare_dirs
from sharderd.daemon.lock import StateLock
from sharderd.daemon.preflight import Check, Host, preflight
from sharderd.daemon.watch import watch_mode
from sharderd.errors import ConfigError

__all__ = ["Opened", "open_daemon"]


@dataclass(frozen=True, slots=True)
class Opened:
    """What start-up opened and checked."""

    config: Config
    """The configuration with absolute folders: watch events name absolute paths."""
    dirs: DaemonDirs
    lock: StateLock
    """Held for the daemon's life, taken before anything reads or writes the journal."""
    pool: AttemptPool
    control_dir: Path
    watch_mode: tuple[str, bool | None]
    """``(description, force_polling)``: ``auto`` polls an inbox on a network filesystem."""
    checks: tuple[Check, ...]
    """What the start-up checks found (each passed), for the ``daemon.started`` line."""


def open_daemon(config: Config, host: Host | None = None) -> Opened:
    """Refuse what ``preflight`` refuses (root, a missing package, a backend that cannot run),
    then create and check the folders, take the lock, join the cluster.

    Raises:
        ConfigError: A check failed; the message names the folder or key.
    """
    checks = preflight(config, host)
    refused = [c.problem for c in checks if c.problem is not None]
    if refused:
        raise refused[0]
    daemon = _absolute(config.daemon)
    dirs = prepare_dirs(daemon)
    lock = StateLock.acquire(dirs.state_dir)
    try:
        control_dir = ensure_control_dir(dirs.state_dir, daemon.dir_mode)
    except OSError as exc:
        raise ConfigError(f"cannot create {dirs.state_dir / 'control'}: {exc.strerror}") from None
    pool = AttemptPool(
        daemon.max_parallel_compiles,
        runner=_cluster_runner(config),
        ipus=IpuPool.of_setting(config.poprt.ipus),
    )
    opened = replace(config, daemon=daemon)
    return Opened(opened, dirs, lock, pool, control_dir, watch_mode(daemon), tuple(checks))


def _cluster_runner(config: Config) -> object | None:
    """The Ray runner for ``[cluster] engine = "ray"`` (joined now, before ready), else None."""
    if config.cluster.engine != "ray":
        return None
    from sharderd.cluster.executor import RayRunner

    runner = RayRunner(config.cluster)
    runner.connect()
    return runner


def _absolute(daemon: DaemonConfig) -> DaemonConfig:
    """Absolute folders: watch events name absolute paths, and they must compare equal to ours."""
    runtime = None if daemon.runtime_dir is None else daemon.runtime_dir.absolute()
    return replace(
        daemon,
        inbox=daemon.inbox.absolute(),
        outbox=daemon.outbox.absolute(),
        state_dir=daemon.state_dir.absolute(),
        runtime_dir=runtime,
    )
