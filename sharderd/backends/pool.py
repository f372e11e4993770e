"""Run attempt subprocesses that cannot outlive their caller, and share a few slots fairly.

A compile attempt may hang, segfault, flood its pipes or fork helpers that ignore SIGTERM. Each
one therefore runs in its own session (so its process group is ours to kill), its pipes are
drained into bounded tails, and every way out of :func:`run_process` (exit, timeout,
cancellation) ends with the whole group gone and the leader reaped.

Resource handling: memory per process is ``2 × tail_bytes`` whatever the child writes; the
leader is always reaped; group members that survive SIGTERM for ``kill_grace`` get SIGKILL.

Error handling: a crash, a signal or a timeout is a :class:`ProcessResult`, never an exception.
Only a failure to spawn (missing executable, bad ``cwd``) raises ``OSError``, and cancellation of
the caller is re-raised after the group is dead.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

import anyio
import anyio.abc
import anyio.lowlevel

from sharderd.backends.ipus import IpuPool
from sharderd.childenv import child_env
from sharderd.procfs import PROC, processes

__all__ = ["AttemptPool", "ProcessResult", "run_process"]

_POLL_S = 0.02
"""How often group membership is re-checked while stragglers have their SIGTERM grace."""
_DRAIN_AFTER_EXIT_S = 1.0
"""Pipes stay open only while a process that escaped the group holds them; stop reading then."""


@final
@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How a child process ended, as plain data."""

    returncode: int | None
    """Exit status; None when a signal ended it (see ``signal``)."""
    signal: int | None
    """The signal that ended the leader (11 segfault, 15 our SIGTERM, 9 our SIGKILL or OOM)."""
    timed_out: bool
    """``timeout`` elapsed and we stopped the group."""
    cancelled: bool
    """Always False here: a cancelled caller gets the cancellation re-raised, not a result.

    Kept so callers that build results for cancelled attempts share this type."""
    stdout_tail: str
    """The last ``tail_bytes`` of stdout, decoded with ``errors="replace"``."""
    stderr_tail: str
    duration_s: float
    """From spawn until the leader was reaped."""
    pid: int


async def run_process(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float,
    kill_grace: float,
    tail_bytes: int = 64 * 1024,
    on_started: Callable[[int], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
) -> ProcessResult:
    """Run ``argv`` in a new session until it exits, ``timeout`` passes or we are cancelled.

    Args:
        argv: The command; stdin is ``/dev/null``.
        cwd: Working directory of the child.
        env: Child environment (default: ours), minus systemd's own (``childenv.SYSTEMD_ONLY_ENV``).
        timeout: Seconds before the process group gets SIGTERM.
        kill_grace: Seconds between SIGTERM and SIGKILL of the group.
        tail_bytes: How much of the end of stdout and of stderr to keep.
        on_started: Called with the pid (which is also the process group id) once spawned.
        on_stderr: Called with each chunk of stderr as it arrives (a cluster task streams it).

    Returns:
        How the leader ended. On return no live member of its process group remains.

    Raises:
        OSError: The command could not be spawned.
    """
    out_tail, err_tail = _Tail(tail_bytes), _Tail(tail_bytes)
    started = time.monotonic()
    # Shielded so a cancellation cannot land between fork and our owning the handle.
    with anyio.CancelScope(shield=True):
        proc = await anyio.open_process(
            list(argv),
            cwd=cwd,
            env=child_env(env),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    pgid = proc.pid  # start_new_session makes the child its group's leader
    try:
        if on_started is not None:
            on_started(proc.pid)
        async with anyio.create_task_group() as tg:
            assert proc.stdout is not None and proc.stderr is not None
            tg.start_soon(_drain, proc.stdout, out_tail)
            tg.start_soon(_drain, proc.stderr, err_tail, on_stderr)
            try:
                with anyio.move_on_after(timeout) as deadline:
                    await proc.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop_group(proc, pgid, kill_grace)
            tg.cancel_scope.deadline = anyio.current_time() + _DRAIN_AFTER_EXIT_S
    finally:
        with anyio.CancelScope(shield=True):
            await _stop_group(proc, pgid, kill_grace)  # no-op unless the body itself failed
            await proc.aclose()
    code = proc.returncode
    assert code is not None
    return ProcessResult(
        returncode=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        timed_out=deadline.cancelled_caught,
        cancelled=False,
        stdout_tail=out_tail.text(),
        stderr_tail=err_tail.text(),
        duration_s=time.monotonic() - started,
        pid=proc.pid,
    )


class _Tail:
    """The last ``limit`` bytes of a stream: enough for a report, bounded whatever the child writes."""

    __slots__ = ("_buf", "_limit")

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._limit = limit

    def add(self, chunk: bytes) -> None:
        self._buf += chunk
        excess = len(self._buf) - self._limit
        if excess > 0:
            del self._buf[:excess]

    def text(self) -> str:
        return self._buf.decode("utf-8", errors="replace")


async def _drain(
    stream: anyio.abc.ByteReceiveStream,
    tail: _Tail,
    on_chunk: Callable[[bytes], None] | None = None,
) -> None:
    """Read until EOF so the child never blocks on a full pipe."""
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in stream:
            tail.add(chunk)
            if on_chunk is not None:
                on_chunk(chunk)


async def _stop_group(proc: anyio.abc.Process, pgid: int, kill_grace: float) -> None:
    """SIGTERM the group, give it ``kill_grace``, SIGKILL what is left, reap the leader.

    Members outliving a leader that exited by itself are stopped the same way: nothing of an
    attempt may keep running (or keep its pipes open) after it is reported.
    """
    if proc.returncode is not None and not _group_alive(pgid):
        await proc.wait()
        return
    _signal_group(pgid, signal.SIGTERM)
    give_up = anyio.current_time() + kill_grace
    with anyio.move_on_after(kill_grace):
        await proc.wait()
    while _group_alive(pgid) and anyio.current_time() < give_up:
        await anyio.sleep(_POLL_S)
    if _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
    await proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    """Whether any member of the group still runs (zombies awaiting their reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not PROC.is_dir():
        return True
    return any(p.pgrp == pgid and p.state not in "ZX" for p in processes())


@dataclass(slots=True)
class _Waiter:
    job_id: str
    priority: int
    seq: int
    event: anyio.Event = field(default_factory=anyio.Event)
    granted: bool = False


@final
class AttemptPool:
    """At most ``max_parallel`` attempts at once across all jobs; fair between jobs; priority first.

    A freed slot goes straight to the waiter with the highest priority, then to the job granted
    the fewest slots so far (a job retrying many plans cannot starve a new one), then FIFO. Being
    cancelled while waiting leaves the queue; leaving the ``slot`` block, however, frees it.
    """

    def __init__(
        self, max_parallel: int, *, runner: object | None = None, ipus: IpuPool | None = None
    ) -> None:
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {max_parallel}")
        self.runner = runner
        """Where a granted attempt runs (``attempt.AttemptRunner``); None: a local subprocess."""
        self.ipus = ipus if ipus is not None else IpuPool(None)
        """The host's IPUs that benchmarks hold (``[poprt] ipus``); unknown until counted."""
        self._max = max_parallel
        self._busy = 0
        self._waiters: list[_Waiter] = []
        self._granted: Counter[str] = Counter()
        self._seq = itertools.count()

    @property
    def max_parallel(self) -> int:
        return self._max

    @property
    def busy(self) -> int:
        """Slots held now."""
        return self._busy

    @property
    def waiting(self) -> int:
        """Callers queued for a slot."""
        return len(self._waiters)

    def granted(self, job_id: str) -> int:
        """Slots ``job_id`` has been granted so far (its fairness debt)."""
        return self._granted[job_id]

    def forget(self, job_id: str) -> None:
        """Drop a finished job's count so a long-running daemon's bookkeeping stays bounded."""
        self._granted.pop(job_id, None)

    @contextlib.asynccontextmanager
    async def slot(self, *, job_id: str, priority: int = 0) -> AsyncIterator[None]:
        """Hold one slot for the body of the ``async with``."""
        await self._acquire(job_id, priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, job_id: str, priority: int) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._busy < self._max and not self._waiters:
            self._busy += 1
            self._granted[job_id] += 1
            return
        waiter = _Waiter(job_id, priority, next(self._seq))
        self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:
                self._release()  # handed over just as we were cancelled: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _release(self) -> None:
        if not self._waiters:
            self._busy -= 1
            return
        # The slot passes directly to the next waiter, so a new arrival cannot jump the queue.
        best = min(self._waiters, key=lambda w: (-w.priority, self._granted[w.job_id], w.seq))
        self._waiters.remove(best)
        best.granted = True
        self._granted[best.job_id] += 1
        best.event.set()
