"""Attempts on a real two-node Ray cluster on loopback (head + one worker; no mocks).

The cluster (``tests/ray_cluster.py``) is started once for the module; attempts ask for a resource
only the worker node has, so they never run on the head, where this test's driver is. Tests that
kill the worker start a new one before they end.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog.testing

ray = pytest.importorskip("ray")

from daemon_helpers import chain_model, drop, results, running, save_model, write_config  # noqa: E402
from fault_backend import PID_FILE  # noqa: E402
from ray_cluster import WORKER_RESOURCE, RayCluster  # noqa: E402

from sharderd.backends.attempt import run_attempt  # noqa: E402
from sharderd.backends.pool import AttemptPool  # noqa: E402
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest  # noqa: E402
from sharderd.cluster.errors import AttemptLostError, UnschedulableError  # noqa: E402
from sharderd.cluster.executor import RayRunner  # noqa: E402
from sharderd.cluster.results import accept_result  # noqa: E402
from sharderd.cluster.staging import stage_attempt  # noqa: E402
from sharderd.cluster.sweeper import sweeper_pid  # noqa: E402
from sharderd.config import ClusterConfig  # noqa: E402

ARTIFACT_WORKER = Path(__file__).parent.parent / "children" / "artifact_worker.py"
KILL_GRACE = 1.0
_PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    c = RayCluster(tmp_path_factory.mktemp("ray"))
    saved = dict(os.environ)
    try:
        c.start_head()
        c.start_worker()
        # This process is a driver too: same token, and Ray must not swap 127.0.0.1 for the external address.
        os.environ.update({k: v for k, v in c.env().items() if k.startswith("RAY_")})
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = (
            False  # read at import, before the line above
        )
        ray._raylet.Config.initialize("")  # so is the auth mode, and the token is cached
        ray._raylet.AuthenticationTokenLoader.instance().reset_cache()
        yield c
    finally:
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = True
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def runner(cluster: RayCluster, tmp_path: Path) -> Iterator[RayRunner]:
    r = RayRunner(_cluster_config(cluster, tmp_path))
    r.connect()
    yield r
    r.close()
    _stop_sweeper(tmp_path / "sweep")


def _stop_sweeper(sweep_dir: Path) -> None:
    """The node's sweeper would idle for a minute after the test; end it now."""
    pid = sweeper_pid(sweep_dir)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)


def _cluster_config(cluster: RayCluster, root: Path, **overrides: Any) -> ClusterConfig:
    settings: dict[str, Any] = {
        "engine": "ray",
        "address": cluster.address,
        "shared_dir": root / "shared",
        "sweep_dir": root / "sweep",
        "sdk_resource": WORKER_RESOURCE,
        "schedule_timeout": 30.0,
        "cancel_margin": 2.0,
        **overrides,
    }
    return ClusterConfig(**settings)


def _worker_node_id() -> str:
    ids = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(WORKER_RESOURCE)]
    assert len(ids) == 1, ray.nodes()
    return ids[0]


def _attempt_dir(root: Path, name: str = "attempt-0") -> Path:
    workdir = root / "job" / "run-1" / name
    workdir.mkdir(parents=True)
    (workdir / "model.onnx").write_bytes(b"not really a model")
    return workdir


def _request(workdir: Path, **options: Any) -> AttemptRequest:
    return AttemptRequest(
        backend="fault",
        model=str(workdir / "model.onnx"),
        artifact=str(workdir / "model.popef"),
        num_devices=2,
        options=options,
    )


async def _run(
    runner: RayRunner,
    request: AttemptRequest,
    workdir: Path,
    *,
    timeout: float = 60.0,
    argv_prefix: list[str] | None = None,
) -> AttemptOutcome:
    return await run_attempt(
        request,
        workdir,
        pool=AttemptPool(2, runner=runner),
        job_id="job-1",
        timeout=timeout,
        kill_grace=KILL_GRACE,
        argv_prefix=argv_prefix,
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in "ZX"


async def _pids_of_attempt(shared: Path, timeout: float = 30.0) -> list[int]:
    with anyio.fail_after(timeout):
        while True:
            for path in shared.glob(f"*/*/{PID_FILE}"):
                pids = [int(x) for x in path.read_text().split()]
                if pids:
                    return pids
            await anyio.sleep(0.05)


def _seconds_until_dead(pids: list[int], limit: float) -> float:
    start = time.monotonic()
    while any(_alive(p) for p in pids):
        if time.monotonic() - start > limit:
            raise AssertionError(f"still alive after {limit:g} s: {[p for p in pids if _alive(p)]}")
        os.sched_yield()
        anyio.run(anyio.sleep, 0.02)
    return time.monotonic() - start


def test_every_ray_socket_listens_on_loopback_only(cluster: RayCluster) -> None:
    addresses = cluster.listening()
    assert len(addresses) >= 4, addresses  # GCS, raylets, object managers at least
    hosts = {a.rsplit(":", 1)[0] for a in addresses}
    assert hosts <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, addresses


def test_attempt_runs_on_the_worker_node_and_its_artifact_comes_back_checked(
    cluster: RayCluster, runner: RayRunner, tmp_path: Path
) -> None:
    workdir = _attempt_dir(tmp_path)
    request = _request(workdir)
    outcome = anyio.run(
        lambda: _run(runner, request, workdir, argv_prefix=[sys.executable, str(ARTIFACT_WORKER)])
    )
    assert outcome.outcome == "ok", outcome
    where = dict(outcome.details or {})["cluster"]
    assert where["node_id"] == _worker_node_id()
    assert where["node_id"] != ray.get_runtime_context().get_node_id()  # not the driver's node
    worker = next(n for n in cluster.nodes if n.name == "worker")
    assert where["pid"] in worker.descendants()  # the Ray worker that ran it is in that node's tree
    artifact = Path(outcome.artifact or "")
    assert artifact == workdir / "model.popef"
    # The worker wrote it from the shared copy of the model, on the node; it arrived here intact.
    assert artifact.read_bytes().startswith(b"popef:" + str(tmp_path / "shared" / "job-1").encode())
    assert "artifact worker: done" in outcome.stderr_tail
    assert not (tmp_path / "shared" / "job-1").exists()  # the per-try folder is cleaned up


def test_soft_cancel_kills_children_that_ignore_sigterm_within_the_grace(
    runner: RayRunner, tmp_path: Path
) -> None:
    workdir = _attempt_dir(tmp_path)
    request = _request(workdir, fault="fork_bomb", children=5)
    found: list[int] = []
    cancelled_at: list[float] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run, runner, request, workdir)
            found.extend(await _pids_of_attempt(tmp_path / "shared"))
            assert all(_alive(p) for p in found)
            with anyio.fail_after(10):  # its stderr reaches our log while it still runs
                while not any("forked 5 children" in str(e.get("line")) for e in logs):
                    await anyio.sleep(0.05)
            cancelled_at.append(time.monotonic())
            tg.cancel_scope.cancel()

    with structlog.testing.capture_logs() as logs:
        anyio.run(main)
    assert all(e["attempt"] == "attempt-0" for e in logs if e["event"] == "attempt.stderr")
    assert len(found) == 6
    _seconds_until_dead(found, limit=KILL_GRACE + 1.0 - (time.monotonic() - cancelled_at[0]))
    assert time.monotonic() - cancelled_at[0] <= KILL_GRACE + 1.0


def test_timeout_comes_back_as_the_attempts_outcome(runner: RayRunner, tmp_path: Path) -> None:
    workdir = _attempt_dir(tmp_path)
    outcome = anyio.run(lambda: _run(runner, _request(workdir, fault="hang"), workdir, timeout=1.0))
    assert outcome.outcome == "timeout", outcome
    assert outcome.signal == signal.SIGTERM
    assert dict(outcome.details or {})["cluster"]["node_id"] == _worker_node_id()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"sdk_resource": "poplar_sdk"}, "'poplar_sdk'"),
        ({"memory_bytes": 1 << 50}, "'memory' (the most any of its 2 node(s) has:"),
    ],
)
def test_a_task_no_node_can_hold_fails_naming_the_resource(
    cluster: RayCluster, tmp_path: Path, overrides: dict[str, Any], named: str
) -> None:
    r = RayRunner(_cluster_config(cluster, tmp_path, schedule_timeout=2.0, **overrides))
    r.connect()
    workdir = _attempt_dir(tmp_path)
    started = time.monotonic()
    try:
        with pytest.raises(UnschedulableError) as err:
            anyio.run(lambda: _run(r, _request(workdir), workdir))
    finally:
        r.close()
    assert named in err.value.message, err.value.message
    assert 2.0 <= time.monotonic() - started < 8.0


def test_a_corrupted_artifact_is_never_taken(runner: RayRunner, tmp_path: Path) -> None:
    workdir = _attempt_dir(tmp_path)
    request = _request(workdir)
    remote = tmp_path / "shared" / "job-1" / "run-1-attempt-0-test"
    payload = stage_attempt(
        runner.cluster,
        request,
        workdir,
        remote,
        "job-1",
        60.0,
        KILL_GRACE,
        [sys.executable, str(ARTIFACT_WORKER)],
    )
    ref = runner._remote.options(resources={WORKER_RESOURCE: 1}).remote(payload)
    result = anyio.run(
        lambda: runner._wait(ref, remote, {WORKER_RESOURCE: 1}, timeout=60.0, kill_grace=KILL_GRACE)
    )
    sealed = Path(result["artifact"]["path"])
    data = bytearray(sealed.read_bytes())
    data[10] ^= 0xFF  # same size, one byte flipped: only the sha256 can tell
    sealed.write_bytes(bytes(data))
    outcome = accept_result(result, request, workdir, "attempt-0")
    assert outcome.outcome == "crashed" and "does not match" in outcome.message
    assert outcome.artifact is None and not (workdir / "model.popef").exists()
    sealed.write_bytes(bytes(data[: len(data) // 2]))  # a partial file: the size tells
    outcome = accept_result(result, request, workdir, "attempt-0")
    assert outcome.outcome == "crashed" and not (workdir / "model.popef").exists()


def test_a_raylet_crash_leaves_nothing_running_the_sweeper_kills_it(
    cluster: RayCluster, runner: RayRunner, tmp_path: Path
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert (
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    )  # orphans come to us, so we can reap them
    worker = next(n for n in cluster.nodes if n.name == "worker")
    workdir = _attempt_dir(tmp_path)
    request = _request(workdir, fault="fork_bomb", children=5)
    found: list[int] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_run, runner, request, workdir)
            found.extend(await _pids_of_attempt(tmp_path / "shared"))
            raylet = worker.raylet_pid()
            tree = worker.descendants()
            os.kill(
                worker.proc.pid, signal.SIGKILL
            )  # `ray start` first: nobody would clean up after it
            worker.proc.wait(10)
            os.kill(raylet, signal.SIGKILL)
            for (
                pid
            ) in tree:  # reap what was re-parented to us (a zombie raylet keeps its workers alive)
                with anyio.move_on_after(10):
                    while _reap(pid):
                        await anyio.sleep(0.05)

    try:
        with pytest.raises(BaseExceptionGroup) as group:
            anyio.run(main)
        assert group.group_contains(AttemptLostError)
        _seconds_until_dead(found, limit=10.0)
        assert not list((tmp_path / "sweep").glob("*.json"))
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        cluster.nodes.remove(worker)
        cluster.start_worker()


def _reap(pid: int) -> bool:
    """True while ``pid`` is a child of ours that has not exited yet."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return _alive(pid)
    return done == 0


def _daemon_on_cluster(
    cluster: RayCluster, root: Path, *, compile_seconds: float
) -> tuple[Path, dict[str, str]]:
    """A daemon config with ``[cluster] engine = "ray"`` on this cluster, and its environment."""
    config = write_config(
        root,
        backend="poprt",
        target="ipu-mk2",
        max_parallel_compiles=1,
        max_attempts=3,
        kill_grace=KILL_GRACE,
    )
    cfg = _cluster_config(cluster, root, env_passthrough=["FAKE_POPRT_COMPILE_SECONDS"])
    lines = ["", "[cluster]"]
    for key in ("engine", "address", "shared_dir", "sweep_dir", "sdk_resource", "schedule_timeout"):
        value = getattr(cfg, key)
        lines.append(f"{key} = {json.dumps(str(value) if isinstance(value, Path) else value)}")
    lines.append('env_passthrough = ["FAKE_POPRT_COMPILE_SECONDS"]')
    with open(config, "a") as f:
        f.write("\n".join(lines) + "\n")
    env = {
        **{k: v for k, v in cluster.env().items() if k.startswith("RAY_")},
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "FAKE_POPRT_COMPILE_SECONDS": str(compile_seconds),
    }
    return config, env


def _attempt_processes(shared: Path) -> list[int]:
    """Live processes whose command line names a path under ``shared`` (attempt workers)."""
    needle = str(shared).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmdline and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_cancelling_a_job_whose_attempt_runs_on_ray_files_it_cancelled_and_publishes_nothing(
    cluster: RayCluster, tmp_path: Path
) -> None:
    root = tmp_path / "d"
    config, env = _daemon_on_cluster(cluster, root, compile_seconds=60)
    model = save_model(chain_model(2), root / "models" / "net.onnx")
    with running(config, env=env, fake_poprt=True) as daemon:
        drop(model, root / "inbox")
        job_id = daemon.wait_for("job.claimed", timeout=30)[0]["job_id"]
        daemon.wait_until(
            lambda: bool(_attempt_processes(root / "shared")), 60, "the attempt to run"
        )
        running_now = _attempt_processes(root / "shared")
        cancel = subprocess.run(
            [sys.executable, "-m", "sharderd.cli", "cancel", job_id, "--config", str(config)],
            capture_output=True,
            text=True,
            env=daemon.env,
            check=False,
        )
        assert cancel.returncode == 0, cancel.stderr
        daemon.wait_for("job.cancelled", timeout=30, reason="requested")
        gone = time.monotonic()
        _seconds_until_dead(running_now, limit=KILL_GRACE + 1.0)
        assert time.monotonic() - gone <= KILL_GRACE + 1.0
    _stop_sweeper(root / "sweep")
    assert results(root / "outbox") == []
    assert (root / "state" / "failed" / "net").is_dir()
    records = [json.loads(p.read_text()) for p in (root / "state" / "journal").glob("*.json")]
    assert [r["state"] for r in records] == ["cancelled"]


def test_a_killed_node_mid_attempt_the_job_succeeds_once_on_another_node(
    cluster: RayCluster, runner: RayRunner, tmp_path: Path
) -> None:  # runner: this test's view of the nodes
    root = tmp_path / "d"
    config, env = _daemon_on_cluster(cluster, root, compile_seconds=3)
    model = save_model(chain_model(1), root / "models" / "net.onnx")
    worker = next(n for n in cluster.nodes if n.name == "worker")
    with running(config, env=env, fake_poprt=True) as daemon:
        drop(model, root / "inbox")
        daemon.wait_for("attempt.submitted", timeout=60)
        daemon.wait_until(
            lambda: any((root / "shared").glob("*/*/started.json")), 30, "the task to start"
        )
        started = next((root / "shared").glob("*/*/started.json"))
        old_id = json.loads(started.read_text())["node_id"]
        worker.kill()
        cluster.nodes.remove(worker)
        daemon.wait_for("job.retried", timeout=30, reason="attempt_lost")
        cluster.start_worker()
        daemon.wait_for("job.succeeded", timeout=90)
        ran = daemon.events("attempt.ran")
    _stop_sweeper(root / "sweep")
    assert len(ran) == 1 and ran[0]["result"] == "ok", ran
    assert ran[0]["node_id"] != old_id  # the retry ran on the other node
    assert ran[0]["node_id"] in {
        n["NodeID"] for n in ray.nodes() if n["Resources"].get(WORKER_RESOURCE)
    }
    assert len(results(root / "outbox")) == 1
    records = [
        json.loads(p.read_text()) for p in sorted((root / "state" / "journal").glob("*.json"))
    ]
    assert [(r["name"], r["state"], r["attempts"]) for r in records] == [("net", "succeeded", 2)], (
        records
    )
