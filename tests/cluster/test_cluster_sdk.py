"""A daemon host without the SDK: poprt is where a node offers ``sdk_resource``, not where the daemon is.

A real Ray cluster on loopback, set up as the README's cluster recipe: the head (the daemon's host)
has no CPUs for tasks and cannot import ``poprt``; a worker node joins with the SDK resource and
the fake PopRT on its Python path. Until it joins, a job waits ``schedule_timeout`` and fails
naming the resource; once it has joined, jobs compile on it and are published once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")

from daemon_helpers import (
    chain_model,
    drop,
    pointers,
    results,
    running,
    save_model,
    write_config,
)
from ray_cluster import RayCluster, daemon_cluster_section

from sharderd.cluster.sweeper import sweeper_pid

SDK = "poplar_sdk"
SCHEDULE_TIMEOUT = 4.0


@pytest.fixture
def head_only(tmp_path: Path) -> Iterator[RayCluster]:
    cluster = RayCluster(tmp_path / "ray")
    try:
        cluster.start_head(num_cpus=0, fake_poprt=False)
        yield cluster
    finally:
        cluster.stop()


def _config(cluster: RayCluster, root: Path, backend: str) -> Path:
    config = write_config(root, backend=backend, target="ipu-mk2", max_parallel_compiles=2)
    with open(config, "a") as f:
        f.write(daemon_cluster_section(cluster, root, SDK, schedule_timeout=SCHEDULE_TIMEOUT))
    return config


def _daemon_env(cluster: RayCluster) -> dict[str, str]:
    return {
        **{k: v for k, v in cluster.env(fake_poprt=False).items() if k.startswith("RAY_")},
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def test_the_daemon_host_cannot_import_poprt() -> None:
    """The premise of this module: without the fake on its path, this Python has no poprt."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('poprt') is not None)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


@pytest.mark.parametrize("backend", ["poprt", "auto"])
def test_poprt_runs_where_a_node_offers_the_sdk_resource(
    head_only: RayCluster, tmp_path: Path, backend: str
) -> None:
    root = tmp_path / "d"
    config = _config(head_only, root, backend)
    models = root / "models"
    first = save_model(chain_model(1), models / "first.onnx")
    with running(config, env=_daemon_env(head_only)) as daemon:
        if backend == "poprt":
            drop(first, root / "inbox")
            failed = daemon.wait_for("job.failed", timeout=SCHEDULE_TIMEOUT + 60)[0]
            assert failed["reason"] == "unschedulable", failed
            error = json.loads((root / "state" / "failed" / "first" / "error.json").read_text())
            assert SDK in error["message"] and "schedule_timeout" in error["message"], error
            readable = (root / "state" / "failed" / "first" / "error.md").read_text()
            assert f"ray start --address={head_only.address} --resources='" in readable
            assert f'"{SDK}": 1.0' in readable
        head_only.start_worker(resources={SDK: 1})
        second = save_model(chain_model(2), models / "second.onnx")
        third = save_model(chain_model(3), models / "third.onnx")
        drop(second, root / "inbox")
        drop(third, root / "inbox")
        drop(save_model(chain_model(3), models / "third-again.onnx"), root / "inbox")
        daemon.wait_for("job.succeeded", count=2, timeout=180)
        daemon.wait_for("job.duplicate", timeout=60)
        ran = daemon.events("attempt.ran")
        selected = daemon.events("backend.selected")
    sweeper = sweeper_pid(root / "sweep")
    if sweeper is not None:
        os.kill(sweeper, signal.SIGTERM)
    assert {e["backend"] for e in selected} == {"poprt"}, selected
    # the head has no CPU for tasks: one node ran them all, the worker
    assert ran and all(e["result"] == "ok" for e in ran), ran
    assert len({e["node_id"] for e in ran}) == 1 and ran[0]["node_id"], ran
    published = sorted(p.name for p in results(root / "outbox"))
    duplicates = [p.name for p in pointers(root / "outbox")]
    # whichever copy of the third model settled first is published, the other points at it
    assert published[0] == "second" and len(published) == 2, published
    assert sorted([published[1], *duplicates]) == ["third", "third-again"], duplicates
