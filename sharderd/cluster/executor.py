"""The driver side of cluster attempts: one Ray task per attempt, from the daemon's event loop.

The daemon keeps everything but the attempts (inbox, journal, planning, publishing). For each
attempt granted a pool slot, :class:`RayRunner` copies the attempt folder into ``shared_dir`` under
a per-try name, submits one task (``max_retries = 0``: retries belong to the journal) and polls it
without blocking the loop. How it ends:

- a result: the outcome comes back as data; a sealed artifact is checked (size and sha256) and
  moved into the local attempt folder, or the attempt is ``crashed`` when it does not match;
- our caller is cancelled (a better plan compiled, ``sharderd cancel``, shutdown): ``ray.cancel``
  soft first, so ``run_process`` in the task kills the group with its own grace; after
  ``kill_grace + cancel_margin`` the task is force-killed; its result is never read;
- the node or worker died: :class:`AttemptLostError`, and the job runs again as a new try;
- no node can ever hold it: after ``schedule_timeout`` the job fails naming the resource.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import anyio

from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.cluster import artifacts
from sharderd.cluster.errors import AttemptLostError, ClusterUnavailableError, UnschedulableError
from sharderd.cluster.task import STARTED_NAME, STDERR_NAME
from sharderd.config import ClusterConfig
from sharderd.logs import get_logger
from sharderd.units import fmt_bytes

__all__ = ["RayRunner", "required_resources", "unschedulable_reason"]

_POLL_S: Final = 0.02
_FEASIBILITY_EVERY_S: Final = 1.0
_STDERR_LINES: Final = 2000
"""Stderr lines of one attempt streamed into the daemon log at most (the tail is in the report)."""
_LOST: Final = (
    "NodeDiedError",
    "WorkerCrashedError",
    "LocalRayletDiedError",
    "ObjectLostError",
    "OwnerDiedError",
    "ObjectFetchTimedOutError",
    "RaySystemError",
)
"""Ray errors that mean the try was lost, not that the attempt failed."""

_log = get_logger(__name__)


def required_resources(cluster: ClusterConfig, request: AttemptRequest) -> dict[str, float]:
    """What one attempt reserves: CPUs, a memory floor, the SDK marker, an IPU for benchmarks."""
    need: dict[str, float] = {"CPU": cluster.num_cpus}
    if cluster.memory_bytes:
        need["memory"] = float(cluster.memory_bytes)
    if cluster.sdk_resource:
        need[cluster.sdk_resource] = 1.0
    if cluster.ipu_resource and request.benchmark and request.backend == "poprt":
        need[cluster.ipu_resource] = 1.0
    return {k: v for k, v in need.items() if v > 0}


def unschedulable_reason(
    need: Mapping[str, float], nodes: Sequence[Mapping[str, Any]]
) -> str | None:
    """Why no alive node can hold ``need`` (naming the resource), or None when one can."""
    alive = [n for n in nodes if n.get("Alive")]
    totals = [dict(n.get("Resources") or {}) for n in alive]
    if any(all(t.get(k, 0.0) >= v for k, v in need.items()) for t in totals):
        return None
    if not alive:
        return "the Ray cluster has no alive node"
    for key, value in need.items():
        most = max((t.get(key, 0.0) for t in totals), default=0.0)
        if most < value:
            return (
                f"no node of the Ray cluster has {_amount(key, value)} of resource {key!r} "
                f"(the most any of its {len(alive)} node(s) has: {_amount(key, most)})"
            )
    return f"no single node of the Ray cluster has all of {dict(need)} at once"


def _amount(key: str, value: float) -> str:
    return fmt_bytes(int(value)) if key in ("memory", "object_store_memory") else f"{value:g}"


class RayRunner:
    """Runs granted attempts as Ray tasks (see the module docstring); one per daemon."""

    def __init__(self, cluster: ClusterConfig, *, cancel_margin: float | None = None) -> None:
        if cluster.shared_dir is None:
            raise ClusterUnavailableError('[cluster] shared_dir must be set when engine = "ray"')
        self.cluster = cluster
        self.shared_dir = cluster.shared_dir.absolute()
        self.cancel_margin = cluster.cancel_margin if cancel_margin is None else cancel_margin
        self._ray: Any = None
        self._remote: Any = None

    def connect(self) -> None:
        """Join the cluster (blocking: done once at start-up, before the daemon is ready)."""
        try:
            import ray
        except ImportError:
            raise ClusterUnavailableError(
                'engine = "ray" needs Ray on this host', hint="pip install 'sharderd[ray]'"
            ) from None
        try:
            self.shared_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ClusterUnavailableError(
                f"[cluster] shared_dir {self.shared_dir}: {exc.strerror}"
            ) from None
        _route_ray_messages()
        try:
            ray.init(
                address=self.cluster.address,
                namespace="sharderd",
                log_to_driver=False,
                configure_logging=False,
                include_dashboard=False,
            )
        except Exception as exc:  # ray raises ConnectionError, RuntimeError, AuthenticationError...
            raise ClusterUnavailableError(
                f"cannot join the Ray cluster at {self.cluster.address!r}: {type(exc).__name__}: {exc}",
                hint="Start it first (`ray start --head ...` on the head host, see the README's cluster "
                "section) and give this daemon the same RAY_AUTH_TOKEN_PATH.",
            ) from None
        from sharderd.cluster.task import execute

        self._ray = ray
        self._remote = ray.remote(max_retries=0, retry_exceptions=False)(execute)
        _log.info(
            "cluster.connected",
            address=self.cluster.address,
            nodes=sum(1 for n in ray.nodes() if n["Alive"]),
            resources=ray.cluster_resources(),
            shared_dir=str(self.shared_dir),
        )

    def close(self) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    async def __call__(
        self,
        request: AttemptRequest,
        workdir: Path,
        *,
        job_id: str,
        timeout: float,
        kill_grace: float,
        argv_prefix: Sequence[str] | None,
    ) -> AttemptOutcome:
        if self._ray is None:
            raise ClusterUnavailableError("the Ray runner was not connected")
        attempt = workdir.name
        remote_dir = (
            self.shared_dir / job_id / f"{workdir.parent.name}-{attempt}-{secrets.token_hex(4)}"
        )
        try:
            payload = self._stage(
                request, workdir, remote_dir, job_id, timeout, kill_grace, argv_prefix
            )
            need = required_resources(self.cluster, request)
            await self._until_feasible(need)
            ref = self._remote.options(
                num_cpus=need.get("CPU", 0.0),
                memory=need.get("memory"),
                resources={k: v for k, v in need.items() if k not in ("CPU", "memory")} or None,
                name=f"sharderd:{job_id}:{attempt}",
            ).remote(payload)
            _log.info("attempt.submitted", attempt=attempt, resources=need, shared=str(remote_dir))
            stderr = _StderrStream(remote_dir / STDERR_NAME, attempt)
            try:
                result = await self._wait(
                    ref, remote_dir, need, timeout=timeout, kill_grace=kill_grace, stderr=stderr
                )
            finally:
                stderr.poll(final=True)
            return self._accept(result, request, workdir, attempt)
        finally:
            shutil.rmtree(remote_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                remote_dir.parent.rmdir()  # the job's folder, once its last attempt is gone

    # -- steps -------------------------------------------------------------------------------

    def _stage(
        self,
        request: AttemptRequest,
        workdir: Path,
        remote_dir: Path,
        job_id: str,
        timeout: float,
        kill_grace: float,
        argv_prefix: Sequence[str] | None,
    ) -> dict[str, Any]:
        """Copy the attempt folder into ``shared_dir`` and point the request's paths there."""
        shutil.copytree(workdir, remote_dir, dirs_exist_ok=False)
        local, remote = str(workdir), str(remote_dir)

        def moved(value: Any) -> Any:
            if isinstance(value, str) and (value == local or value.startswith(local + "/")):
                return remote + value[len(local) :]
            return value

        final = Path(moved(request.artifact))
        written = final.with_name(artifacts.TMP_PREFIX + final.name)
        staged = dataclasses.replace(
            request,
            model=moved(request.model),
            artifact=str(written),
            options={k: moved(v) for k, v in request.options.items()},
        )
        env = {
            name: value
            for name in self.cluster.env_passthrough
            if (value := os.environ.get(name)) is not None
        }
        return {
            "request": dataclasses.asdict(staged),
            "workdir": remote,
            "artifact_final": str(final),
            "job_id": job_id,
            "timeout": timeout,
            "kill_grace": kill_grace,
            "env": env,
            "sweep_dir": str(self.cluster.sweep_dir),
            "argv_prefix": list(argv_prefix) if argv_prefix else None,
        }

    async def _until_feasible(self, need: Mapping[str, float]) -> None:
        """Wait (up to ``schedule_timeout``) for a node whose totals can hold ``need``.

        Checked before submitting as well as while pending: Ray 2.60 starts a task whatever
        ``memory`` it asks for (measured), so only this check turns an impossible memory floor
        into a job failure.
        """
        waited_since = anyio.current_time()
        while (reason := unschedulable_reason(need, self._ray.nodes())) is not None:
            if anyio.current_time() - waited_since >= self.cluster.schedule_timeout:
                raise self._unschedulable(reason)
            await anyio.sleep(_FEASIBILITY_EVERY_S)

    def _unschedulable(self, reason: str) -> UnschedulableError:
        return UnschedulableError(
            f"{reason}; the attempt waited {self.cluster.schedule_timeout:g} s "
            "([cluster] schedule_timeout) for a node that can hold it",
            hint="Add a node with that resource (`ray start --address=HEAD:PORT "
            "--resources='{\"NAME\": 1}'`) or lower the [cluster] request.",
        )

    async def _wait(
        self,
        ref: Any,
        remote_dir: Path,
        need: Mapping[str, float],
        *,
        timeout: float,
        kill_grace: float,
        stderr: _StderrStream | None = None,
    ) -> dict[str, Any]:
        ray = self._ray
        started_at: float | None = None
        infeasible_since: float | None = None
        next_check = anyio.current_time()
        try:
            while True:
                done, _ = ray.wait([ref], timeout=0)
                if done:
                    return self._result(ref)
                now = anyio.current_time()
                if started_at is None and (remote_dir / STARTED_NAME).exists():
                    started_at = now
                if stderr is not None:
                    stderr.poll()
                if started_at is None and now >= next_check:
                    next_check = now + _FEASIBILITY_EVERY_S
                    reason = unschedulable_reason(need, ray.nodes())
                    infeasible_since = None if reason is None else (infeasible_since or now)
                    if (
                        reason is not None
                        and now - infeasible_since >= self.cluster.schedule_timeout
                    ):
                        ray.cancel(ref, force=True)
                        raise self._unschedulable(reason)
                if (
                    started_at is not None
                    and now - started_at > timeout + kill_grace + self.cancel_margin
                ):
                    # The task's own timeout should have ended it: the node is wedged; stop it.
                    await self._cancel(ref, kill_grace)
                    return {
                        "outcome": AttemptOutcome(
                            "timeout", f"no result through Ray within {timeout:g} s; task cancelled"
                        ).to_json()
                    }
                await anyio.sleep(_POLL_S)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._cancel(ref, kill_grace)
            raise

    async def _cancel(self, ref: Any, kill_grace: float) -> None:
        """Soft cancel (the task kills its attempt's group), force after the grace; result ignored."""
        ray = self._ray
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
        with anyio.move_on_after(kill_grace + self.cancel_margin):
            while not ray.wait([ref], timeout=0)[0]:
                await anyio.sleep(_POLL_S)
            return
        _log.warning("attempt.force_cancelled", grace_s=kill_grace + self.cancel_margin)
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)

    def _result(self, ref: Any) -> dict[str, Any]:
        ray = self._ray
        try:
            value: dict[str, Any] = ray.get(ref, timeout=0)
        except Exception as exc:
            name = type(exc).__name__
            if name in _LOST or isinstance(exc, getattr(ray.exceptions, "NodeDiedError", ())):
                raise AttemptLostError(
                    f"the Ray node or worker running the attempt died ({name}): {str(exc).splitlines()[0][:300]}",
                    hint="sharderd runs the job again on the nodes left; check the node's raylet log.",
                ) from None
            cause = getattr(exc, "cause", None) or exc
            return {
                "outcome": AttemptOutcome(
                    "crashed",
                    f"the attempt's Ray task failed: {type(cause).__name__}: "
                    f"{str(cause).splitlines()[0][:500] if str(cause) else ''}",
                ).to_json()
            }
        return value

    def _accept(
        self, result: Mapping[str, Any], request: AttemptRequest, workdir: Path, attempt: str
    ) -> AttemptOutcome:
        """The task's outcome, with its artifact checked and moved into the local attempt folder."""
        outcome = AttemptOutcome.from_json(result["outcome"])
        where = result.get("where") or {}
        sealed = result.get("artifact")
        _log.info(
            "attempt.ran",
            attempt=attempt,
            node_id=where.get("node_id"),
            host=where.get("host"),
            worker_pid=where.get("pid"),
            result=outcome.outcome,
            artifact_bytes=sealed["size"] if sealed else None,
            sha256=sealed["sha256"] if sealed else None,
        )
        outcome = dataclasses.replace(
            outcome, details={**(outcome.details or {}), "cluster": dict(where)}
        )
        if sealed is None:
            return dataclasses.replace(
                outcome, artifact=request.artifact if outcome.artifact else None
            )
        shared = Path(sealed["path"])
        try:
            got = artifacts.digest(shared)
        except (OSError, ValueError) as exc:
            got = None
            problem = f"unreadable: {exc}"
        else:
            problem = (
                ""
                if (got.size, got.sha256) == (sealed["size"], sealed["sha256"])
                else (
                    f"{got.size} bytes, sha256 {got.sha256[:16]}… where the node sealed "
                    f"{sealed['size']} bytes, sha256 {str(sealed['sha256'])[:16]}…"
                )
            )
        if problem:
            _log.error(
                "attempt.artifact_mismatch", attempt=attempt, artifact=str(shared), problem=problem
            )
            return dataclasses.replace(
                outcome,
                outcome="crashed",
                artifact=None,
                message=f"the compiled artifact in shared_dir does not match what the node "
                f"wrote ({problem}); not used",
            )
        local = Path(request.artifact)
        if local.exists():
            shutil.rmtree(local) if local.is_dir() else local.unlink()
        shutil.move(str(shared), local)
        return dataclasses.replace(outcome, artifact=str(local))


class _StderrStream:
    """Tails an attempt's ``stderr.log`` in ``shared_dir`` into ``attempt.stderr`` log lines."""

    def __init__(self, path: Path, attempt: str) -> None:
        self.path = path
        self.attempt = attempt
        self.offset = 0
        self.partial = b""
        self.lines = 0

    def poll(self, *, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(1 << 20)
        except OSError:
            data = b""
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial:
            complete, self.partial = [*complete, self.partial], b""
        for raw in complete:
            if self.lines == _STDERR_LINES:
                _log.info(
                    "attempt.stderr",
                    attempt=self.attempt,
                    line=f"(more stderr not logged; first {_STDERR_LINES} lines above)",
                )
            self.lines += 1
            if self.lines <= _STDERR_LINES and raw.strip():
                _log.info(
                    "attempt.stderr", attempt=self.attempt, line=raw.decode(errors="replace")[:2000]
                )


def _route_ray_messages() -> None:
    """Ray prints cluster messages ("node ... marked dead") to the driver's stdout, which is the
    daemon's JSON log: send them through the log as ``cluster.message`` lines instead."""
    import ray._private.worker as ray_worker

    def log_lines(data: Mapping[str, Any], ignore_prefix: bool = False) -> None:
        for line in data.get("lines", ()):
            _log.warning(
                "cluster.message", source=str(data.get("pid", "")), message=str(line)[:2000]
            )

    ray_worker.print_to_stdstream = log_lines
