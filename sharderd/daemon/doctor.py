"""``sharderd doctor``: is this host ready to run the service, and what to do about each thing not.

It reports, one finding a line: every start-up check of ``run`` (``preflight``, the same messages),
then what ``run`` does not check but a job needs: the environment file of the unit and the SDK it
names, poprt's version against that SDK, how many IPUs poprt sees, and the service user's access to
the inbox, outbox and state folders. poprt is imported in the environment the service will have:
systemd's ``PATH`` plus the ``EnvironmentFile=`` (never the caller's shell). A failed finding
carries its fix as a command.

The checks run as the calling user and outside the unit's sandbox: run doctor as the service user
(``sudo -u sharderd sharderd doctor``) for its folder access; device access under the unit's
``DevicePolicy=`` shows in the daemon's ``daemon.started`` line (``backend_check``) and its attempts.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from sharderd.backends.poplar_sdk import (
    SERVICE_PATH,
    PoprtProbe,
    enable_script,
    expected_sdk,
    probe_poprt,
    read_env_file,
    sdk_root,
)
from sharderd.config import Config
from sharderd.daemon.preflight import Host, preflight

__all__ = ["Finding", "ServiceEnv", "diagnose", "service_env"]

Level = Literal["ok", "warn", "fail"]
TMPFILES: Final = Path("/etc/tmpfiles.d/sharderd.conf")
"""Where systemd/README.md installs sharderd.tmpfiles."""
SERVICE_USER: Final = "sharderd"


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    subject: str
    text: str
    fix: str | None = None


@dataclass(frozen=True, slots=True)
class ServiceEnv:
    """The environment the unit gives the daemon: systemd's own plus the ``EnvironmentFile=``."""

    env_file: Path
    loaded: Mapping[str, str] | None
    """The file's variables; None when there is no such file (the unit's ``-`` prefix skips it)."""
    env: Mapping[str, str]


def service_env(env_file: Path) -> ServiceEnv:
    """``PATH`` as systemd sets it, ``HOME`` and ``LANG`` as ours, then the file's variables."""
    base = {
        "PATH": SERVICE_PATH,
        "HOME": os.environ.get("HOME", "/"),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    try:
        loaded = read_env_file(env_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ServiceEnv(env_file, None, base)
    return ServiceEnv(env_file, loaded, {**base, **loaded})


def diagnose(config: Config, service: ServiceEnv, host: Host | None = None) -> list[Finding]:
    """Every finding, in the order printed."""
    host = host or Host(probe=lambda: probe_poprt(service.env))
    findings = [
        Finding("ok", c.subject, c.ok)
        if c.problem is None
        else Finding("fail", c.subject, c.problem.message, c.problem.hint)
        for c in preflight(config, host)
    ]
    findings.append(_identity(host.euid))
    findings += _sdk(config, service, host)
    findings += [_folder(label, path, host.euid) for label, path in _folders(config)]
    return findings


def _needs_poprt(config: Config) -> bool:
    backend, cluster = config.daemon.backend, config.cluster
    if cluster.engine == "ray" and cluster.sdk_resource:
        return False  # the Ray nodes compile, not this host
    return backend == "poprt" or (backend == "auto" and config.target(None).kind == "ipu")


def _identity(euid: int) -> Finding:
    name = _user_name(euid)
    if name == SERVICE_USER:
        return Finding("ok", "user", f"checked as {name}, the unit's User=")
    if not _exists(SERVICE_USER):
        return Finding(
            "warn",
            "user",
            f"checked as {name} (uid {euid}); there is no user {SERVICE_USER!r} for the unit's User=",
            "sudo systemd-sysusers /etc/sysusers.d/sharderd.conf  (systemd/README.md, Install)",
        )
    return Finding(
        "warn",
        "user",
        f"checked as {name} (uid {euid}), not as the service's {SERVICE_USER}: folder access is "
        "this user's",
        "sudo -u sharderd sharderd doctor",
    )


def _sdk(config: Config, service: ServiceEnv, host: Host) -> list[Finding]:
    """The environment file, poprt in it against its SDK, and the IPUs poprt sees."""
    needed = _needs_poprt(config)
    missing: Level = "fail" if needed else "warn"
    if service.loaded is None:
        if not needed:
            return [Finding("ok", "sdk", f"no {service.env_file}; nothing here needs poprt")]
        return [
            Finding(
                "fail",
                "sdk",
                f"no environment file {service.env_file}: the service runs without the Poplar SDK",
                f"sudo sharderd sdk-env {enable_script()} --out {service.env_file}",
            )
        ]
    root = sdk_root(service.loaded.values())
    folder, sdk = root if root else (None, None)
    findings = [
        Finding(
            "ok",
            "sdk",
            f"{service.env_file}: {len(service.loaded)} variable(s) of the Poplar SDK "
            f"{sdk or '(its version is not in the paths)'}",
        )
    ]
    probe = host.poprt
    if not probe.imports:
        fix = (
            f"sudo {sys.executable} -m pip install {_wheel(folder)}  (docs/ipu-host.md)"
            if probe.not_installed
            else f"sudo sharderd sdk-env {folder / 'enable' if folder else enable_script()} "
            f"--out {service.env_file}"
        )
        text = f"poprt does not import with {service.env_file} in {sys.executable}: {probe.error}"
        return [*findings, Finding(missing, "poprt", text, fix)]
    return [*findings, _version(probe, sdk, folder), _ipus(probe, config, missing)]


def _wheel(folder: Path | None) -> str:
    """The PopRT wheel the SDK folder ships, by its real name when there is exactly one."""
    wheels = sorted(folder.glob("poprt*.whl")) if folder is not None and folder.is_dir() else []
    return (
        str(wheels[0]) if len(wheels) == 1 else f"<the poprt wheel in {folder or 'the SDK folder'}>"
    )


def _version(probe: PoprtProbe, sdk: str | None, root: Path | None) -> Finding:
    version = probe.version or "?"
    expected = expected_sdk(version)
    if sdk is None or expected is None:
        known = "sharderd knows PopRT 1.0 to 1.5 (SDK 3.1 to 3.4)"
        what = "the SDK's version is not in the file's paths" if sdk is None else known
        return Finding("warn", "poprt", f"poprt {version} imports; {what}: its match is unchecked")
    if sdk.startswith(expected + "."):
        return Finding(
            "ok", "poprt", f"poprt {version} imports, built for SDK {expected} as this one ({sdk})"
        )
    return Finding(
        "fail",
        "poprt",
        f"poprt {version} is built for SDK {expected}, but the environment file's SDK is {sdk}",
        f"sudo {sys.executable} -m pip install --force-reinstall {_wheel(root)}",
    )


def _ipus(probe: PoprtProbe, config: Config, missing: Level) -> Finding:
    if probe.ipus is None:
        return Finding(missing, "ipus", f"poprt could not count IPUs: {probe.error}", _DEVICES_FIX)
    if probe.ipus == 0:
        return Finding(missing, "ipus", "poprt sees no IPU", _DEVICES_FIX)
    wanted = config.poprt.ipus
    seen = f"{probe.ipus} IPU(s) visible ({probe.hardware})"
    if wanted > probe.ipus:
        return Finding(
            "fail",
            "ipus",
            f"{seen}, but [poprt] ipus = {wanted}: benchmarks would wait for IPUs that are not there",
            "set ipus = -1 in [poprt] (count them), or the number visible",
        )
    return Finding("ok", "ipus", seen)


_DEVICES_FIX: Final = (
    "sudo install -D -m 0644 systemd/ipu-devices.conf "
    "/etc/systemd/system/sharderd.service.d/ipu-devices.conf && sudo systemctl daemon-reload "
    "(and give the user the IPU devices' group; see that file's header)"
)


def _folders(config: Config) -> list[tuple[str, Path]]:
    d = config.daemon
    return [("inbox", d.inbox), ("outbox", d.outbox), ("state_dir", d.state_dir)]


def _folder(label: str, path: Path, euid: int) -> Finding:
    user = _user_name(euid)
    owner = SERVICE_USER if _exists(SERVICE_USER) else user
    fix = (
        f"sudo systemd-tmpfiles --create {TMPFILES}"
        if TMPFILES.is_file()
        else f"sudo install -d -o {owner} -m 0750 {path}"
    )
    if not path.is_dir():
        return Finding("fail", "folders", f"{label} {path} does not exist", fix)
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        return Finding("fail", "folders", f"{label} {path} is not writable by {user}", fix)
    return Finding("ok", "folders", f"{label} {path} is writable by {user}")


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
