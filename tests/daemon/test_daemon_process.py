"""``sharderd run`` as a real process: what only a process shows (signals, kill -9, systemd's
socket, exit codes, its CPU time) on temporary folders.

Each test starts ``python -m sharderd.cli run --config CFG`` and waits on its JSON log lines
(``tests/daemon_helpers.py``); the daemon's logic (intake, claims, queue, journal, filing) is
tested in the test's own event loop in ``test_service.py``. Backend ``none`` (plan only) unless the
test needs compile attempts, which the fake poprt (``tests/fake_poprt``) provides.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from daemon_helpers import (
    DaemonProcess,
    cpu_seconds,
    drop,
    marked_processes,
    planworker_hook,
    results,
    running,
    staged,
    write_config,
)

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)


def outcome_names(daemon: DaemonProcess, event: str) -> list[str]:
    return sorted(line["name"] for line in daemon.events(event))


# --- crashes, signals -----------------------------------------------------------------------------


def poprt_config(root: Path, **daemon: object) -> Path:
    return write_config(root, backend="poprt", target="ipu-mk2", max_parallel_compiles=2, **daemon)


def test_kill_9_during_an_attempt_then_restart_ends_every_job_once(root: Path) -> None:
    """kill -9 mid-compile, restart: strays killed, each job ends once, no partial result is named."""
    names = ["a", "b", "c"]
    for k, name in enumerate(names):
        staged(root, name, seed=10 + k)
    config = poprt_config(root)
    first = DaemonProcess(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "30"})
    try:
        first.ready()
        for name in names:
            drop(root / "models" / f"{name}.onnx", root / "inbox")
        first.wait_for("attempt.started", count=2)
        first.kill9()
        assert results(root / "outbox") == []  # nothing published, nothing partial
        orphans = marked_processes(first.token)
        assert orphans  # its compiles outlived it (no systemd cgroup here to clean up)
        with running(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "0.2"}) as second:
            recovered = second.events("journal.recovered")[0]
            assert recovered["killed_strays"] and set(recovered["killed_strays"]) <= set(orphans)
            assert marked_processes(first.token) == []
            assert (
                len(recovered["removed"]) == 3 and recovered["resume"] == 3
            )  # .tmp-* swept, all queued
            second.wait_for("job.succeeded", count=3, timeout=60)
            assert outcome_names(second, "job.succeeded") == names
            resumed = {ln["job_id"] for ln in second.events("job.resumed")}
            assert resumed == {ln["job_id"] for ln in first.events("job.claimed")}
            assert not second.events("job.claimed")
    finally:
        first.close()
    for name in names:
        out = root / "outbox" / name
        assert (out / ".sharderd-job").is_file() and (out / f"{name}.popef").is_file()
    assert sorted(p.name for p in (root / "outbox").iterdir()) == names  # no .tmp-* left either
    assert not list((root / "state" / "processing").iterdir())


def test_sigterm_kills_attempts_exits_0_and_resumes_after_restart(root: Path) -> None:
    """SIGTERM with compiles running: exit 0, no process of ours left, the jobs finish after restart."""
    for k, name in enumerate(("p", "q")):
        staged(root, name, seed=20 + k)
    config = poprt_config(root)
    daemon = DaemonProcess(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "30"})
    try:
        daemon.ready()
        for name in ("p", "q"):
            drop(root / "models" / f"{name}.onnx", root / "inbox")
        daemon.wait_for("attempt.started", count=2)
        status = daemon.wait_status(
            root / "run",
            lambda s: s["pool"]["busy"] == 2,
            "both compiles in the pool",
            timeout=25.0,  # under CI load the second subprocess can take seconds to start; each compile lasts 30 s
        )
        assert status["pid"] == daemon.pid and status["state"] == "ready"
        assert status["queue"]["running"] == 2 and status["pool"]["busy"] == 2
        assert {j["stage"] for j in status["running"]} == {"compiling"}
        assert marked_processes(daemon.token) != [daemon.pid]
        assert daemon.stop(signal.SIGTERM, timeout=15) == 0
        assert "Traceback" not in daemon.stderr
        assert marked_processes(daemon.token) == []
        assert len(daemon.events("job.cancelled")) == 2
        assert len(list((root / "state" / "processing").iterdir())) == 2
        assert json.loads((root / "run" / "status.json").read_text())["state"] == "stopped"
    finally:
        daemon.close()
    with running(config, fake_poprt=True, env={"FAKE_POPRT_COMPILE_SECONDS": "0"}) as again:
        again.wait_for("job.succeeded", count=2, timeout=60)
        assert len(again.events("job.resumed")) == 2
        assert not again.events("job.claimed")
    assert [p.name for p in results(root / "outbox")] == ["p", "q"]


def test_drain_lets_running_jobs_finish_and_extends_the_stop_timeout(
    root: Path, notify_socket: tuple[str, socket.socket]
) -> None:
    """``shutdown = "drain"``: SIGTERM waits for the running job, asks systemd for time, exits 0."""
    address, sock = notify_socket
    env = {**planworker_hook(root, "time.sleep(2)"), "NOTIFY_SOCKET": address}
    daemon = DaemonProcess(write_config(root, shutdown="drain", shutdown_timeout=30.0), env=env)
    try:
        daemon.ready()
        drop(staged(root, "slowplan"), root / "inbox")
        daemon.wait_for("backend.selected")  # the job is running: its planning worker is starting
        assert daemon.stop(signal.SIGTERM, timeout=30) == 0
        events = [ln["event"] for ln in daemon.lines]
        assert events.index("daemon.stopping") < events.index("job.succeeded")
        assert not daemon.events("job.cancelled")
        assert any(m.startswith("EXTEND_TIMEOUT_USEC=") for m in drain(sock, []))
    finally:
        daemon.close()
    assert [p.name for p in results(root / "outbox")] == ["slowplan"]
    assert not list((root / "state" / "processing").iterdir())


def test_second_signal_cancels_a_drain_at_once(root: Path) -> None:
    """While draining, a second SIGTERM cancels the job, kills its worker and exits 0 promptly."""
    env = planworker_hook(root, "time.sleep(120)")
    daemon = DaemonProcess(write_config(root, shutdown="drain", shutdown_timeout=120.0), env=env)
    try:
        daemon.ready()
        drop(staged(root, "stuck"), root / "inbox")
        daemon.wait_for("backend.selected")
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.wait_for("daemon.stopping")
        daemon.pump(0.5)  # the test's input: how long it watches the drain not end by itself
        assert daemon.proc.poll() is None  # still draining
        assert daemon.stop(signal.SIGTERM, timeout=10) == 0
        assert daemon.events("daemon.stopping", force=True)
        assert daemon.events("job.cancelled", name="stuck")
        assert marked_processes(daemon.token) == []
        assert "Traceback" not in daemon.stderr
    finally:
        daemon.close()
    assert len(list((root / "state" / "processing").iterdir())) == 1  # left for the next start
    record = json.loads(next((root / "state" / "journal").glob("*.json")).read_text())
    assert record["attempts"] == 0  # a shutdown is not a crash: the run is not counted


# --- systemd, idle, start-up ------------------------------------------------------------------------


def drain(sock: socket.socket, into: list[str]) -> list[str]:
    """Move every datagram waiting on ``sock`` into ``into`` (the queue holds only a few)."""
    while True:
        try:
            into.append(sock.recv(4096).decode())
        except BlockingIOError:
            return into


def test_notify_socket_gets_ready_status_watchdog_and_stopping(
    root: Path, notify_socket: tuple[str, socket.socket]
) -> None:
    """READY=1 after start-up, STATUS= with counts, WATCHDOG=1 every WATCHDOG_USEC/2, STOPPING=1;
    the planning worker does not inherit the notify variables."""
    address, sock = notify_socket
    seen_by_worker = root / "worker-env.json"
    hook = planworker_hook(
        root,
        f"open({str(seen_by_worker)!r}, 'w').write(__import__('json').dumps(sorted(os.environ)))",
    )
    env = {**hook, "NOTIFY_SOCKET": address, "WATCHDOG_USEC": "500000"}
    daemon = DaemonProcess(write_config(root), env=env)
    got: list[str] = []

    def seen(predicate: Callable[[str], bool], count: int = 1) -> bool:
        return sum(map(predicate, drain(sock, got))) >= count

    try:
        daemon.wait_until(lambda: seen(lambda m: m.startswith("READY=1")), 30, "READY=1")
        assert daemon.events(
            "daemon.ready"
        )  # READY=1 only once the watcher and the first scan are up
        drop(staged(root, "one"), root / "inbox")
        daemon.wait_until(
            lambda: seen(lambda m: "STATUS=" in m and "1 succeeded" in m),
            30,
            "a STATUS= with the result",
        )
        assert any("1 running" in m for m in got if "STATUS=" in m)
        pings = sum(m == "WATCHDOG=1" for m in got)
        daemon.pump(1.0)  # a rate needs a stretch of time: four pings are due (every 0.25 s)
        assert sum(m == "WATCHDOG=1" for m in drain(sock, got)) - pings >= 3
        assert daemon.stop() == 0
        assert seen(lambda m: m.startswith("STOPPING=1"))
        assert not [ln for ln in daemon.lines if ln["event"] == "notify.failed"]
        worker_env = set(json.loads(seen_by_worker.read_text()))
        assert "PYTHONPATH" in worker_env and not worker_env & {
            "NOTIFY_SOCKET",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
        }
    finally:
        daemon.close()


def test_idle_daemon_uses_no_cpu(root: Path) -> None:
    """Idle for 2 s (watching, rescanning every second), the daemon uses under 0.1 s of CPU."""
    with running(write_config(root)) as daemon:
        daemon.pump(0.5)  # the test's input: start-up's own CPU settles out of the measure
        before = cpu_seconds(daemon.pid)
        daemon.pump(2.0)  # the test's input: the idle stretch measured
        assert cpu_seconds(daemon.pid) - before < 0.1


def test_start_up_errors_exit_2_naming_the_path(root: Path) -> None:
    """An inbox path that is a file is refused at start-up with exit 2 and its path, no traceback."""
    (root / "inbox").write_text("not a folder")
    daemon = DaemonProcess(write_config(root))
    try:
        assert daemon.wait_exit(30) == 2
        assert str(root / "inbox") in daemon.stderr and "Traceback" not in daemon.stderr
    finally:
        daemon.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to check the refusal")
def test_refuses_root_without_allow_root(root: Path) -> None:
    """Running as root without ``allow_root`` exits 2 with a message saying so."""
    daemon = DaemonProcess(write_config(root, allow_root=False))
    try:
        assert daemon.wait_exit(30) == 2
        assert "refusing to run as root" in daemon.stderr
    finally:
        daemon.close()
