"""run_process and AttemptPool against real child processes (scripts in tests/children/)."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

import anyio
import pytest

from sharderd.backends.pool import AttemptPool, run_process
from sharderd.childenv import SYSTEMD_ONLY_ENV as STRIPPED_ENV

CHILDREN = Path(__file__).parent.parent / "children"
MIB = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def child(name: str, *args: object) -> list[str]:
    return [sys.executable, str(CHILDREN / f"{name}.py"), *map(str, args)]


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, pgrp)`` of ``pid``, or None when it no longer exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[2])


def live_group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that still run.

    Zombies are left out: an orphaned grandchild belongs to PID 1 once killed, and whether that
    init reaps promptly is outside our control (our own child is checked separately).
    """
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] not in "ZX":
                members.append(int(entry.name))
    return members


def assert_reaped(pid: int) -> None:
    """Our direct child must be gone entirely, not left as our zombie."""
    assert proc_stat(pid) is None, f"child {pid} still in /proc: {proc_stat(pid)}"


async def wait_for_pids(path: Path) -> tuple[int, int]:
    """Wait until a child has written "<pid> <grandchild pid>" to ``path`` (atomically)."""
    with anyio.fail_after(10):
        while not path.exists():
            await anyio.sleep(0.01)
    leader, grandchild = path.read_text().split()
    return int(leader), int(grandchild)


class TestRunProcess:
    @pytest.mark.anyio
    async def test_hung_child_gets_sigterm_at_timeout(self, tmp_path: Path) -> None:
        """A child that never exits is stopped by SIGTERM at the timeout, well before the grace ends."""
        result = await run_process(child("hang", tmp_path / "ready"), timeout=0.5, kill_grace=10)
        assert result.timed_out
        assert (result.returncode, result.signal) == (None, signal.SIGTERM)
        assert 0.5 <= result.duration_s < 5
        assert_reaped(result.pid)
        assert live_group_members(result.pid) == []

    @pytest.mark.anyio
    async def test_term_ignoring_group_is_killed_after_grace(self, tmp_path: Path) -> None:
        """A child and grandchild that ignore SIGTERM both get SIGKILL after the grace; none survive."""
        ready = tmp_path / "ready"
        result = await run_process(
            child("hang", ready, "--ignore-term", "--grandchild"), timeout=1.0, kill_grace=0.3
        )
        leader, grandchild = await wait_for_pids(ready)  # written before the timeout fired
        assert leader == result.pid and grandchild > 0
        assert result.timed_out
        assert (result.returncode, result.signal) == (None, signal.SIGKILL)
        assert result.duration_s >= 1.3
        assert_reaped(leader)
        assert live_group_members(leader) == []
        assert proc_stat(grandchild) in (None, ("Z", leader))

    @pytest.mark.anyio
    async def test_grandchild_outliving_its_leader_is_killed(self, tmp_path: Path) -> None:
        """A leader that exits 0 but leaves a TERM-ignoring grandchild holding the pipes: the call
        returns (no pipe hang) and the grandchild is killed."""
        ready = tmp_path / "ready"
        with anyio.fail_after(10):
            result = await run_process(
                child("hang", ready, "--ignore-term", "--grandchild", "--exit"),
                timeout=30,
                kill_grace=0.2,
            )
        leader, grandchild = await wait_for_pids(ready)
        assert (result.returncode, result.signal, result.timed_out) == (0, None, False)
        assert live_group_members(leader) == []
        assert proc_stat(grandchild) in (None, ("Z", leader))

    @pytest.mark.anyio
    async def test_segfault_is_a_result(self) -> None:
        """A segfaulting child is reported with signal 11, not raised."""
        result = await run_process(child("segv"), timeout=30, kill_grace=1)
        assert (result.returncode, result.signal, result.timed_out) == (None, signal.SIGSEGV, False)
        assert_reaped(result.pid)

    @pytest.mark.anyio
    async def test_nonzero_exit_keeps_exit_status_and_stderr(self) -> None:
        """An exit status and what the child said on stderr and stdout come back as data."""
        argv = [
            sys.executable,
            "-c",
            "import sys; print('out'); print('boom', file=sys.stderr); sys.exit(3)",
        ]
        result = await run_process(argv, timeout=30, kill_grace=1)
        assert (result.returncode, result.signal) == (3, None)
        assert result.stdout_tail == "out\n"
        assert result.stderr_tail == "boom\n"

    @pytest.mark.anyio
    async def test_floods_do_not_deadlock_and_keep_last_bytes(self) -> None:
        """100 MiB on stderr and 10 MiB on stdout, interleaved, drain fully; tails are the exact last
        64 KiB and memory does not grow with the output."""
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with anyio.fail_after(30):
            result = await run_process(child("flood", 100, 10), timeout=60, kill_grace=1)
        peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        assert result.returncode == 0
        tail = 64 * 1024
        last_err = b"%07d\n" % 99 * (MIB // 8) + b"stderr-end\n"
        last_out = b"%07d\n" % 90 * (MIB // 8) + b"stdout-end\n"
        assert (len(result.stderr_tail), len(result.stdout_tail)) == (tail, tail)
        assert result.stderr_tail == last_err[-tail:].decode()
        assert result.stdout_tail == last_out[-tail:].decode()
        assert peak_after - peak_before < 40 * MIB

    @pytest.mark.anyio
    async def test_tail_decodes_broken_utf8_with_replacement(self) -> None:
        """A tail cut inside a multi-byte character, or binary output, still decodes."""
        argv = [
            sys.executable,
            "-c",
            "import sys; sys.stdout.buffer.write('é'.encode() * 3 + b'\\xff')",
        ]
        result = await run_process(argv, timeout=30, kill_grace=1, tail_bytes=6)
        assert result.stdout_tail == "\ufffdéé\ufffd"

    @pytest.mark.anyio
    async def test_systemd_variables_never_reach_the_child(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """NOTIFY_SOCKET and WATCHDOG_* are stripped from our environment and from an explicit one."""
        for name in STRIPPED_ENV:
            monkeypatch.setenv(name, "/run/fake")
        monkeypatch.setenv("SHARDERD_TEST_KEEP", "kept")
        inherited = await run_process(child("env_dump"), timeout=30, kill_grace=1)
        explicit = await run_process(
            child("env_dump"),
            env={**os.environ, "EXPLICIT": "yes"},
            timeout=30,
            kill_grace=1,
        )
        for result, extra in ((inherited, "SHARDERD_TEST_KEEP"), (explicit, "EXPLICIT")):
            env = json.loads(result.stdout_tail)
            assert not set(STRIPPED_ENV) & set(env)
            assert extra in env

    @pytest.mark.anyio
    async def test_cancelled_caller_kills_group_and_reraises(self, tmp_path: Path) -> None:
        """Cancelling the caller kills the whole group, reaps the leader and re-raises."""
        ready = tmp_path / "ready"
        seen: dict[str, bool] = {"returned": False, "cancelled": False}

        async def caller() -> None:
            try:
                await run_process(
                    child("hang", ready, "--ignore-term", "--grandchild"),
                    timeout=60,
                    kill_grace=0.2,
                )
                seen["returned"] = True
            except anyio.get_cancelled_exc_class():
                seen["cancelled"] = True
                raise

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(caller)
                leader, grandchild = await wait_for_pids(ready)
                assert live_group_members(leader) != []
                tg.cancel_scope.cancel()
        assert seen == {"returned": False, "cancelled": True}
        assert_reaped(leader)
        assert live_group_members(leader) == []
        assert proc_stat(grandchild) in (None, ("Z", leader))

    @pytest.mark.anyio
    async def test_on_started_gets_the_group_leader_pid(self) -> None:
        """on_started receives the pid, which leads its own process group."""
        seen: list[tuple[int, int | None]] = []

        def started(pid: int) -> None:
            stat = proc_stat(pid)
            seen.append((pid, None if stat is None else stat[1]))

        result = await run_process(child("segv"), timeout=30, kill_grace=1, on_started=started)
        assert seen == [(result.pid, result.pid)]
        assert result.pid != os.getpgrp()

    @pytest.mark.anyio
    async def test_missing_executable_raises(self, tmp_path: Path) -> None:
        """Failing to spawn is a configuration error and raises OSError."""
        with pytest.raises(OSError):
            await run_process([str(tmp_path / "no-such-tool")], timeout=1, kill_grace=1)


class TestAttemptPool:
    @pytest.mark.anyio
    async def test_never_more_than_max_parallel_children(self, tmp_path: Path) -> None:
        """Six attempts through a pool of two: at most two children run at once, all six finish."""
        pool = AttemptPool(2)
        log = tmp_path / "log"
        peak_busy = 0

        async def attempt(i: int) -> None:
            nonlocal peak_busy
            async with pool.slot(job_id=f"job{i % 3}"):
                peak_busy = max(peak_busy, pool.busy)
                result = await run_process(child("marker", log, i), timeout=30, kill_grace=1)
                assert result.returncode == 0

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(attempt, i)
        running, peak_running, ended = set(), 0, set()
        for line in log.read_text().splitlines():
            what, name = line.split()
            if what == "start":
                running.add(name)
                peak_running = max(peak_running, len(running))
            else:
                running.remove(name)
                ended.add(name)
        assert peak_running <= 2
        assert peak_busy == 2
        assert ended == {str(i) for i in range(6)}
        assert (pool.busy, pool.waiting) == (0, 0)

    @pytest.mark.anyio
    async def test_new_job_goes_before_a_busy_jobs_third_attempt(self) -> None:
        """Job A queues five attempts, then job B one: B runs before A's third."""
        pool = AttemptPool(2)
        order: list[str] = []
        done = {name: anyio.Event() for name in ("A0", "A1", "A2", "A3", "A4", "B0")}

        async def attempt(job: str, name: str) -> None:
            async with pool.slot(job_id=job):
                order.append(name)
                await done[name].wait()

        async with anyio.create_task_group() as tg:
            for name in ("A0", "A1", "A2", "A3", "A4", "B0"):
                tg.start_soon(attempt, name[0], name)
                await anyio.wait_all_tasks_blocked()
            assert (order, pool.busy, pool.waiting) == (["A0", "A1"], 2, 4)
            done["A0"].set()
            await anyio.wait_all_tasks_blocked()
            assert order == ["A0", "A1", "B0"]
            for name in ("A1", "B0", "A2", "A3", "A4"):
                done[name].set()
        assert order == ["A0", "A1", "B0", "A2", "A3", "A4"]
        assert (pool.granted("A"), pool.granted("B")) == (5, 1)

    @pytest.mark.anyio
    async def test_priority_first_then_fewest_granted_then_fifo(self) -> None:
        """Higher priority wins even over a job with fewer grants; equals are served FIFO."""
        pool = AttemptPool(1)
        for _ in range(3):
            async with pool.slot(job_id="busy"):
                pass
        order: list[str] = []
        release = anyio.Event()

        async def attempt(job: str, name: str, priority: int) -> None:
            async with pool.slot(job_id=job, priority=priority):
                order.append(name)
                if name == "holder":
                    await release.wait()

        queue = [
            ("H", "holder", 0),
            ("X", "low-1", 0),
            ("Y", "low-2", 0),
            ("busy", "busy-high", 5),
            ("Z", "mid", 1),
        ]
        async with anyio.create_task_group() as tg:
            for job, name, priority in queue:
                tg.start_soon(attempt, job, name, priority)
                await anyio.wait_all_tasks_blocked()
            release.set()
        assert order == ["holder", "busy-high", "mid", "low-1", "low-2"]

    @pytest.mark.anyio
    async def test_cancelled_waiter_leaves_the_queue(self) -> None:
        """A waiter cancelled before its turn leaves no trace; the slot goes to the next one."""
        pool = AttemptPool(1)
        release = anyio.Event()
        order: list[str] = []

        async def attempt(name: str, scope: anyio.CancelScope | None = None) -> None:
            with scope or anyio.CancelScope():
                async with pool.slot(job_id=name):
                    order.append(name)
                    if name == "holder":
                        await release.wait()

        doomed = anyio.CancelScope()
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, "holder")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(attempt, "doomed", doomed)
            tg.start_soon(attempt, "next")
            await anyio.wait_all_tasks_blocked()
            assert pool.waiting == 2
            doomed.cancel()
            await anyio.wait_all_tasks_blocked()
            assert (pool.busy, pool.waiting) == (1, 1)
            release.set()
        assert order == ["holder", "next"]
        assert (pool.busy, pool.waiting) == (0, 0)

    @pytest.mark.anyio
    async def test_cancelled_holder_frees_its_slot(self) -> None:
        """Cancelling the task holding a slot hands the slot to the next waiter."""
        pool = AttemptPool(1)
        granted = anyio.Event()
        holder_scope = anyio.CancelScope()

        async def holder() -> None:
            with holder_scope:
                async with pool.slot(job_id="A"):
                    await anyio.sleep_forever()

        async def waiter() -> None:
            async with pool.slot(job_id="B"):
                granted.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(holder)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not granted.is_set()
            holder_scope.cancel()
            with anyio.fail_after(5):
                await granted.wait()
        assert (pool.busy, pool.waiting) == (0, 0)

    @pytest.mark.anyio
    async def test_slot_handed_to_a_waiter_being_cancelled_is_passed_on(self) -> None:
        """If a waiter is cancelled in the instant the slot is handed to it, the next waiter gets it."""
        pool = AttemptPool(1)
        order: list[str] = []
        doomed = anyio.CancelScope()
        release = anyio.Event()

        async def holder() -> None:
            async with pool.slot(job_id="A"):
                order.append("A")
                await release.wait()
                doomed.cancel()  # B's cancellation is pending when the slot is handed to it

        async def attempt(name: str, scope: anyio.CancelScope) -> None:
            with scope:
                async with pool.slot(job_id=name):
                    order.append(name)

        async with anyio.create_task_group() as tg:
            tg.start_soon(holder)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(attempt, "B", doomed)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(attempt, "C", anyio.CancelScope())
            await anyio.wait_all_tasks_blocked()
            release.set()
        assert order == ["A", "C"]
        assert (pool.busy, pool.waiting) == (0, 0)

    @pytest.mark.anyio
    async def test_forget_resets_a_jobs_count(self) -> None:
        """A forgotten job starts again from zero grants (bounded bookkeeping for a long daemon)."""
        pool = AttemptPool(1)
        for job in ("A", "A", "B"):
            async with pool.slot(job_id=job):
                pass
        pool.forget("A")
        assert (pool.granted("A"), pool.granted("B")) == (0, 1)

    def test_rejects_empty_pool(self) -> None:
        """A pool without slots would hang every attempt, so it is refused."""
        with pytest.raises(ValueError, match="max_parallel"):
            AttemptPool(0)
