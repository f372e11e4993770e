"""``sharderd run`` as a real process on temporary folders: intake, jobs, crashes, signals, systemd.

Every test starts the daemon with ``python -m sharderd.cli run --config CFG`` and waits on its JSON
log lines (``tests/daemon_helpers.py``). Backend ``none`` (plan only) unless the test needs compile
attempts, which the fake poprt (``tests/fake_poprt``) provides. Tests marked ``slow`` run only with
``SHARDERD_SLOW=1``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import pytest
from daemon_helpers import (
    DaemonProcess,
    chain_model,
    cpu_seconds,
    drop,
    marked_processes,
    planworker_hook,
    results,
    running,
    save_model,
    ts,
    write_config,
)

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the daemon reads /proc and uses inotify"
)

run_slow = pytest.mark.skipif(
    not os.environ.get("SHARDERD_SLOW"), reason="slow; set SHARDERD_SLOW=1 to run"
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    return tmp_path


def staged(root: Path, name: str, seed: int = 0, *, name_nodes: bool = True) -> Path:
    """A finished model file outside the inbox (same filesystem), ready to be renamed in."""
    return save_model(chain_model(seed, name_nodes=name_nodes), root / "models" / f"{name}.onnx")


def outcome_names(daemon: DaemonProcess, event: str) -> list[str]:
    return sorted(line["name"] for line in daemon.events(event))


# --- intake -------------------------------------------------------------------------------------


def test_slow_in_place_copy_is_claimed_once_after_it_is_complete(root: Path) -> None:
    """A model written into the inbox in chunks with pauses is claimed once, after the last write."""
    data = staged(root, "slow").read_bytes()
    with running(write_config(root)) as daemon:
        target = root / "inbox" / "slow.onnx"
        chunks = 8
        with open(target, "wb") as f:
            for k in range(chunks):
                f.write(data[k * len(data) // chunks : (k + 1) * len(data) // chunks])
                f.flush()
                daemon.pump(
                    0.25
                )  # shorter than settle_seconds (0.5): the file never looks complete
        last_write = target.stat().st_mtime
        done = daemon.wait_for("job.succeeded", name="slow")
        claimed = daemon.events("job.claimed", name="slow")
        assert len(claimed) == 1
        assert (
            ts(daemon.events("job.detected", name="slow")[0]) < last_write - 1.0
        )  # seen while written
        assert ts(claimed[0]) >= last_write + 0.5 - 0.05  # ...but claimed only once settled
        assert done[0]["job_id"] == claimed[0]["job_id"]
    assert (root / "state" / "done" / "slow" / "slow.onnx").read_bytes() == data
    assert (root / "state" / "done" / "slow" / "report.json").read_bytes() == (
        root / "outbox" / "slow" / "report.json"
    ).read_bytes()
    assert [p.name for p in results(root / "outbox")] == ["slow"]


def test_part_file_renamed_in_is_exactly_one_job_and_staging_names_none(root: Path) -> None:
    """Staging names never become jobs; a ``.part`` renamed to ``.onnx`` is one job, claimed fast."""
    inbox = root / "inbox"
    inbox.mkdir()
    model = staged(root, "m").read_bytes()
    sentinel = staged(root, "sentinel", seed=1)  # written now, renamed in later: the fast path
    for name in ("x.onnx.part", "y.onnx.tmp", "z.onnx~", ".hidden.onnx"):
        (inbox / name).write_bytes(model)
    with running(write_config(root, settle_seconds=2.0)) as daemon:
        part = inbox / ".m.onnx.part"
        part.write_bytes(model)
        daemon.pump(0.2)
        part.rename(inbox / "m.onnx")
        renamed = (inbox / "m.onnx").stat().st_ctime
        daemon.wait_for("job.succeeded", name="m")
        sentinel = drop(sentinel, inbox)
        daemon.wait_for("job.succeeded", name="sentinel")
        assert [ln["name"] for ln in daemon.events("job.detected")] == ["m", "sentinel"]
        claimed = daemon.events("job.claimed", name="m")
        assert len(claimed) == 1
        assert ts(claimed[0]) - renamed < 1.5  # the rename fast path, not the 2 s settle window
    assert sorted(p.name for p in inbox.iterdir()) == [
        ".hidden.onnx",
        "x.onnx.part",
        "y.onnx.tmp",
        "z.onnx~",
    ]
    assert not sentinel.exists()


def test_folder_job_with_external_data_and_sidecar(root: Path) -> None:
    """A folder renamed in is one job: external data loaded, its sidecar applied, nothing inside a job."""
    folder = root / "models" / "big"
    save_model(chain_model(3, hidden=32), folder / "net.onnx", external_data=True)
    (folder / "sharderd.toml").write_text("devices = 3\npriority = 5\n")
    assert (folder / "net.data").stat().st_size > 10_000
    with running(write_config(root)) as daemon:
        drop(folder, root / "inbox")
        daemon.wait_for("job.succeeded", name="big")
        assert len(daemon.events("job.detected")) == 1
        assert daemon.events("job.claimed")[0]["priority"] == 5
    out = root / "outbox" / "big"
    report = json.loads((out / "report.json").read_text())
    assert (
        report["model"]["external_bytes"]
        == (root / "state" / "done" / "big" / "big" / "net.data").stat().st_size
    )
    assert len(report["plan"]["stages"]) == 3
    sharded = onnx.load(str(out / "net.sharded.onnx"))  # loads its external data from the outbox
    assert (
        sum(len(t.raw_data) for t in sharded.graph.initializer) >= report["model"]["external_bytes"]
    )


def test_bad_inputs_land_in_failed_with_a_readable_reason(root: Path) -> None:
    """Corrupt, non-ONNX, unnamed-node and escaping-data jobs fail readably; a good job still finishes."""
    models = root / "models"
    good = staged(root, "good", seed=1)
    corrupt = models / "corrupt.onnx"
    corrupt.write_bytes(staged(root, "tmp", seed=2).read_bytes()[:-200])
    text = models / "text.onnx"
    text.write_text("this is a README, not a model\n" * 20)
    unnamed = staged(root, "unnamed", seed=3, name_nodes=False)
    escape = models / "escape"
    save_model(chain_model(4, hidden=32), escape / "net.onnx", external_data=True)
    proto = onnx.load(str(escape / "net.onnx"), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../secret.bin"
    onnx.save(proto, str(escape / "net.onnx"))
    (root / "inbox").mkdir()
    (root / "inbox" / "secret.bin").write_bytes(b"\0" * 100_000)  # what the model would read
    sidecar = staged(root, "typo", seed=5)
    (models / "typo.toml").write_text("devicez = 2\n")
    with running(write_config(root)) as daemon:
        for path in (
            corrupt,
            text,
            unnamed,
            escape,
            typo_toml := models / "typo.toml",
            sidecar,
            good,
        ):
            drop(path, root / "inbox")
        daemon.wait_for("job.failed", count=5)
        daemon.wait_for("job.succeeded", name="good")
        assert outcome_names(daemon, "job.failed") == [
            "corrupt",
            "escape",
            "text",
            "typo",
            "unnamed",
        ]
    assert not typo_toml.exists()
    failed = root / "state" / "failed"
    expect = {
        "corrupt": "looks incomplete",
        "text": "is not an ONNX model",
        "unnamed": "non-empty name",
        "escape": "'../secret.bin' contains '..'",
        "typo": "unknown key 'devicez'",
    }
    for name, needle in expect.items():
        error = json.loads((failed / name / "error.json").read_text())
        readable = (failed / name / "error.md").read_text()
        assert error["reason"] in {"bad_model", "bad_config"}, (name, error)
        assert needle in readable, (name, readable)
        assert "What to do" in readable
    assert (failed / "corrupt" / "corrupt.onnx").exists()  # the input is kept beside the reason
    assert [p.name for p in results(root / "outbox")] == ["good"]


def test_same_content_twice_is_sharded_once(root: Path) -> None:
    """Two names with the same bytes and options: one result, the other a duplicate pointing at it."""
    first = staged(root, "first", seed=7)
    second = root / "models" / "second.onnx"
    second.write_bytes(first.read_bytes())
    with running(write_config(root)) as daemon:
        drop(first, root / "inbox")
        drop(second, root / "inbox")
        daemon.wait_for("job.succeeded")
        duplicate = daemon.wait_for("job.duplicate")[0]
        original = daemon.events("job.succeeded")[0]
        assert duplicate["original_job_id"] == original["job_id"]
        assert duplicate["result"] == original["result"]
    assert len(results(root / "outbox")) == 1
    assert sorted(p.name for p in (root / "state" / "done").iterdir()) == ["first", "second"]
    report = json.loads(
        (root / "state" / "done" / duplicate["name"] / "report.json").read_text()
    )  # the pointer's
    assert (
        report["status"] == "duplicate" and report["duplicate_of"]["result"] == original["result"]
    )


def _many_models(root: Path, count: int) -> None:
    names = [f"m{k:03d}" for k in range(count)]
    staged_paths = [staged(root, name, seed=k) for k, name in enumerate(names)]
    # Polling only (as on NFS): no inotify, and a rescan too rare to be what finds them.
    config = write_config(root, watch_mode="poll", poll_interval=0.3, rescan_interval=60.0)
    with running(config) as daemon:
        assert daemon.events("watch.started")[0]["mode"] == "poll"
        for path in staged_paths:
            drop(path, root / "inbox")
        daemon.wait_for("job.succeeded", count=count, timeout=30 + count * 2)
        claimed = [ln["name"] for ln in daemon.events("job.claimed")]
        assert sorted(claimed) == names  # each once
        assert outcome_names(daemon, "job.succeeded") == names
        assert not daemon.events("job.failed")
    assert [p.name for p in results(root / "outbox")] == names
    assert not list((root / "state" / "processing").iterdir())


def test_ten_models_dropped_at_once_each_finish_once(root: Path) -> None:
    """Ten models renamed in at once all finish, each exactly once."""
    _many_models(root, 10)


@pytest.mark.slow
@run_slow
def test_a_hundred_models_dropped_at_once_each_finish_once(root: Path) -> None:
    """A hundred models renamed in at once all finish, each exactly once."""
    _many_models(root, 100)


def test_jobs_waiting_at_start_are_claimed_highest_priority_first(root: Path) -> None:
    """Models already in the inbox at start-up are processed, a sidecar priority claimed first;
    with ``keep_input = false`` the inputs are deleted, not kept in ``done/``."""
    inbox = root / "inbox"
    for k, name in enumerate(("a", "b", "c", "urgent")):
        save_model(chain_model(30 + k), inbox / f"{name}.onnx")
    (inbox / "urgent.toml").write_text("priority = 9\n")
    with running(write_config(root, keep_input=False)) as daemon:
        daemon.wait_for("job.succeeded", count=4)
        assert [ln["name"] for ln in daemon.events("job.claimed")] == ["urgent", "a", "b", "c"]
        assert daemon.events("job.claimed", name="urgent")[0]["priority"] == 9
    assert [p.name for p in results(root / "outbox")] == ["a", "b", "c", "urgent"]
    assert list(inbox.iterdir()) == [] and list((root / "state" / "done").iterdir()) == []


def test_deleted_inbox_is_recreated_and_watched_again(root: Path) -> None:
    """Removing the inbox: the rescan recreates it, restarts the watch, and new files are jobs."""
    with running(write_config(root)) as daemon:
        (root / "inbox").rmdir()
        daemon.wait_for("watch.restarted", timeout=10)
        assert (root / "inbox").is_dir()
        drop(staged(root, "after"), root / "inbox")
        daemon.wait_for("job.succeeded", name="after")


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


def test_planning_worker_killed_every_run_fails_after_max_attempts(root: Path) -> None:
    """A job whose planning worker is SIGKILLed each run is retried, then failed as worker_crashed."""
    staged(root, "doomed")
    env = planworker_hook(root, "os.kill(os.getpid(), signal.SIGKILL)")
    with running(write_config(root, max_attempts=2), env=env) as daemon:
        drop(root / "models" / "doomed.onnx", root / "inbox")
        failed = daemon.wait_for("job.failed", name="doomed")[0]
        assert failed["reason"] == "worker_crashed"
        assert len(daemon.events("job.retried")) == 1
    error = json.loads((root / "state" / "failed" / "doomed" / "error.json").read_text())
    assert error["reason"] == "worker_crashed" and "2 runs" in error["message"]
    record = next((root / "state" / "journal").glob("*.json"))
    assert json.loads(record.read_text())["attempts"] == 2


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
        daemon.pump(0.5)
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


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = str(tmp_path / "notify.sock")
    sock.bind(address)
    sock.setblocking(False)
    yield address, sock
    sock.close()


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
        daemon.pump(0.5)
        before = cpu_seconds(daemon.pid)
        daemon.pump(2.0)
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
