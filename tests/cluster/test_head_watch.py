"""The head watch and its threads, without Ray: a node-table call that blocks until the test
writes to a pipe stands for a head that does not answer.

What the real head does is ``test_lost_head.py``'s; here are the edges: lost once a probe gets no
answer in its timeout, one ``cluster.lost`` per loss, ``cluster.restored`` when the same call returns,
``ClusterLostError`` once lost for ``head_timeout`` and not before, and a call left behind does not
keep the process from exiting.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import structlog.testing

from sharderd.cluster import blocking
from sharderd.cluster.errors import ClusterLostError
from sharderd.cluster.head import HeadWatch
from sharderd.errors import EXIT_BACKEND_UNAVAILABLE

NODES = [{"NodeID": "n1", "Alive": True, "Resources": {"CPU": 2.0}}]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Head:
    """A node table that answers at once while up; while down, each call blocks on a pipe."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.up = True
        self.calls = 0

    def nodes(self) -> list[dict[str, Any]]:
        self.calls += 1
        if not self.up:
            os.read(self.read_fd, 1)  # until the test says the head is back
        return NODES

    def come_back(self) -> None:
        self.up = True
        os.write(self.write_fd, b"x" * 64)


@pytest.fixture
def head() -> Iterator[_Head]:
    h = _Head()
    yield h
    os.close(h.read_fd)
    os.close(h.write_fd)


@pytest.mark.anyio
async def test_blocking_call_returns_raises_and_times_out() -> None:
    assert await blocking.call(sorted, [3, 1, 2]) == [1, 2, 3]
    with pytest.raises(ZeroDivisionError):
        await blocking.call(divmod, 1, 0)
    read_fd, write_fd = os.pipe()
    try:
        with pytest.raises(TimeoutError):
            await blocking.call(os.read, read_fd, 1, within=0.2)
    finally:
        os.write(write_fd, b"x")  # let the thread end
        os.close(write_fd)


def test_a_call_left_behind_does_not_keep_the_process_alive() -> None:
    """The reason the module exists: anyio's worker thread would keep this process alive."""
    code = textwrap.dedent(
        """
        import os, anyio
        from sharderd.cluster import blocking
        async def main():
            read_fd, _ = os.pipe()
            try:
                await blocking.call(os.read, read_fd, 1, within=0.2)
            except TimeoutError:
                print("left behind", flush=True)
        anyio.run(main)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (0, "left behind\n"), done.stderr


@pytest.mark.anyio
async def test_lost_once_restored_once_and_one_call_in_flight(head: _Head) -> None:
    watch = HeadWatch(head.nodes, address="h:1", head_timeout=60.0, probe_timeout=0.2)
    with structlog.testing.capture_logs() as logs:
        assert await watch.probe() and watch.nodes == NODES and watch.lost_since is None
        head.up = False
        for _ in range(3):
            assert not await watch.probe()
        assert head.calls == 2  # the blocked call is awaited again, not repeated
        assert [e["event"] for e in logs] == ["cluster.lost"]
        assert logs[0]["address"] == "h:1" and logs[0]["head_timeout_s"] == 60.0
        assert watch.lost_for() >= 0.5  # since the first probe that got no answer
        waiting = watch.fresh_nodes()
        async with anyio.create_task_group() as tg:

            async def wait_for_nodes() -> None:
                assert await waiting == NODES

            tg.start_soon(wait_for_nodes)
            await anyio.sleep(0.3)  # the waiter is blocked on the lost head meanwhile
            head.come_back()
        assert [e["event"] for e in logs] == ["cluster.lost", "cluster.restored"]
        assert watch.lost_since is None


@pytest.mark.anyio
async def test_the_watch_ends_the_daemon_after_head_timeout_not_before(head: _Head) -> None:
    watch = HeadWatch(head.nodes, address="h:1", head_timeout=1.0, probe_timeout=0.2)
    head.up = False
    started = anyio.current_time()
    with pytest.raises(ClusterLostError) as info:
        await watch.run()
    waited = anyio.current_time() - started
    assert 1.0 <= waited < 3.0
    err = info.value
    assert err.exit_code == EXIT_BACKEND_UNAVAILABLE and err.reason == "cluster_lost"
    assert "h:1" in err.message and "head_timeout = 1" in err.message
    head.come_back()


@pytest.mark.anyio
async def test_an_answer_before_head_timeout_keeps_the_daemon(head: _Head) -> None:
    watch = HeadWatch(head.nodes, address="h:1", head_timeout=2.0, probe_timeout=0.2)
    head.up = False
    with anyio.move_on_after(4.0) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch.run)
            await anyio.sleep(1.0)
            head.come_back()  # lost for ~1 s of the 2 s allowed
    assert scope.cancelled_caught  # still watching at 4 s: it never raised
    assert watch.lost_since is None
