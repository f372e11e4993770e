"""Per-job options from an optional sidecar TOML, over the daemon's defaults.

The sidecar is flat: ``devices``, ``target``, ``backend``, ``optimal_perf``, ``priority``,
``max_attempts``, and the planning keys a real export needs (``input_shapes``, ``dims``,
``batch_size``, ``name_nodes``, ``precision``, ``keep_dynamic``, as in ``[plan]``). It is validated by the same loader as ``sharderd.toml``, so an unknown or mistyped
key is an error naming the key, and that error fails the one job, not the daemon. The file is opened
without following links and read up to 1 MiB: a sidecar must not be a way to read outside the job.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from sharderd.config import DaemonConfig, PlanConfig, load_table, parse_toml
from sharderd.errors import ConfigError

__all__ = ["MAX_DEVICES", "JobOptions", "load_sidecar"]

MAX_DEVICES: Final = 1024
"""Far beyond any pipeline sharderd plans; a larger number is a typo."""
_MAX_ATTEMPTS: Final = 100
_MAX_BYTES: Final = 1 << 20

Backend = Literal["auto", "poprt", "onnxruntime", "none"]


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How one job is planned and proven; the daemon's defaults unless its sidecar says otherwise."""

    devices: int
    """Pipeline stages, one device each."""
    target: str | None
    """Target name; None: the config's ``[target]``."""
    backend: Backend
    optimal_perf: bool
    max_attempts: int
    """Worker starts (plan and compiles) before the job fails."""
    priority: int = 0
    """Higher is dispatched first; ties go to the oldest job."""
    auto_devices: bool = False
    """``[daemon] devices = "auto"``: ``devices`` is ``max_devices``, the most the job may use."""
    plan_overrides: Mapping[str, Any] = field(default_factory=dict)
    """``[plan]`` keys the sidecar sets (``dims`` adds to the daemon's own)."""

    def plan_config(self, base: PlanConfig) -> PlanConfig:
        """The daemon's ``[plan]`` with this job's overrides."""
        overrides = dict(self.plan_overrides)
        if "dims" in overrides:
            overrides["dims"] = {**base.dims, **overrides["dims"]}
        if "input_shapes" in overrides:
            overrides["input_shapes"] = {**base.input_shapes, **overrides["input_shapes"]}
        return replace(base, **overrides)

    @classmethod
    def from_config(cls, config: DaemonConfig, *, optimal_perf: bool = False) -> JobOptions:
        if config.devices == "auto":
            assert config.max_devices is not None  # DaemonConfig checks it
            return cls(
                config.max_devices,
                config.target,
                config.backend,
                optimal_perf,
                config.max_attempts,
                auto_devices=True,
            )
        return cls(config.devices, config.target, config.backend, optimal_perf, config.max_attempts)


@dataclass(frozen=True, slots=True)
class _SidecarTable:
    """The keys a sidecar may set; None: not set."""

    devices: int | None = None
    target: str | None = None
    backend: Backend | None = None
    optimal_perf: bool | None = None
    priority: int | None = None
    max_attempts: int | None = None
    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    dims: Mapping[str, int] | None = None
    batch_size: int | None = None
    name_nodes: bool | None = None
    precision: Literal["model", "fp32", "fp16"] | None = None
    keep_dynamic: bool | None = None


_PLAN_KEYS: Final = (
    "input_shapes",
    "dims",
    "batch_size",
    "name_nodes",
    "precision",
    "keep_dynamic",
)


def load_sidecar(
    path: Path | None,
    defaults: DaemonConfig,
    *,
    optimal_perf: bool = False,
    known_targets: Collection[str] | None = None,
) -> JobOptions:
    """The job's options: ``defaults`` overridden by the sidecar at ``path`` (None: no sidecar).

    ``optimal_perf`` is the default for that key (``[search]``, not ``[daemon]``); ``known_targets``,
    when given, rejects a target name early with the list of valid ones.
    """
    base = JobOptions.from_config(defaults, optimal_perf=optimal_perf)
    if path is None:
        return base
    where = (
        f"sidecar {path.parent.name}/{path.name}"
        if path.name == "sharderd.toml"
        else f"sidecar {path.name}"
    )
    table = load_table(_SidecarTable, parse_toml(_read(path, where), where), where)
    options = JobOptions(
        devices=base.devices if table.devices is None else table.devices,
        target=base.target if table.target is None else table.target,
        backend=base.backend if table.backend is None else table.backend,
        optimal_perf=base.optimal_perf if table.optimal_perf is None else table.optimal_perf,
        max_attempts=base.max_attempts if table.max_attempts is None else table.max_attempts,
        priority=base.priority if table.priority is None else table.priority,
        auto_devices=base.auto_devices and table.devices is None,
        plan_overrides={k: getattr(table, k) for k in _PLAN_KEYS if getattr(table, k) is not None},
    )
    # Only the sidecar's own values: the daemon's defaults were checked with sharderd.toml, and a
    # larger [daemon] max_attempts must not fail every job that has a sidecar, blaming the sidecar.
    if table.devices is not None and not 1 <= table.devices <= MAX_DEVICES:
        raise ConfigError(
            f"{where}: devices must be between 1 and {MAX_DEVICES}, got {table.devices}"
        )
    if table.max_attempts is not None and not 1 <= table.max_attempts <= _MAX_ATTEMPTS:
        raise ConfigError(
            f"{where}: max_attempts must be between 1 and {_MAX_ATTEMPTS}, got {table.max_attempts}"
        )
    try:
        options.plan_config(PlanConfig())  # the [plan] checks, on the sidecar's own values
    except ConfigError as err:
        raise ConfigError(f"{where}: {err.message}") from None
    if table.target is not None and (
        not table.target or (known_targets is not None and table.target not in known_targets)
    ):
        known = ", ".join(sorted(known_targets or ()))
        raise ConfigError(
            f"{where}: unknown target {table.target!r}" + (f" (known: {known})" if known else "")
        )
    return options


def _read(path: Path, where: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        why = (
            "it is a symbolic link, which sharderd never follows"
            if exc.errno == errno.ELOOP
            else exc.strerror
        )
        raise ConfigError(f"{where}: cannot open: {why}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ConfigError(f"{where}: not a regular file")
        try:
            data = f.read(_MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
    if len(data) > _MAX_BYTES:
        raise ConfigError(f"{where}: larger than 1 MiB; a sidecar holds a few keys")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.start})") from None
