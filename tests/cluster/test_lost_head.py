"""A Ray head killed under a running daemon: a real cluster on loopback, a real daemon process.

Generation 1: a job's attempt runs on the worker node when the whole head node is killed. The
daemon logs ``cluster.lost``, keeps pinging systemd's watchdog, claims the next job (which waits for
the head instead of blocking the event loop), and after ``[cluster] head_timeout`` stops with exit 4
and ``daemon.stopped`` (reason ``cluster_lost``); both jobs stay in ``processing/``.

Generation 2, a new head: the restarted daemon resumes both jobs from its journal and publishes
each once. Its head is killed too, a third job arrives and waits, and SIGTERM stops the daemon
at once (exit 0), the third job left for the next start.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

from daemon_helpers import DaemonProcess, chain_model, drop, results, save_model, write_config
from ray_cluster import WORKER_RESOURCE, RayCluster, daemon_cluster_section

from sharderd.cluster.head import PROBE_EVERY_S, PROBE_TIMEOUT_S
from sharderd.errors import EXIT_BACKEND_UNAVAILABLE

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc, inotify, sd_notify")

HEAD_TIMEOUT = 15.0
NOTICED = PROBE_EVERY_S + PROBE_TIMEOUT_S + 10.0
"""A loss is logged within one probe interval and one probe timeout (and slack for a loaded VM)."""
STOPPED = 60.0
"""The stop after the timeout: each job's Ray task cancelled (bounded), then ray.shutdown (10 s)."""


def _config(cluster: RayCluster, root: Path, head_timeout: float) -> Path:
    config = write_config(
        root,
        backend="poprt",
        target="ipu-mk2",
        max_parallel_compiles=2,
        max_attempts=3,
        kill_grace=1.0,
    )
    with open(config, "a") as f:
        f.write(
            daemon_cluster_section(
                cluster,
                root,
                WORKER_RESOURCE,
                schedule_timeout=60.0,
                cancel_margin=2.0,
                head_timeout=head_timeout,
                env_passthrough=["FAKE_POPRT_COMPILE_SECONDS"],
            )
        )
    return config


def _daemon(
    cluster: RayCluster, config: Path, compile_s: float, notify: str | None = None
) -> DaemonProcess:
    env = {
        **{k: v for k, v in cluster.env().items() if k.startswith("RAY_")},
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "FAKE_POPRT_COMPILE_SECONDS": str(compile_s),
    }
    if notify is not None:
        env.update({"NOTIFY_SOCKET": notify, "WATCHDOG_USEC": "1000000"})
    return DaemonProcess(config, env=env, fake_poprt=True)


def _pings(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            count += sock.recv(4096) == b"WATCHDOG=1"
        except BlockingIOError:
            return count


def _journal(root: Path) -> list[tuple[str, str]]:
    records = [json.loads(p.read_text()) for p in (root / "state" / "journal").glob("*.json")]
    return sorted((r["name"], r["state"]) for r in records)


def _new_cluster(root: Path) -> RayCluster:
    cluster = RayCluster(root)
    cluster.start_head(num_cpus=0)
    cluster.start_worker()
    return cluster


def test_a_lost_head_stops_the_daemon_cleanly_and_a_new_head_finishes_its_jobs(
    tmp_path: Path, notify_socket: tuple[str, socket.socket]
) -> None:
    root = tmp_path / "d"
    models = root / "models"
    first, second, third = (
        save_model(chain_model(seed), models / f"{name}.onnx")
        for seed, name in ((1, "first"), (2, "second"), (3, "third"))
    )
    address, sock = notify_socket
    cluster = _new_cluster(tmp_path / "ray1")
    try:
        daemon = _daemon(cluster, _config(cluster, root, HEAD_TIMEOUT), 120.0, address)
        try:
            daemon.ready(timeout=60)
            drop(first, root / "inbox")
            daemon.wait_until(
                lambda: any((root / "shared").glob("*/*/started.json")), 90, "the attempt to run"
            )
            cluster.nodes[0].kill()  # the head node: GCS, raylet and all
            lost = daemon.wait_for("cluster.lost", timeout=NOTICED)[0]
            assert lost["address"] == cluster.address and lost["level"] == "error"
            drop(second, root / "inbox")  # the next job: claimed, waits for the head
            daemon.wait_for("job.claimed", name="second", timeout=30)
            _pings(sock)
            daemon.pump(3.0)  # the test's input: a stretch of the loss to count pings in
            assert _pings(sock) >= 2  # every second: the event loop is not blocked
            assert daemon.wait_exit(timeout=HEAD_TIMEOUT + STOPPED) == EXIT_BACKEND_UNAVAILABLE
            stopping = daemon.events("daemon.stopping", reason="cluster_lost")
            assert stopping and stopping[0]["shutdown"] == "kill", daemon.tail()
            stopped = daemon.events("daemon.stopped")[0]
            assert (stopped["reason"], stopped["exit_code"]) == ("cluster_lost", 4)
            assert stopped["left_in_processing"] == 2
            assert "head_timeout" in daemon.stderr and "Traceback" not in daemon.stderr
            assert not daemon.events("job.failed")
        finally:
            daemon.close()
    finally:
        cluster.stop()
    assert _journal(root) == [("first", "claimed"), ("second", "claimed")]

    cluster = _new_cluster(tmp_path / "ray2")
    try:
        config = _config(cluster, root, 300.0)
        daemon = _daemon(cluster, config, 1.0)
        try:
            daemon.ready(timeout=60)
            daemon.wait_for("job.succeeded", count=2, timeout=180)
            assert len(daemon.events("job.resumed")) == 2
            cluster.nodes[0].kill()
            daemon.wait_for("cluster.lost", timeout=NOTICED)
            drop(third, root / "inbox")
            daemon.wait_for("job.claimed", name="third", timeout=30)
            assert daemon.stop(signal.SIGTERM, timeout=STOPPED) == 0
            assert daemon.events("daemon.stopped")[0]["exit_code"] == 0
        finally:
            daemon.close()
    finally:
        cluster.stop()
    assert sorted(p.name for p in results(root / "outbox")) == ["first", "second"]
    assert _journal(root) == [("first", "succeeded"), ("second", "succeeded"), ("third", "claimed")]
