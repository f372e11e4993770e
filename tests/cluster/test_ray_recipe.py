"""docs/cluster.md's one-host Ray recipe, run as written (its folder, port and token file replaced
by the test's own): usage statistics off, every socket on 127.0.0.1, a driver can join and sees
the SDK resource, and the stop commands end this Ray's processes and no other Ray's."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from ray_cluster import RayCluster, free_port

DOC = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"
_PR_SET_CHILD_SUBREAPER = 36

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc, ss, setsid")


def _block(name: str, home: Path, port: int, token: Path) -> str:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name}:start -->\n```bash\n(.*?)```\n<!-- {name}:end -->", text, re.S)
    assert found, f"docs/cluster.md has no {name} block"
    script = found.group(1)
    for old, new in (
        ("/var/lib/sharderd-ray", str(home)),
        ("RAY_PORT=6379", f"RAY_PORT={port}"),
        ("/etc/sharderd/ray_auth_token", str(token)),
    ):
        script = script.replace(old, new)
    return script


def _session(sid: int, *, zombies: bool = False) -> list[int]:
    """Live processes of session ``sid`` (with its zombies too, when asked)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rfind(")") + 2 :].split()
                if int(fields[3]) == sid and (zombies or fields[0] not in "ZX"):
                    found.append(int(entry.name))
    return found


def _reap(pids: list[int]) -> None:
    """Reap those of ``pids`` that were re-parented to this test (a subreaper) and have exited."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _listening(pids: list[int]) -> list[str]:
    out = subprocess.run(["ss", "-H", "-lntup"], capture_output=True, text=True, check=True).stdout
    wanted = {f"pid={p}," for p in pids}
    return [line.split()[4] for line in out.splitlines() if any(w in line for w in wanted)]


def test_the_one_host_recipe_starts_a_loopback_ray_and_stops_only_it(tmp_path: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0  # orphans come to us: we reap them
    other = RayCluster(tmp_path / "other")  # someone else's Ray on the same host
    # short: Ray's AF_UNIX socket paths under it must fit 107 bytes
    home, port = Path(tempfile.mkdtemp(prefix="rayhome-", dir="/tmp")), free_port()
    token = tmp_path / "token"
    token.write_text("a" * 64)
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    ray_cli = Path(sys.executable).with_name("ray")  # the venv's `ray`, else the one on PATH
    if ray_cli.exists():
        env["PATH"] = os.pathsep.join([str(ray_cli.parent), env.get("PATH", "")])
    sid = 0
    try:
        other_head = other.start_head(num_cpus=0)
        subprocess.run(
            ["bash", "-c", _block("ray-recipe", home, port, token)], env=env, check=True, timeout=60
        )
        deadline = time.monotonic() + 120
        while not (home / "ray.pid").read_text() if (home / "ray.pid").exists() else True:
            assert time.monotonic() < deadline, "no ray.pid"
            select.select([], [], [], 0.05)  # written by the backgrounded shell
        sid = int((home / "ray.pid").read_text())
        log = home / "ray.log"
        while b"Ray runtime started" not in log.read_bytes():
            assert time.monotonic() < deadline and _session(sid), log.read_text()[-3000:]
            select.select([], [], [], 0.2)  # the log is a file: nothing to wait on but time
        assert "Usage stats collection is disabled." in log.read_text()
        addresses = _listening(_session(sid))
        assert len(addresses) >= 3, addresses  # GCS, raylet, object manager at least
        assert {a.rsplit(":", 1)[0] for a in addresses} <= {"127.0.0.1", "[::ffff:127.0.0.1]"}
        driver = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ray; ray.init(address=f'127.0.0.1:{__import__(\"sys\").argv[1]}', "
                "log_to_driver=False); print(ray.cluster_resources().get('poplar_sdk'))",
                str(port),
            ],
            env={
                **env,
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(token),
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_USAGE_STATS_ENABLED": "0",
            },
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert driver.stdout.strip().splitlines()[-1] == "1.0", driver.stderr[-3000:]
        theirs = other_head.descendants()
        stop = subprocess.Popen(["bash", "-c", _block("ray-stop", home, port, token)], env=env)
        started = time.monotonic()
        while True:
            _reap(_session(sid, zombies=True))
            with contextlib.suppress(subprocess.TimeoutExpired):
                stop.wait(0.1)
                break
        assert stop.returncode == 0
        assert time.monotonic() - started < 25
        assert _session(sid) == []
        assert set(theirs) <= set(_session(other_head.proc.pid))  # the other Ray is untouched
        sid = 0
    finally:
        if sid:
            for pid in _session(sid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        other.stop()
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        shutil.rmtree(home, ignore_errors=True)
