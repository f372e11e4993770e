"""Whether the Ray head (its GCS) answers, and what the cluster looked like when it last did.

The head is asked for the node table (``ray.nodes()``) from a thread (``cluster/blocking.py``):
every ``PROBE_EVERY_S`` by :meth:`HeadWatch.run` in the daemon, and whenever an attempt needs a
fresh view. A probe that has not answered in ``PROBE_TIMEOUT_S`` (or that raises) means the head is
lost: one ``cluster.lost`` line, and callers of :meth:`HeadWatch.fresh_nodes` wait for it. At most
one probe is in flight; while the head is gone, that one is awaited again rather than a new thread
started per check. An answer after a loss is one ``cluster.restored`` line. Lost for
``[cluster] head_timeout``, :meth:`HeadWatch.run` raises ``ClusterLostError``: the daemon stops
with its exit code, and the jobs it held resume at the next start.

Ray's own client gives up on a lost GCS after ``RAY_gcs_rpc_server_reconnect_timeout_s`` (60 s by
default) by ending the whole process; ``RayRunner.connect`` raises it past ``head_timeout`` first,
so the daemon's own stop comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import anyio
import anyio.abc

from sharderd.cluster.blocking import ThreadCall
from sharderd.cluster.errors import ClusterLostError
from sharderd.logs import get_logger

__all__ = ["PROBE_EVERY_S", "PROBE_TIMEOUT_S", "HeadWatch"]

PROBE_EVERY_S: Final = 5.0
"""Seconds between two probes of an idle daemon: how late a loss can be noticed, beyond the timeout."""
PROBE_TIMEOUT_S: Final = 10.0
"""Seconds a node-table request may take before the head counts as lost (a loopback answer takes
milliseconds; a large cluster's, well under a second)."""

_RETRY_S: Final = 1.0
"""Pause between probes of a head that answered with an error (one that hangs is awaited instead)."""

_log = get_logger(__name__)


class HeadWatch:
    """The head's state, kept by probes; one per Ray runner."""

    def __init__(
        self,
        nodes: Callable[[], list[dict[str, Any]]],
        *,
        address: str,
        head_timeout: float,
        probe_timeout: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._ask = nodes
        self.address = address
        self.head_timeout = head_timeout
        self.probe_timeout = probe_timeout
        self.nodes: list[dict[str, Any]] = []
        """The node table of the last answer."""
        self.lost_since: float | None = None
        """``anyio.current_time()`` when the head was found lost; None while it answers."""
        self._probe: ThreadCall[list[dict[str, Any]]] | None = None

    async def fresh_nodes(self) -> list[dict[str, Any]]:
        """The node table now: waits for the head while it is lost (cancellable)."""
        while not await self.probe():
            await anyio.sleep(_RETRY_S)
        return self.nodes

    async def probe(self) -> bool:
        """Ask the head once (or await the request still in flight); True when it answered."""
        if self._probe is None:
            self._probe = ThreadCall(self._ask)
        probe, asked = self._probe, anyio.current_time()
        if not await probe.wait(self.probe_timeout):
            self._lost(f"no answer in {self.probe_timeout:g} s", since=asked)
            return False
        if self._probe is probe:
            self._probe = None
        try:
            self.nodes = probe.result()
        except Exception as exc:  # Ray raises RpcError, ConnectionError, RuntimeError...
            self._lost(f"{type(exc).__name__}: {exc}", since=anyio.current_time())
            return False
        self._restored()
        return True

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Probe for the daemon's life; raise ``ClusterLostError`` once lost for ``head_timeout``."""
        task_status.started()
        while True:
            answered = await self.probe()
            if not answered and self.lost_for() >= self.head_timeout:
                raise self.error()
            await anyio.sleep(PROBE_EVERY_S if answered else _RETRY_S)

    def lost_for(self) -> float:
        return 0.0 if self.lost_since is None else anyio.current_time() - self.lost_since

    def error(self) -> ClusterLostError:
        return ClusterLostError(
            f"the Ray head at {self.address} has not answered for {self.lost_for():.0f} s "
            f"([cluster] head_timeout = {self.head_timeout:g}): sharderd stops; the jobs it held "
            "stay in processing/ and run again at the next start",
            hint="Start the Ray head again (docs/cluster.md), then sharderd; under systemd "
            "(Restart=on-failure) sharderd starts again by itself and waits for the head.",
        )

    def _lost(self, why: str, *, since: float) -> None:
        if self.lost_since is None:
            self.lost_since = since
            _log.error(
                "cluster.lost",
                address=self.address,
                error=why,
                head_timeout_s=self.head_timeout,
                message=f"the Ray head does not answer; jobs wait for it up to {self.head_timeout:g} s "
                "([cluster] head_timeout), then sharderd stops",
            )

    def _restored(self) -> None:
        if self.lost_since is not None:
            _log.warning("cluster.restored", address=self.address, lost_s=round(self.lost_for(), 1))
            self.lost_since = None
