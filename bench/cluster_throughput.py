"""Attempts per hour through Ray on one vs two local worker nodes, and the overhead per attempt.

A real head + worker node(s) on 127.0.0.1 (``tests/ray_cluster.py``); each worker offers 1 slot
(``--num-cpus=1``) and attempts reserve 1 CPU plus a worker-only resource, so the head runs none.
The "compiler" is a fake worker that sleeps ``--compile-seconds`` then writes a small artifact:
on this 2-core host two nodes add slots, not CPU, which is what a compile farm adds too.
Overhead = wall time of a zero-second attempt through Ray (stage, submit, schedule, run the
unchanged attempt path on the node, seal, verify, move back) minus the same attempt run locally.

    python bench/cluster_throughput.py            # 8 attempts of 2 s on 1 and on 2 nodes
    python bench/cluster_throughput.py --attempts 16 --compile-seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import ray  # noqa: E402
from ray_cluster import WORKER_RESOURCE, RayCluster  # noqa: E402

from sharderd.backends.attempt import run_attempt  # noqa: E402
from sharderd.backends.pool import AttemptPool  # noqa: E402
from sharderd.backends.protocol import AttemptRequest  # noqa: E402
from sharderd.cluster.executor import RayRunner  # noqa: E402
from sharderd.cluster.sweeper import sweeper_pid  # noqa: E402
from sharderd.config import ClusterConfig  # noqa: E402

ARTIFACT_WORKER = REPO / "tests" / "children" / "artifact_worker.py"


def fake_compiler(seconds: float) -> list[str]:
    code = (
        f"import runpy, sys, time; time.sleep({seconds}); sys.argv = sys.argv[1:]; "
        f"runpy.run_path({str(ARTIFACT_WORKER)!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", code, "fake"]


def attempt_dir(root: Path, index: int) -> tuple[AttemptRequest, Path]:
    workdir = root / "job" / "run-1" / f"attempt-{index}"
    workdir.mkdir(parents=True)
    (workdir / "model.onnx").write_bytes(b"x" * 4096)
    return AttemptRequest(
        "fault", str(workdir / "model.onnx"), str(workdir / "model.popef"), 2
    ), workdir


async def run_many(pool: AttemptPool, root: Path, count: int, seconds: float) -> list[float]:
    durations: list[float] = []

    async def one(i: int) -> None:
        request, workdir = attempt_dir(root, i)
        t = time.perf_counter()
        outcome = await run_attempt(
            request,
            workdir,
            pool=pool,
            job_id=f"bench-{i}",
            timeout=600,
            kill_grace=5,
            argv_prefix=fake_compiler(seconds),
        )
        assert outcome.outcome == "ok", outcome
        durations.append(time.perf_counter() - t)

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    return durations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=8)
    parser.add_argument("--compile-seconds", type=float, default=2.0)
    parser.add_argument("--overhead-runs", type=int, default=10)
    args = parser.parse_args()
    out: dict[str, object] = {"attempts": args.attempts, "compile_seconds": args.compile_seconds}
    with tempfile.TemporaryDirectory(prefix="sharderd-bench-ray-") as tmp:
        root = Path(tmp)
        # Local baseline for the overhead: the same zero-second attempt as a plain subprocess.
        local = [
            anyio.run(run_many, AttemptPool(1), root / f"local-{i}", 1, 0.0)[0]
            for i in range(args.overhead_runs)
        ]
        cluster = RayCluster(root / "ray")
        try:
            cluster.start_head()
            os.environ.update({k: v for k, v in cluster.env().items() if k.startswith("RAY_")})
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
            ray._raylet.Config.initialize("")
            ray._raylet.AuthenticationTokenLoader.instance().reset_cache()
            cfg = ClusterConfig(
                engine="ray",
                address=cluster.address,
                shared_dir=root / "shared",
                sweep_dir=root / "sweep",
                sdk_resource=WORKER_RESOURCE,
            )
            runner = RayRunner(cfg)
            runner.connect()
            for nodes in (1, 2):
                cluster._start(
                    f"worker{nodes}",
                    [
                        f"--address={cluster.address}",
                        "--num-cpus=1",
                        f"--resources={json.dumps({WORKER_RESOURCE: 1})}",
                    ],
                    head=False,
                )
                while (
                    sum(
                        1 for n in ray.nodes() if n["Alive"] and n["Resources"].get(WORKER_RESOURCE)
                    )
                    < nodes
                ):
                    anyio.run(anyio.sleep, 0.2)
                if (
                    nodes == 1
                ):  # warm the worker process pool, then the overhead runs, one at a time
                    anyio.run(run_many, AttemptPool(1, runner=runner), root / "warm", 1, 0.0)
                    remote = [
                        anyio.run(
                            run_many, AttemptPool(1, runner=runner), root / f"remote-{i}", 1, 0.0
                        )[0]
                        for i in range(args.overhead_runs)
                    ]
                t = time.perf_counter()
                anyio.run(
                    run_many,
                    AttemptPool(args.attempts, runner=runner),
                    root / f"n{nodes}",
                    args.attempts,
                    args.compile_seconds,
                )
                wall = time.perf_counter() - t
                out[f"nodes_{nodes}"] = {
                    "wall_s": round(wall, 2),
                    "attempts_per_hour": round(args.attempts * 3600 / wall),
                }
            runner.close()
        finally:
            cluster.stop()
            if (pid := sweeper_pid(root / "sweep")) is not None:
                os.kill(pid, signal.SIGTERM)  # it would idle for a minute otherwise
    out["local_attempt_s_p50"] = round(statistics.median(local), 3)
    out["ray_attempt_s_p50"] = round(statistics.median(remote), 3)
    out["overhead_s_p50"] = round(statistics.median(remote) - statistics.median(local), 3)
    out["overhead_s_max"] = round(max(remote) - statistics.median(local), 3)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
