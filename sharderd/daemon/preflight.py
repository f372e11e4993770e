"""What ``sharderd run`` refuses before it touches a folder, as one list of checks: the daemon raises
the first failure, ``check-config`` prints every failure and ``doctor`` prints them all, with the
same messages (one function, so the three never disagree).

Each check reads the config and what the host offers (``Host``: who we run as, which packages
import, whether poprt imports); nothing here creates, opens or locks anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from sharderd.backends.poplar_sdk import PoprtProbe, poprt_missing_hint, probe_poprt
from sharderd.backends.registry import is_available
from sharderd.config import Config
from sharderd.daemon.dirs import check_layout
from sharderd.errors import ConfigError

__all__ = ["Check", "Host", "failures", "preflight"]


@dataclass(frozen=True, slots=True)
class Check:
    """One thing ``run`` checks: what is fine (``ok``), or the refusal it raises (``problem``)."""

    subject: str
    """``root``, ``metrics``, ``cluster``, ``backend``, ``folders``."""
    ok: str
    problem: ConfigError | None = None


@dataclass
class Host:
    """What the checks read of this machine; tests build their own."""

    euid: int = field(default_factory=os.geteuid)
    importable: Callable[[str], bool] = is_available
    """Whether a package imports (``find_spec``: cheap, imports nothing)."""
    probe: Callable[[], PoprtProbe] = probe_poprt
    """Import poprt for real, in a child with the environment the attempts get."""

    @cached_property
    def poprt(self) -> PoprtProbe:
        """Probed once, and only when a check needs it (it loads Poplar: seconds on a real SDK)."""
        return self.probe()


def preflight(config: Config, host: Host | None = None) -> list[Check]:
    """Every start-up check of ``run``, in the order it makes them."""
    host = host or Host()
    return [
        _user(config, host),
        _metrics(config, host),
        _cluster(config, host),
        _backend(config, host),
        _folders(config),
    ]


def failures(config: Config, host: Host | None = None) -> list[ConfigError]:
    """The refusals of ``preflight``; ``run`` raises the first."""
    return [c.problem for c in preflight(config, host) if c.problem is not None]


def _user(config: Config, host: Host) -> Check:
    if host.euid != 0:
        return Check("root", f"not root (uid {host.euid})")
    if config.daemon.allow_root:
        return Check("root", "root, allowed by allow_root = true")
    return Check(
        "root",
        "",
        ConfigError(
            "refusing to run as root: every model would be parsed and compiled with root privileges",
            hint="Run as the sharderd user (the systemd unit does), or set allow_root = true in [daemon].",
        ),
    )


def _metrics(config: Config, host: Host) -> Check:
    port = config.daemon.metrics_port
    if port is None:
        return Check("metrics", "no metrics_port (metrics_textfile needs no package)")
    if host.importable("prometheus_client"):
        return Check("metrics", f"metrics_port = {port}: prometheus-client imports")
    return Check(
        "metrics",
        "",
        ConfigError(
            f"metrics_port = {port} needs the prometheus-client package, which is not installed",
            hint="`python3 -m pip install prometheus-client` (into sharderd's Python), or unset "
            "metrics_port and use metrics_textfile.",
        ),
    )


def _cluster(config: Config, host: Host) -> Check:
    if config.cluster.engine != "ray":
        return Check("cluster", "attempts run on this host ([cluster] engine = local)")
    if host.importable("ray"):
        return Check("cluster", "[cluster] engine = ray: ray imports")
    return Check(
        "cluster",
        "",
        ConfigError(
            '[cluster] engine = "ray" needs the ray package, which is not installed',
            hint="`python3 -m pip install 'ray[default]'` (into sharderd's Python), or set "
            'engine = "local" in [cluster].',
        ),
    )


def _backend(config: Config, host: Host) -> Check:
    """``backend`` of ``[daemon]``: what would prove jobs with no sidecar saying otherwise."""
    backend = config.daemon.backend
    target = config.target(None)
    if config.cluster.engine == "ray" and config.cluster.sdk_resource and backend != "onnxruntime":
        return Check(
            "backend",
            f"backend {backend}: poprt runs on the Ray nodes offering {config.cluster.sdk_resource!r} "
            "(checked per attempt, not here)",
        )
    if backend == "none":
        return Check("backend", "backend none: jobs are planned and written, proven by nothing")
    if backend == "onnxruntime" or (backend == "auto" and target.kind != "ipu"):
        if host.importable("onnxruntime"):
            return Check(
                "backend", f"backend {backend}: onnxruntime verifies jobs (nothing is compiled)"
            )
        if backend == "auto":
            return Check("backend", f"backend auto, target {target.name}: no backend, plan only")
        return Check(
            "backend",
            "",
            ConfigError(
                'backend = "onnxruntime" in [daemon], but onnxruntime is not installed',
                hint="`python3 -m pip install onnxruntime` (into sharderd's Python), or set "
                'backend = "none" in [daemon] to plan only.',
            ),
        )
    probe = host.poprt
    if probe.imports:
        return Check("backend", f"backend {backend}: poprt {probe.version} compiles jobs")
    why = f"poprt does not import in this environment ({probe.error})"
    if backend == "auto":
        message = (
            f'backend = "auto" with the IPU target {target.name} needs PopRT, but {why}: every job '
            "would be verified on the CPU with onnxruntime and nothing compiled"
        )
    else:
        message = f'backend = "poprt" in [daemon], but {why}'
    return Check("backend", "", ConfigError(message, hint=poprt_missing_hint()))


def _folders(config: Config) -> Check:
    try:
        check_layout(config.daemon)
    except ConfigError as err:
        return Check("folders", "", err)
    return Check("folders", "inbox, outbox and state_dir are separate folders")
