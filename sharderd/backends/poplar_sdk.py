"""The Poplar SDK's environment, for a service: read it off the SDK's enable script, write it as a
systemd ``EnvironmentFile=``, read that file back, and ask whether poprt imports in it.

PopRT runs only in the environment the SDK's ``enable`` script sets up (library paths, Python path,
the SDK's own variables). A shell sources that script; a systemd service cannot, so
``sdk_environment`` runs it once in a clean ``bash`` and keeps the variables it adds or changes,
nothing else, and ``write_env_file`` stores them in the syntax systemd's ``EnvironmentFile=`` reads
(systemd's ``src/basic/env-file.c``: every value double-quoted, ``\\ " $ ``` escaped, a newline
kept literally inside the quotes). ``read_env_file`` parses that syntax back the same way.

``probe_poprt`` imports poprt in a child process with a given environment and asks the runtime how
many IPUs it sees (``poprt.runtime.DeviceManager().get_num_devices()``, the documented API); a
child, because importing poprt loads Poplar, and a broken SDK may crash the process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sharderd.errors import ConfigError

__all__ = [
    "ENV_FILE",
    "SERVICE_PATH",
    "PoprtProbe",
    "SdkEnvironment",
    "enable_script",
    "expected_sdk",
    "poprt_missing_hint",
    "probe_poprt",
    "read_env_file",
    "render_env_file",
    "sdk_environment",
    "sdk_root",
]

ENV_FILE: Final = Path("/etc/sharderd/poplar-sdk.env")
"""Where the unit's ``EnvironmentFile=`` looks (systemd/sharderd.service)."""
SERVICE_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The ``PATH`` systemd gives a service, so the script's ``PATH`` is computed from the same start."""
_SHELL_OWN: Final = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})
"""Variables bash itself moves; never the script's doing."""
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SDK_FOLDER: Final = re.compile(r"([^:]*?)/(poplar_sdk|poplar)-[^/:]*?-(\d+\.\d+\.\d+)[^/:]*")
"""An SDK's folder (``/opt/poplar_sdk-ubuntu_20_04-3.4.0+1507-69d9d03fd8``), or its Poplar folder
(``<sdk>/poplar-ubuntu_20_04-3.3.0+7857-b67b751185``) in a path or a ``:`` list."""
_POPRT_FOR_SDK: Final = {
    "1.5": "3.4",
    "1.4": "3.3",
    "1.3": "3.3",
    "1.2": "3.2",
    "1.1": "3.2",
    "1.0": "3.1",
}
"""PopRT release → the SDK it is built for (PopRT's installation page, 1.0.2 to 1.5.0)."""


@dataclass(frozen=True, slots=True)
class SdkEnvironment:
    """What the enable script did to a clean environment."""

    script: Path
    variables: Mapping[str, str]
    """Added or changed, in the script's order of ``env``."""
    unset: tuple[str, ...]
    """Removed by the script: a service never had them, so nothing is written for them."""
    skipped: tuple[str, ...]
    """Exported names systemd cannot take (exported bash functions, odd names)."""
    cleaned: tuple[str, ...]
    """``*PATH`` variables whose empty entries (the working directory) were dropped."""


def sdk_environment(script: Path, *, timeout: float = 60.0) -> SdkEnvironment:
    """Source ``script`` in a clean ``bash`` (``env -i``, the service's ``PATH``) and diff the
    exported environment before and after (``env -0``, so any value survives).

    Raises:
        ConfigError: no such script, or it failed (its exit status and stderr tail are said).
    """
    if not script.is_file():
        raise ConfigError(
            f"{script} is not a file: name the SDK's enable script, e.g. /opt/poplar_sdk-<version>/enable"
        )
    with tempfile.TemporaryDirectory(prefix="sharderd-sdk-env-") as tmp:
        before, after = Path(tmp) / "before", Path(tmp) / "after"
        # The script's own output goes to stderr; only the two env dumps are files.
        program = 'env -0 > "$1" && source "$3" 1>&2 && env -0 > "$2"'
        clean = ["env", "-i", f"PATH={SERVICE_PATH}", f"HOME={tmp}", "LANG=C.UTF-8"]
        bash = ["bash", "--noprofile", "--norc", "-c", program, "sdk-env"]
        done = subprocess.run(
            [*clean, *bash, str(before), str(after), str(script.resolve())],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=script.resolve().parent,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not after.is_file():
            tail = done.stderr.decode(errors="replace").strip()[-500:]
            raise ConfigError(
                f"sourcing {script} in a clean bash failed (exit status {done.returncode})"
                + (f": {tail}" if tail else ""),
                hint=f"Run it by hand to see why: env -i bash --norc -c 'source {script}'",
            )
        old, new = _env0(before.read_bytes()), _env0(after.read_bytes())
    variables: dict[str, str] = {}
    skipped, cleaned = [], []
    for key, value in new.items():
        if key in _SHELL_OWN or old.get(key) == value:
            continue
        if not _NAME.fullmatch(key):
            skipped.append(key)
            continue
        if key.endswith("PATH") and ":" in value and "" in value.split(":"):
            value = ":".join(part for part in value.split(":") if part)
            cleaned.append(key)
        variables[key] = value
    unset = tuple(k for k in old if k not in new and k not in _SHELL_OWN)
    return SdkEnvironment(script, variables, unset, tuple(skipped), tuple(cleaned))


def _env0(data: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.decode("utf-8", errors="surrogateescape").partition("=")
        if sep:
            env[key] = value
    return env


def poprt_missing_hint() -> str:
    """The fix when poprt does not import where it must (the daemon, ``doctor``, a daemon job)."""
    return (
        f"Put the Poplar SDK into the service's environment: `sudo sharderd sdk-env {enable_script()} "
        f"--out {ENV_FILE}` (docs/ipu-host.md), then `sudo systemctl restart sharderd`; or, to "
        'verify on the CPU on purpose, set backend = "onnxruntime" in [daemon].'
    )


def enable_script(search: Path = Path("/opt")) -> str:
    """The newest SDK enable script under ``search`` by name (``poplar_sdk-*/enable``), for a hint
    that works as written; a placeholder when there is none."""
    found = sorted(search.glob("poplar_sdk-*/enable"))
    return str(found[-1]) if found else f"{search}/poplar_sdk-VERSION/enable"


def sdk_root(texts: Iterable[str]) -> tuple[Path, str] | None:
    """The SDK's folder and version, from the first of ``texts`` (paths, environment values) that
    names the SDK's folder (``poplar_sdk-<os>-3.4.0+<build>``) or its Poplar folder (whose parent
    is the SDK's: ``<sdk>/poplar-<os>-3.3.0+<build>``)."""
    for text in texts:
        found = _SDK_FOLDER.search(text)
        if found:
            parent, kind, version = found.groups()
            folder = Path(found.group(0)) if kind == "poplar_sdk" else Path(parent or "/")
            return folder, version
    return None


def expected_sdk(poprt_version: str) -> str | None:
    """The SDK release (``3.4``) a PopRT version is built for; None when sharderd does not know it."""
    major_minor = ".".join(poprt_version.split(".")[:2])
    return _POPRT_FOR_SDK.get(major_minor)


def render_env_file(env: SdkEnvironment, *, version: str | None) -> str:
    """The ``EnvironmentFile=`` text: a comment saying where it came from, then one assignment
    per variable, double-quoted so that spaces, ``#`` and newlines survive systemd's parser."""
    lines = [
        f"# Written by `sharderd sdk-env {env.script}`: the variables that script adds or changes",
        f"# in a clean bash (SDK {version or 'version unknown'}). Regenerate it after an SDK upgrade;",
        "# the unit reads it through EnvironmentFile= (systemd/sharderd.service).",
    ]
    for key, value in env.variables.items():
        escaped = re.sub(r'(["\\`$])', r"\\\1", value)
        lines.append(f'{key}="{escaped}"')
    return "\n".join(lines) + "\n"


def read_env_file(text: str) -> dict[str, str]:
    """Parse ``EnvironmentFile=`` syntax as systemd does (comments, ``KEY=value``, single and
    double quotes, backslash escapes and line continuations)."""
    env: dict[str, str] = {}
    for key, value in _assignments(text):
        if _NAME.fullmatch(key):
            env[key] = value
    return env


def _assignments(text: str) -> Iterator[tuple[str, str]]:
    state, key, value, trailing = "pre_key", "", "", 0
    for c in text + "\n":
        if state == "comment":
            state = "pre_key" if c == "\n" else state
        elif state == "pre_key":
            if c in "#;":
                state = "comment"
            elif not c.isspace():
                state, key, value = "key", c, ""
        elif state == "key":
            if c == "\n":
                state = "pre_key"
            elif c == "=":
                state, key = "pre_value", key.strip()
            else:
                key += c
        elif state in ("pre_value", "value"):
            if c == "\n":
                yield key, value[: len(value) - trailing] if state == "value" else value
                state, trailing = "pre_key", 0
            elif c == "\\":
                state, trailing = "value_escape", 0
            elif state == "pre_value" and c in "'\"":
                state = "single" if c == "'" else "double"
            elif state == "pre_value" and c.isspace():
                pass
            else:
                state, value = "value", value + c
                trailing = trailing + 1 if c.isspace() else 0
        elif state == "value_escape":
            state, value = "value", value + ("" if c == "\n" else c)
        elif state == "single":
            state, value = ("pre_value", value) if c == "'" else (state, value + c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                value += c
        elif state == "double_escape":
            state = "double"
            value += c if c in '"\\`$' else ("" if c == "\n" else "\\" + c)


@dataclass(frozen=True, slots=True)
class PoprtProbe:
    """poprt as a child process with some environment saw it."""

    version: str | None
    """``poprt.__version__``; None when it did not import."""
    error: str | None
    """Why it did not import, or why the device query failed (one line)."""
    ipus: int | None = None
    """``DeviceManager().get_num_devices()``; None when it could not be asked."""
    hardware: str | None = None
    """``DeviceManager().ipu_hardware_version()`` (``ipu2``, ``ipu21``) when IPUs are visible."""
    not_installed: bool = False
    """The import failed because there is no module ``poprt`` at all (not a library it loads)."""

    @property
    def imports(self) -> bool:
        return self.version is not None


_PROBE: Final = """
import json, sys
try:
    import poprt
except BaseException as exc:
    absent = isinstance(exc, ModuleNotFoundError) and exc.name == "poprt"
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}".splitlines()[0], "absent": absent}))
    sys.exit(0)
found = {"version": str(getattr(poprt, "__version__", "unknown"))}
try:
    from poprt import runtime
    manager = runtime.DeviceManager()
    found["ipus"] = int(manager.get_num_devices())
    if found["ipus"] > 0:
        found["hardware"] = str(manager.ipu_hardware_version())
except BaseException as exc:
    found["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(found))
"""


def probe_poprt(env: Mapping[str, str] | None = None, *, timeout: float = 120.0) -> PoprtProbe:
    """Import poprt in a child of this interpreter with ``env`` (default: ours) and count IPUs."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=dict(os.environ if env is None else env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return PoprtProbe(None, f"importing poprt took more than {timeout:g} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return PoprtProbe(None, f"the import crashed the process: {tail[0]}")
    found = json.loads(lines[-1])
    return PoprtProbe(
        found.get("version"),
        found.get("error"),
        found.get("ipus"),
        found.get("hardware"),
        bool(found.get("absent")),
    )
