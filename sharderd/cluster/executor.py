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

It also answers for the cluster which backends its nodes offer (``registry.AttemptHosts``): with
``sdk_resource`` set, ``poprt`` is offered when a live node has that resource, so the daemon's own
host needs neither the SDK nor IPUs.

No Ray call runs on the event loop: each runs in a thread (``cluster/blocking.py``), and the node
table comes from the head watch (``cluster/head.py``), which waits for a lost head instead of
blocking; the daemon runs the watch (:meth:`RayRunner.watch`) and stops when the head stays lost.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import anyio

from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.cluster import blocking
from sharderd.cluster.errors import (
    ClusterLostError,
    ClusterUnavailableError,
    UnschedulableError,
)
from sharderd.cluster.head import PROBE_TIMEOUT_S, HeadWatch
from sharderd.cluster.ray_messages import route_ray_messages
from sharderd.cluster.resources import required_resources, unschedulable_reason
from sharderd.cluster.results import accept_result, read_result
from sharderd.cluster.staging import stage_attempt
from sharderd.cluster.stderr_stream import StderrStream
from sharderd.cluster.task import STARTED_NAME, STDERR_NAME
from sharderd.config import ClusterConfig
from sharderd.logs import get_logger

__all__ = ["RayRunner", "required_resources", "unschedulable_reason"]

_POLL_S: Final = 0.02
"""Seconds between two looks at a task (``ray.wait(timeout=0)``, in a thread). Not one longer
``ray.wait`` per look: with 0.25 s waits a zero-second attempt took 0.04-0.09 s longer (measured)."""
_FEASIBILITY_EVERY_S: Final = 1.0
_SHUTDOWN_S: Final = 10.0
"""Seconds ``ray.shutdown()`` may take when the daemon stops (it waits forever for a lost head)."""
RAY_RECONNECT_ENV: Final = "RAY_gcs_rpc_server_reconnect_timeout_s"
"""Ray ends a driver whose GCS has been gone this long (default 60 s): set past ``head_timeout``."""
_RAY_OUTLIVES_S: Final = 60.0
"""How much longer than ``head_timeout`` Ray's own limit is: the daemon's stop comes first."""

_log = get_logger(__name__)


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
        self.head: HeadWatch | None = None

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
        route_ray_messages()
        # Ray reads it when the driver connects: the daemon, not Ray, decides when a lost head ends it.
        os.environ[RAY_RECONNECT_ENV] = str(math.ceil(self.cluster.head_timeout + _RAY_OUTLIVES_S))
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
                hint="Start it first (`ray start --head ...` on the head host, see docs/cluster.md) and "
                "give this daemon the same RAY_AUTH_TOKEN_PATH.",
            ) from None
        from sharderd.cluster.task import execute

        self._ray = ray
        self._remote = ray.remote(max_retries=0, retry_exceptions=False)(execute)
        nodes = ray.nodes()
        self.head = HeadWatch(
            ray.nodes, address=self.cluster.address, head_timeout=self.cluster.head_timeout
        )
        self.head.nodes = nodes
        _log.info(
            "cluster.connected",
            address=self.cluster.address,
            nodes=sum(1 for n in nodes if n["Alive"]),
            resources=ray.cluster_resources(),
            shared_dir=str(self.shared_dir),
        )

    async def refresh(self) -> None:
        """A fresh node table for :meth:`offers` (waits while the head is lost)."""
        if self.head is not None:
            await self.head.fresh_nodes()

    def offers(self, backend: str) -> bool | None:
        """Whether a live node has ``sdk_resource`` in the last node table (poprt only; else None:
        ask this host). :meth:`refresh` first for a view of now."""
        sdk = self.cluster.sdk_resource
        if backend != "poprt" or not sdk or self.head is None:
            return None
        return any(
            n.get("Alive") and (n.get("Resources") or {}).get(sdk, 0) > 0 for n in self.head.nodes
        )

    async def watch(
        self,
        on_lost: Callable[[ClusterLostError], None],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The daemon's watch on the head: ``on_lost`` once it stays lost for ``head_timeout``;
        disconnects from Ray when cancelled (the daemon's end)."""
        try:
            if self.head is None:
                task_status.started()
                return
            try:
                await self.head.run(task_status=task_status)
            except ClusterLostError as lost:
                on_lost(lost)
                await anyio.sleep_forever()  # until the daemon has stopped its jobs
        finally:
            with anyio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        """Disconnect from Ray within ``_SHUTDOWN_S``; a shutdown stuck on a lost head is left to
        its thread, and Ray's exit hook (the same stuck shutdown) is dropped so the process can end."""
        ray, self._ray = self._ray, None
        if ray is None:
            return
        with contextlib.suppress(Exception):
            if await blocking.ThreadCall(ray.shutdown).wait(_SHUTDOWN_S):
                return
        atexit.unregister(ray.shutdown)
        _log.warning(
            "cluster.message",
            message=f"ray.shutdown() did not return in {_SHUTDOWN_S:g} s; left behind",
        )

    def close(self) -> None:
        """Disconnect now, blocking (a caller without an event loop, with a live head)."""
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
            payload = stage_attempt(
                self.cluster, request, workdir, remote_dir, job_id, timeout, kill_grace, argv_prefix
            )
            need = required_resources(self.cluster, request)
            await self._until_feasible(need)
            task = self._remote.options(
                num_cpus=need.get("CPU", 0.0),
                memory=need.get("memory"),
                resources={k: v for k, v in need.items() if k not in ("CPU", "memory")} or None,
                name=f"sharderd:{job_id}:{attempt}",
            )
            # never retried: a submission that timed out may still have gone through
            ref = await blocking.call(task.remote, payload)
            _log.info("attempt.submitted", attempt=attempt, resources=need, shared=str(remote_dir))
            stderr = StderrStream(remote_dir / STDERR_NAME, attempt)
            try:
                result = await self._wait(
                    ref, remote_dir, need, timeout=timeout, kill_grace=kill_grace, stderr=stderr
                )
            finally:
                stderr.poll(final=True)
            return accept_result(result, request, workdir, attempt)
        finally:
            shutil.rmtree(remote_dir, ignore_errors=True)
            with contextlib.suppress(OSError):
                remote_dir.parent.rmdir()  # the job's folder, once its last attempt is gone

    # -- steps -------------------------------------------------------------------------------

    async def _until_feasible(self, need: Mapping[str, float]) -> None:
        """Wait (up to ``schedule_timeout``) for a node whose totals can hold ``need``.

        Checked before submitting as well as while pending: Ray 2.60 starts a task whatever
        ``memory`` it asks for (measured), so only this check turns an impossible memory floor
        into a job failure.
        """
        assert self.head is not None
        waited_since = anyio.current_time()
        while (reason := unschedulable_reason(need, await self.head.fresh_nodes())) is not None:
            if anyio.current_time() - waited_since >= self.cluster.schedule_timeout:
                raise self._unschedulable(reason, need)
            await anyio.sleep(_FEASIBILITY_EVERY_S)

    def _unschedulable(self, reason: str, need: Mapping[str, float]) -> UnschedulableError:
        custom = {k: v for k, v in need.items() if k not in ("CPU", "memory")}
        resources = f" --resources='{json.dumps(custom)}'" if custom else ""
        return UnschedulableError(
            f"{reason}; the attempt waited {self.cluster.schedule_timeout:g} s "
            "([cluster] schedule_timeout) for a node that can hold it",
            hint="Start a node that can (on a host with the Poplar SDK for poprt, with this "
            f"daemon's RAY_AUTH_TOKEN_PATH): `ray start --address={self._head_address()}"
            f"{resources}`, or lower the [cluster] request.",
        )

    def _head_address(self) -> str:
        """``HOST:PORT`` of the head (``[cluster] address`` may be ``auto``)."""
        if self.cluster.address != "auto" or self._ray is None:
            return self.cluster.address
        with contextlib.suppress(Exception):
            return str(self._ray.get_runtime_context().gcs_address)
        return "HEAD:PORT"

    async def _wait(
        self,
        ref: Any,
        remote_dir: Path,
        need: Mapping[str, float],
        *,
        timeout: float,
        kill_grace: float,
        stderr: StderrStream | None = None,
    ) -> dict[str, Any]:
        ray = self._ray
        assert self.head is not None
        started_at: float | None = None
        infeasible_since: float | None = None
        next_check = anyio.current_time()
        try:
            while True:
                done, _ = await blocking.call(ray.wait, [ref], timeout=0)
                if done:
                    return await blocking.call(read_result, ray, ref)
                now = anyio.current_time()
                if started_at is None and (remote_dir / STARTED_NAME).exists():
                    started_at = now
                if stderr is not None:
                    stderr.poll()
                if started_at is None and now >= next_check:
                    next_check = now + _FEASIBILITY_EVERY_S
                    reason = unschedulable_reason(need, await self.head.fresh_nodes())
                    infeasible_since = None if reason is None else (infeasible_since or now)
                    if (
                        reason is not None
                        and infeasible_since is not None  # set whenever there is a reason
                        and now - infeasible_since >= self.cluster.schedule_timeout
                    ):
                        await self._ray_cancel(ref, force=True)
                        raise self._unschedulable(reason, need)
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
        await self._ray_cancel(ref, force=False)
        with anyio.move_on_after(kill_grace + self.cancel_margin):
            while not (await blocking.call(ray.wait, [ref], timeout=0))[0]:
                await anyio.sleep(_POLL_S)
            return
        _log.warning("attempt.force_cancelled", grace_s=kill_grace + self.cancel_margin)
        await self._ray_cancel(ref, force=True)

    async def _ray_cancel(self, ref: Any, *, force: bool) -> None:
        """``ray.cancel``, in a thread, given up after ``PROBE_TIMEOUT_S`` (a lost head)."""
        with contextlib.suppress(Exception):
            await blocking.call(self._ray.cancel, ref, force=force, within=PROBE_TIMEOUT_S)
