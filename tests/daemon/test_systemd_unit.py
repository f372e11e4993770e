"""systemd/: the unit, its IPU drop-in, sysusers, tmpfiles and example config, checked together.

The files are parsed here (they must agree with each other and with ``sharderd.config``) and handed
to systemd's own tools when installed: ``systemd-analyze verify`` must print nothing and
``systemd-analyze security --offline=yes`` must rate the unit at most 3.0 (issues 4 and 7).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

from sharderd.config import load_config

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNIT = SYSTEMD_DIR / "sharderd.service"
DROPIN = SYSTEMD_DIR / "ipu-devices.conf"
SYSUSERS = SYSTEMD_DIR / "sharderd.sysusers"
TMPFILES = SYSTEMD_DIR / "sharderd.tmpfiles"
EXAMPLE_CONFIG = SYSTEMD_DIR / "sharderd.toml"
README = SYSTEMD_DIR / "README.md"
SECURITY_DOC = SYSTEMD_DIR.parent / "docs" / "security.md"

EXPOSURE_THRESHOLD = 3.0
INSTALLED_EXEC = "/usr/local/bin/sharderd"

Unit = dict[str, list[tuple[str, str]]]

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run installs it)",
)


# --- parsing -----------------------------------------------------------------------------------


def parse_unit(text: str) -> Unit:
    """Sections → ``(key, value)`` in file order; repeated keys are kept, as systemd accumulates them."""
    sections: Unit = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a directive inside a section: {raw!r}"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: Unit, section: str, key: str) -> list[str]:
    """Every assignment of ``key``, in order (an empty one resets the list in systemd)."""
    return [v for k, v in unit.get(section, []) if k == key]


def last(unit: Unit, section: str, key: str) -> str | None:
    found = values(unit, section, key)
    return found[-1] if found else None


def words(unit: Unit, section: str, key: str) -> list[str]:
    """A list-valued directive (``ReadWritePaths=a b``) flattened; ``-``/``+`` prefixes dropped."""
    return [w.lstrip("-+") for v in values(unit, section, key) for w in shlex.split(v)]


def config_lines(path: Path) -> list[list[str]]:
    """sysusers.d/tmpfiles.d lines as fields, comments and blank lines left out."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [shlex.split(line) for line in lines if line and not line.startswith("#")]


@cache
def unit() -> Unit:
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def state_directory() -> PurePosixPath:
    name = last(unit(), "Service", "StateDirectory")
    assert name, "StateDirectory= is not set"
    return PurePosixPath("/var/lib") / name


def fabric_dropin() -> str:
    """ipu-devices.conf with its IPU-over-fabric block uncommented, as a POD site would use it."""
    text = DROPIN.read_text(encoding="utf-8")
    start, end = text.index("# --- B."), text.index("# --- If Poplar")
    block = re.sub(r"^#(?=[A-Z][A-Za-z]*=)", "", text[start:end], flags=re.MULTILINE)
    assert "PrivateNetwork=no" in block.splitlines()
    return text[:start] + block + text[end:]


VARIANTS: dict[str, Callable[[], str] | None] = {
    "unit": None,  # the unit alone
    "unit+ipu": lambda: DROPIN.read_text(encoding="utf-8"),
    "unit+ipu+fabric": fabric_dropin,
}


def install_unit(dest: Path, variant: str = "unit", *, text: str | None = None) -> Path:
    """Write the unit (and drop-in) into ``dest`` with ExecStart on a binary that exists.

    ``verify`` checks that the executable exists; the installed ``sharderd`` is used when there is
    one, else ``/bin/true`` (the arguments do not matter to systemd).
    """
    found = shutil.which("sharderd")
    binary = str(Path(found).resolve()) if found else "/bin/true"
    source = UNIT.read_text(encoding="utf-8") if text is None else text
    rewritten, count = re.subn(
        rf"^ExecStart={re.escape(INSTALLED_EXEC)} ",
        f"ExecStart={binary} ",
        source,
        flags=re.MULTILINE,
    )
    assert count == 1, "ExecStart= no longer starts with /usr/local/bin/sharderd"
    path = dest / "sharderd.service"
    path.write_text(rewritten, encoding="utf-8")
    make_dropin = VARIANTS[variant]
    if make_dropin is not None:
        (dest / "sharderd.service.d").mkdir()
        (dest / "sharderd.service.d" / "ipu-devices.conf").write_text(
            make_dropin(), encoding="utf-8"
        )
    return path


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    env = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(
        [ANALYZE, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


@cache
def offline_security_supported() -> bool:
    """``security --offline=`` arrived in systemd 250; Debian 11's 247 does not have it."""
    return "--offline" in analyze("--help").stdout


def exposure(unit_path: Path) -> float:
    if not offline_security_supported():
        pytest.skip("this systemd-analyze has no `security --offline=` (needs systemd >= 250)")
    result = analyze("security", "--offline=yes", "--no-pager", str(unit_path))
    found = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert found, f"no exposure in systemd-analyze output:\n{result.stdout}\n{result.stderr}"
    return float(found.group(1))


# --- the unit's content ------------------------------------------------------------------------


def test_unit_sets_every_directive_the_issue_requires() -> None:
    """The lifecycle and hardening directives of issues 4 and 7 are set to the agreed values."""
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": f"{INSTALLED_EXEC} run --config /etc/sharderd/sharderd.toml",
        "WatchdogSec": "30",
        "Restart": "on-failure",
        "RestartSec": "5",
        "KillMode": "mixed",
        "KillSignal": "SIGTERM",
        "TimeoutStopSec": "90",
        "OOMPolicy": "continue",
        "User": "sharderd",
        "Group": "sharderd",
        "StateDirectory": "sharderd",
        "RuntimeDirectory": "sharderd",
        "UMask": "0027",
        "ProtectSystem": "strict",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "DevicePolicy": "closed",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_UNIX",
        "RestrictNamespaces": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictSUIDSGID": "yes",
        "SystemCallArchitectures": "native",
        "CapabilityBoundingSet": "",
        "ProtectProc": "invisible",
    }
    actual = {key: last(unit(), "Service", key) for key in expected}
    assert actual == expected
    assert "@system-service" in words(unit(), "Service", "SystemCallFilter")
    assert words(unit(), "Service", "ReadWritePaths"), (
        "ReadWritePaths= is required with ProtectSystem=strict"
    )
    assert values(unit(), "Install", "WantedBy") == ["multi-user.target"]


def test_unit_leaves_open_what_the_workload_needs() -> None:
    """No W^X (Poplar/libffi), no ProcSubset=pid (onnxruntime's cpuinfo), @resources allowed, AF_UNIX kept."""
    service = dict(unit()["Service"])
    assert "MemoryDenyWriteExecute" not in service
    assert "ProcSubset" not in service
    denied = [w for w in words(unit(), "Service", "SystemCallFilter") if w.startswith("~")]
    assert "~@resources" not in denied
    assert "AF_UNIX" in words(unit(), "Service", "RestrictAddressFamilies")


def test_read_write_paths_keep_the_daemon_folders_on_one_mount() -> None:
    """Each ReadWritePaths= entry is a bind mount; none may separate inbox, outbox and state_dir (EXDEV)."""
    daemon = load_config(EXAMPLE_CONFIG).daemon
    folders = [PurePosixPath(p) for p in (daemon.inbox, daemon.outbox, daemon.state_dir)]
    entries = [PurePosixPath(p) for p in words(unit(), "Service", "ReadWritePaths")]
    for entry in entries:
        inside = [folder.is_relative_to(entry) for folder in folders]
        assert all(inside) or not any(inside), (
            f"ReadWritePaths={entry} splits {folders} across mounts"
        )
    assert any(all(f.is_relative_to(e) for f in folders) for e in [*entries, state_directory()])


def test_example_config_loads_and_matches_the_unit() -> None:
    """systemd/sharderd.toml loads, its folders are the unit's, and its timeouts nest inside TimeoutStopSec."""
    config = load_config(EXAMPLE_CONFIG)
    daemon = config.daemon
    state = state_directory()
    assert PurePosixPath(daemon.inbox) == state / "inbox"
    assert PurePosixPath(daemon.outbox) == state / "outbox"
    assert PurePosixPath(daemon.state_dir).is_relative_to(state)
    assert daemon.runtime_dir is not None
    assert PurePosixPath(daemon.runtime_dir) == PurePosixPath("/run") / str(
        last(unit(), "Service", "RuntimeDirectory")
    )
    exec_start = shlex.split(str(last(unit(), "Service", "ExecStart")))
    assert exec_start[exec_start.index("--config") + 1] == "/etc/sharderd/sharderd.toml"
    assert (
        daemon.kill_grace
        < daemon.shutdown_timeout
        < float(str(last(unit(), "Service", "TimeoutStopSec")))
    )
    assert not daemon.allow_root and last(unit(), "Service", "User") not in ("root", "0")
    assert (daemon.file_mode, daemon.dir_mode) == (0o640, 0o750)


def test_tmpfiles_lines_match_the_config_and_state_directory() -> None:
    """tmpfiles creates exactly the config's folders, with the StateDirectoryMode= and group rules documented."""
    daemon = load_config(EXAMPLE_CONFIG).daemon
    lines = {PurePosixPath(f[1]): f for f in config_lines(TMPFILES)}
    assert all(f[0] == "d" and len(f) == 6 for f in lines.values()), lines
    state = state_directory()
    inbox, outbox, state_dir = (
        PurePosixPath(p) for p in (daemon.inbox, daemon.outbox, daemon.state_dir)
    )
    assert set(lines) == {state, inbox, outbox, state_dir}
    modes = {path: int(fields[2], 8) for path, fields in lines.items()}
    # Same mode as systemd's StateDirectory=, or the two would rewrite it at every start.
    assert modes[state] == int(str(last(unit(), "Service", "StateDirectoryMode")), 8)
    assert lines[state][3:5] == ["sharderd", "sharderd"]  # else systemd chowns the whole tree
    submit = values(unit(), "Service", "SupplementaryGroups")
    assert lines[inbox][3:5] == ["sharderd", *submit]
    assert (
        modes[inbox] & stat.S_ISGID
        and modes[inbox] & stat.S_IWGRP
        and not modes[inbox] & stat.S_ISVTX
    )
    assert modes[outbox] & stat.S_ISGID and not modes[outbox] & (stat.S_IWGRP | stat.S_IRWXO)
    assert not modes[state_dir] & (stat.S_IWGRP | stat.S_IRWXO)
    assert modes[state] & stat.S_IXOTH and not modes[state] & (stat.S_IROTH | stat.S_IWOTH)


def test_sysusers_declares_every_account_the_other_files_use() -> None:
    """User=, Group=, SupplementaryGroups= and tmpfiles owners exist in sysusers; the daemon is in the submit group."""
    lines = config_lines(SYSUSERS)
    assert all(f[0] in {"u", "g", "m"} for f in lines), lines
    users = {f[1]: f for f in lines if f[0] == "u"}
    groups = {f[1] for f in lines if f[0] == "g"} | set(users)
    members = {(f[1], f[2]) for f in lines if f[0] == "m"}
    service = unit()["Service"]
    assert last(unit(), "Service", "User") in users
    wanted_groups = {v for k, v in service if k in ("Group", "SupplementaryGroups")}
    wanted_groups |= {f[4] for f in config_lines(TMPFILES)}
    assert wanted_groups <= groups
    assert {f[3] for f in config_lines(TMPFILES)} <= set(users)
    assert ("sharderd", "sharderd-submit") in members
    assert users["sharderd"][4] == str(state_directory())  # ~ is writable, ~/.cache lands there


def test_ipu_dropin_opens_devices_by_group_name_not_by_glob() -> None:
    """The drop-in turns PrivateDevices off, keeps the allow list closed, and uses DeviceAllow= forms systemd accepts."""
    dropin = parse_unit(fabric_dropin())
    assert last(dropin, "Service", "PrivateDevices") == "no"
    assert last(dropin, "Service", "DevicePolicy") == "closed"
    rules = values(dropin, "Service", "DeviceAllow")
    assert "char-ipu* rw" in rules
    for rule in rules:
        node = rule.split()[0]
        # Paths are taken literally; wildcards only work on /proc/devices group names.
        assert node.startswith(("char-", "block-")) or (
            node.startswith("/dev/") and not set(node) & set("*?[")
        ), rule
    assert "ipu" in values(dropin, "Service", "SupplementaryGroups")
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(
        words(dropin, "Service", "RestrictAddressFamilies")
    )


def test_readme_explains_every_directive() -> None:
    """Every directive of the unit, and the two left out on purpose, has a row in systemd/README.md."""
    readme = README.read_text(encoding="utf-8")
    keys = {k for k, _ in unit()["Service"]} | {
        k for k, _ in unit()["Unit"] if k.startswith("StartLimit")
    }
    keys |= {"MemoryDenyWriteExecute", "ProcSubset"}
    missing = sorted(k for k in keys if f"`{k}=`" not in readme)
    assert not missing, f"directives without a row in systemd/README.md: {missing}"


# --- systemd's own tools ------------------------------------------------------------------------


@needs_analyze
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_verify_prints_nothing(tmp_path: Path, variant: str) -> None:
    """`systemd-analyze verify` accepts the unit, alone and with each drop-in variant, without a word."""
    result = analyze("verify", "--man=no", str(install_unit(tmp_path, variant)))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@needs_analyze
def test_verify_reports_a_misspelt_value(tmp_path: Path) -> None:
    """The silence above means something: an invalid value is reported, naming the directive."""
    text = UNIT.read_text(encoding="utf-8").replace("KillMode=mixed", "KillMode=mixd")
    result = analyze("verify", "--man=no", str(install_unit(tmp_path, text=text)))
    assert "kill mode" in result.stderr.lower() and "mixd" in result.stderr


@needs_analyze
@pytest.mark.skipif(Path(INSTALLED_EXEC).exists(), reason=f"{INSTALLED_EXEC} exists on this host")
def test_verify_reports_a_missing_binary(tmp_path: Path) -> None:
    """Unrewritten, the unit fails verify on a host without /usr/local/bin/sharderd: ExecStart is checked."""
    path = tmp_path / "sharderd.service"
    shutil.copyfile(UNIT, path)
    result = analyze("verify", "--man=no", str(path))
    assert result.returncode != 0 and INSTALLED_EXEC in result.stderr


@needs_analyze
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exposure_is_within_threshold(tmp_path: Path, variant: str) -> None:
    """`systemd-analyze security --offline=yes` rates each variant at most 3.0."""
    assert exposure(install_unit(tmp_path, variant)) <= EXPOSURE_THRESHOLD


@needs_analyze
def test_recorded_exposure_matches_this_systemd(tmp_path: Path) -> None:
    """The exposure table in systemd/README.md (and docs/security.md) is what this systemd measures."""
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Exposure") :]
    recorded_version = re.search(r"Measured with systemd (\d+)", section)
    assert recorded_version, "systemd/README.md must say which systemd measured the exposure"
    installed = re.match(r"systemd (\d+)", analyze("--version").stdout)
    if not installed or installed.group(1) != recorded_version.group(1):
        pytest.skip(
            f"scores were recorded with systemd {recorded_version.group(1)}; weights differ between versions"
        )
    recorded = [
        float(v) for v in re.findall(r"^\|[^|\n]+\| (\d+\.\d) \w+ \|$", section, flags=re.MULTILINE)
    ]
    measured = []
    for variant in VARIANTS:
        folder = tmp_path / variant
        folder.mkdir()
        measured.append(exposure(install_unit(folder, variant)))
    assert recorded == measured
    security = SECURITY_DOC.read_text(encoding="utf-8")
    assert all(f"{value:.1f}" in security for value in measured)


@pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None,
    reason="systemd-sysusers / systemd-tmpfiles are not installed (Debian: apt-get install systemd)",
)
@pytest.mark.skipif(
    os.geteuid() != 0, reason="systemd-tmpfiles --root must chown to the new accounts: run as root"
)
def test_sysusers_and_tmpfiles_build_the_layout(tmp_path: Path) -> None:
    """systemd-sysusers and systemd-tmpfiles, run on an empty root, create the accounts and folders as documented."""
    (tmp_path / "etc").mkdir()
    for tool, args in (
        ("systemd-sysusers", [str(SYSUSERS)]),
        ("systemd-tmpfiles", ["--create", str(TMPFILES)]),
    ):
        result = subprocess.run(
            [tool, f"--root={tmp_path}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"{tool}: {result.stderr}"
    passwd = {
        f[0]: f
        for f in (line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines())
    }
    group = {
        f[0]: f
        for f in (line.split(":") for line in (tmp_path / "etc/group").read_text().splitlines())
    }
    uid, gid, home = int(passwd["sharderd"][2]), int(passwd["sharderd"][3]), passwd["sharderd"][5]
    submit_gid = int(group["sharderd-submit"][2])
    assert home == "/var/lib/sharderd" and "sharderd" in group["sharderd-submit"][3].split(",")
    assert passwd["sharderd"][6].endswith("nologin")
    root = tmp_path / "var/lib/sharderd"
    layout = {
        path.relative_to(root).as_posix(): (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        for path in (root, *sorted(root.iterdir()))
        for st in [path.stat()]
    }
    assert layout == {
        ".": (0o751, uid, gid),
        "inbox": (0o2770, uid, submit_gid),
        "outbox": (0o2750, uid, submit_gid),
        "state": (0o2750, uid, submit_gid),
    }
