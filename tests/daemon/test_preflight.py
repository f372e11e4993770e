"""What `sharderd run` refuses at start, said the same by `run`, `check-config` and `doctor`
(issue 38): one list of checks (``daemon.preflight``), real processes for the three commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import REPO
from fake_sdk import make_sdk

from sharderd.backends.poplar_sdk import PoprtProbe
from sharderd.config import Config, config_from_dict
from sharderd.daemon.preflight import Host, failures, preflight

POPRT = PoprtProbe("1.5.0", None, 16, "ipu2")
NO_POPRT = PoprtProbe(None, "ModuleNotFoundError: No module named 'poprt'", not_installed=True)


def host(*, euid: int = 1000, missing: tuple[str, ...] = (), poprt: PoprtProbe = POPRT) -> Host:
    return Host(euid=euid, importable=lambda name: name not in missing, probe=lambda: poprt)


def config(root: Path | None = None, **daemon: Any) -> Config:
    folders = (
        {}
        if root is None
        else {
            "inbox": str(root / "inbox"),
            "outbox": str(root / "outbox"),
            "state_dir": str(root / "state"),
            "runtime_dir": str(root / "run"),
        }
    )
    return config_from_dict({"daemon": {**folders, **daemon}}, "test")


def test_a_good_host_passes_every_check() -> None:
    checks = preflight(config(), host())
    assert [c.subject for c in checks] == ["root", "metrics", "cluster", "backend", "folders"]
    assert [c.problem for c in checks] == [None] * 5
    assert (
        dict((c.subject, c.ok) for c in checks)["backend"]
        == "backend auto: poprt 1.5.0 compiles jobs"
    )


def test_root_is_refused_unless_allowed() -> None:
    (err,) = failures(config(), host(euid=0))
    assert err.message.startswith("refusing to run as root") and "allow_root = true" in str(
        err.hint
    )
    assert failures(config(allow_root=True), host(euid=0)) == []


def test_metrics_port_needs_prometheus_client() -> None:
    (err,) = failures(config(metrics_port=9099), host(missing=("prometheus_client",)))
    assert "metrics_port = 9099 needs the prometheus-client package" in err.message
    assert failures(config(metrics_port=9099), host()) == []
    assert failures(config(), host(missing=("prometheus_client",))) == []  # no port, no need


def test_auto_on_an_ipu_target_needs_poprt_and_says_the_fix() -> None:
    (err,) = failures(config(), host(poprt=NO_POPRT))
    assert err.message.startswith('backend = "auto" with the IPU target ipu-mk2 needs PopRT')
    assert "No module named 'poprt'" in err.message and "nothing compiled" in err.message
    assert "sharderd sdk-env" in str(err.hint) and 'backend = "onnxruntime"' in str(err.hint)


@pytest.mark.parametrize(
    ("daemon", "cfg", "refused"),
    [
        ({"backend": "poprt"}, {}, True),  # asked for and absent
        ({"backend": "onnxruntime"}, {}, False),  # asked for: verifies on purpose
        ({"backend": "none"}, {}, False),
        ({}, {"target": {"name": "cpu"}}, False),  # auto on a CPU target: onnxruntime is right
        (
            {},
            {"cluster": {"engine": "ray", "shared_dir": "/srv/s", "sdk_resource": "poplar_sdk"}},
            False,
        ),  # the nodes compile
        (
            {},
            {"cluster": {"engine": "ray", "shared_dir": "/srv/s"}},
            True,
        ),  # no resource: poprt must import here
    ],
)
def test_which_backends_need_poprt_here(
    daemon: dict[str, Any], cfg: dict[str, Any], refused: bool
) -> None:
    the_config = config_from_dict({"daemon": daemon, **cfg}, "test")
    problems = [e.message for e in failures(the_config, host(poprt=NO_POPRT))]
    assert any("poprt does not import" in m for m in problems) is refused, problems


def test_onnxruntime_asked_for_but_missing_is_refused() -> None:
    (err,) = failures(config(backend="onnxruntime"), host(missing=("onnxruntime",)))
    assert err.message == 'backend = "onnxruntime" in [daemon], but onnxruntime is not installed'


def test_ray_engine_needs_ray() -> None:
    the_config = config_from_dict(
        {"cluster": {"engine": "ray", "shared_dir": "/srv/s"}, "daemon": {"backend": "none"}}, "t"
    )
    (err,) = failures(the_config, host(missing=("ray",)))
    assert err.message == '[cluster] engine = "ray" needs the ray package, which is not installed'


def test_folders_inside_each_other_are_refused(tmp_path: Path) -> None:
    the_config = config(inbox=str(tmp_path / "box"), outbox=str(tmp_path / "box" / "out"))
    (err,) = failures(the_config, host())
    assert "must be separate folders" in err.message


def test_poprt_is_probed_only_when_a_check_needs_it() -> None:
    probed: list[int] = []

    def probe() -> PoprtProbe:
        probed.append(1)
        return POPRT

    failures(config(backend="none"), Host(euid=1000, importable=lambda n: True, probe=probe))
    assert probed == []
    the_host = Host(euid=1000, importable=lambda n: True, probe=probe)
    preflight(config(), the_host)
    preflight(config(), the_host)
    assert probed == [1]  # once per host


# --- the three commands, as processes ---------------------------------------------------------


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(REPO), **(extra or {})}


def _sharderd(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sharderd.cli", *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=timeout,
        check=False,
    )


def _write(root: Path, *, ipus: int | None = None, **daemon: Any) -> Path:
    lines = (
        ([] if ipus is None else ["[poprt]", f"ipus = {ipus}"])
        + ["[daemon]"]
        + [
            f"{k} = {json.dumps(str(v)) if isinstance(v, Path | str) else str(v).lower()}"
            for k, v in {
                "inbox": root / "inbox",
                "outbox": root / "outbox",
                "state_dir": root / "state",
                "runtime_dir": root / "run",
                "allow_root": os.geteuid() == 0,
                **daemon,
            }.items()
        ]
    )
    path = root / "sharderd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _errors(stderr: str) -> list[str]:
    """The ``sharderd: error:`` blocks (message and hint) of stderr."""
    blocks = stderr.split("sharderd: error: ")[1:]
    return [b.strip() for b in blocks]


def test_run_and_check_config_refuse_auto_without_poprt_with_the_same_message(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path)
    run = _sharderd("run", "--config", str(path))
    checked = _sharderd("check-config", str(path), "--env-file", str(tmp_path / "none.env"))
    assert run.returncode == checked.returncode == 2
    assert _errors(checked.stderr) == _errors(run.stderr) and len(_errors(run.stderr)) == 1
    assert "needs PopRT, but poprt does not import" in run.stderr
    refused = [json.loads(line) for line in run.stdout.splitlines()]
    assert [line["event"] for line in refused] == ["daemon.refused"]  # never daemon.started
    assert refused[0]["message"] in run.stderr
    assert not (tmp_path / "inbox").exists()  # refused before touching a folder
    assert "[daemon]" in checked.stdout  # the effective config is still printed


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be refused as root")
def test_run_and_check_config_refuse_root_with_the_same_message(tmp_path: Path) -> None:
    path = _write(tmp_path, backend="none", allow_root=False)
    run = _sharderd("run", "--config", str(path))
    checked = _sharderd("check-config", str(path))
    assert run.returncode == checked.returncode == 2
    assert _errors(checked.stderr) == _errors(run.stderr)
    assert _errors(run.stderr)[0].startswith("refusing to run as root")


def test_check_config_accepts_what_run_accepts(tmp_path: Path) -> None:
    sdk = make_sdk(tmp_path)
    env_file = tmp_path / "poplar-sdk.env"
    assert _sharderd("sdk-env", str(sdk), "--out", str(env_file)).returncode == 0
    path = _write(tmp_path)
    checked = _sharderd("check-config", str(path), "--env-file", str(env_file))
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr


def _doctor(
    tmp_path: Path, *, version: str = "3.4.0", extra: str = "", ipus: int | None = None
) -> tuple[int, list[dict[str, str]]]:
    """``sharderd doctor --json`` on a host with a fake SDK ``version`` (its environment file
    written by ``sdk-env``), the daemon's folders made, and ``[poprt] ipus`` when given."""
    sdk = make_sdk(tmp_path, version, extra)
    env_file = tmp_path / "poplar-sdk.env"
    written = _sharderd("sdk-env", str(sdk), "--out", str(env_file))
    assert written.returncode == 0, written.stderr
    path = _write(tmp_path, ipus=ipus)
    for name in ("inbox", "outbox", "state"):
        (tmp_path / name).mkdir()
    doctor = _sharderd("doctor", "--config", str(path), "--env-file", str(env_file), "--json")
    return doctor.returncode, json.loads(doctor.stdout)


def _failed(findings: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {f["subject"]: f for f in findings if f["level"] == "fail"}


def test_doctor_with_a_fake_sdk_passes_and_names_what_it_saw(tmp_path: Path) -> None:
    code, findings = _doctor(tmp_path)
    assert code == 0 and _failed(findings) == {}, findings
    texts = {f["subject"]: f["text"] for f in findings}
    assert texts["backend"] == "backend auto: poprt 1.5.0 compiles jobs"
    assert texts["poprt"] == "poprt 1.5.0 imports, built for SDK 3.4 as this one (3.4.0)"
    assert texts["ipus"] == "16 IPU(s) visible (ipu2)"
    assert texts["sdk"].endswith("4 variable(s) of the Poplar SDK 3.4.0")


def test_doctor_fails_a_poprt_built_for_another_sdk(tmp_path: Path) -> None:
    code, findings = _doctor(tmp_path, version="3.3.0")
    poprt = _failed(findings)["poprt"]
    assert code == 1
    assert (
        poprt["text"] == "poprt 1.5.0 is built for SDK 3.4, but the environment file's SDK is 3.3.0"
    )
    assert poprt["fix"].startswith(f"sudo {sys.executable} -m pip install --force-reinstall ")


def test_doctor_fails_no_visible_ipu(tmp_path: Path) -> None:
    code, findings = _doctor(tmp_path, extra="export FAKE_POPRT_IPUS=0")
    failed = _failed(findings)
    assert code == 1 and list(failed) == ["ipus"] and failed["ipus"]["text"] == "poprt sees no IPU"
    assert "ipu-devices.conf" in failed["ipus"]["fix"]


@pytest.mark.parametrize(("configured", "fails"), [(5, True), (4, False), (-1, False)])
def test_doctor_fails_more_ipus_configured_than_visible(
    tmp_path: Path, configured: int, fails: bool
) -> None:
    code, findings = _doctor(tmp_path, extra="export FAKE_POPRT_IPUS=4", ipus=configured)
    ipus = next(f for f in findings if f["subject"] == "ipus")
    assert (ipus["level"] == "fail") is fails and (code == 1) is fails
    if fails:
        assert ipus["text"].startswith(f"4 IPU(s) visible (ipu2), but [poprt] ipus = {configured}")


def test_doctor_fails_folders_and_a_missing_environment_file(tmp_path: Path) -> None:
    path = _write(tmp_path)
    doctor = _sharderd(
        "doctor", "--config", str(path), "--env-file", str(tmp_path / "no.env"), "--json"
    )
    assert doctor.returncode == 1
    failed = {
        (f["subject"], f["text"].split(":")[0])
        for f in json.loads(doctor.stdout)
        if f["level"] == "fail"
    }
    assert ("sdk", f"no environment file {tmp_path / 'no.env'}") in failed
    assert (
        "backend",
        'backend = "auto" with the IPU target ipu-mk2 needs PopRT, but poprt does not import in this environment (ModuleNotFoundError',
    ) in failed
    assert {text for subject, text in failed if subject == "folders"} == {
        f"inbox {tmp_path / 'inbox'} does not exist",
        f"outbox {tmp_path / 'outbox'} does not exist",
        f"state_dir {tmp_path / 'state'} does not exist",
    }
    text = _sharderd("doctor", "--config", str(path), "--env-file", str(tmp_path / "no.env"))
    assert (
        "FAIL  sdk" in text.stdout
        and "      " in text.stdout
        and "fix: sudo sharderd sdk-env" in text.stdout
    )
