"""Worker faults injected through the real worker (``backend = "fault"``) become outcomes with reasons.

Every fault of the tests' ``fault_backend`` (registered for the worker by its ``worker_env``) runs at once through the real
``sharderd.backends.attempt.run_attempt``: a real ``python -m sharderd.backends.worker`` process per
attempt, a pool of 2 slots, short timeouts and kill grace. The batch runs once per module; each test
checks one fault's outcome and what it left behind (processes, files, memory).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from fault_backend import FAULTS, FLOOD_END, PID_FILE, worker_env

from sharderd.backends.attempt import RESULT_NAME, run_attempt
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest

REPO = Path(__file__).resolve().parents[2]
HANG_TIMEOUT = 2.0
"""Long enough for a loaded machine to start the worker and write its pid file."""
KILL_GRACE = 0.5
TAIL_BYTES = 64 * 1024
"""``run_process``'s default tail."""
FLOOD_BYTES = 100 * 1024 * 1024
MAX_GROWTH_BYTES = 32 * 1024 * 1024
"""Peak RSS growth of this process over the whole batch; buffering the flood would be 100 MiB."""
BOMB_CHILDREN = 20


@dataclass(frozen=True, slots=True)
class Attempt:
    outcome: AttemptOutcome
    workdir: Path
    wall_s: float


@dataclass(frozen=True, slots=True)
class Batch:
    attempts: Mapping[str, Attempt]
    rss_growth_bytes: int
    """Peak RSS during the batch minus RSS before it."""
    busy_after: int
    """Pool slots still held once every attempt returned."""


def _options(fault: str) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "fork_bomb": {"children": BOMB_CHILDREN},
        "stderr_flood": {"bytes": FLOOD_BYTES},
    }
    return {"fault": fault, **extra.get(fault, {})}


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match is not None
    return int(match.group(1))


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Batch:
    """Every fault at once through one pool of 2; peak RSS reset first so the growth is this batch's."""
    root = tmp_path_factory.mktemp("faults")
    pool = AttemptPool(2)
    env = worker_env(
        {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
    )
    env.pop("PYTHONFAULTHANDLER", None)
    attempts: dict[str, Attempt] = {}

    async def one(fault: str) -> None:
        workdir = root / fault
        workdir.mkdir()
        request = AttemptRequest(
            backend="fault",
            model=str(workdir / "model.onnx"),
            artifact=str(workdir / "model.popef"),
            num_devices=2,
            options=_options(fault),
        )
        started = time.monotonic()
        outcome = await run_attempt(
            request,
            workdir,
            pool=pool,
            job_id=fault,
            timeout=HANG_TIMEOUT if fault in ("hang", "fork_bomb") else 60.0,
            kill_grace=KILL_GRACE,
            env=env,
        )
        attempts[fault] = Attempt(outcome, workdir, time.monotonic() - started)

    async def run_all() -> None:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for fault in FAULTS:
                    tg.start_soon(one, fault)

    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    anyio.run(run_all)
    growth = (_status_kib("VmHWM") - before) * 1024
    return Batch(attempts, growth, pool.busy)


def _group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of every live process in group ``pgid``; zombies are dead, awaiting a reaper."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            members.append((int(entry.name), fields[0]))
    return members


def test_every_fault_returns_an_outcome_and_frees_its_slot(batch: Batch) -> None:
    """All faults ran concurrently through 2 slots; each returned an outcome, no slot is left held."""
    assert set(batch.attempts) == set(FAULTS)
    assert batch.busy_after == 0
    for fault, attempt in batch.attempts.items():
        assert attempt.outcome.message, fault


def test_succeed_is_ok(batch: Batch) -> None:
    """The control case: a worker that does nothing wrong reports ok through the real worker."""
    outcome = batch.attempts["succeed"].outcome
    assert (outcome.outcome, outcome.returncode, outcome.signal) == ("ok", 0, None)
    assert outcome.message.startswith("fault backend: nothing injected for ")


def test_segfault_is_crashed_by_signal_11(batch: Batch) -> None:
    """A worker dying of SIGSEGV is crashed, with the signal named, and leaves no core file."""
    attempt = batch.attempts["segfault"]
    outcome = attempt.outcome
    assert (outcome.outcome, outcome.signal, outcome.returncode) == ("crashed", 11, None)
    assert outcome.message == "worker killed by SIGSEGV (11)"
    assert "fault backend: segfault for" in outcome.stderr_tail
    assert not any(p.name.startswith("core") for p in attempt.workdir.iterdir())


def test_hang_is_a_timeout_and_the_worker_is_gone(batch: Batch) -> None:
    """A hung worker is stopped at the timeout (SIGTERM suffices) and reported as timeout."""
    attempt = batch.attempts["hang"]
    outcome = attempt.outcome
    assert outcome.outcome == "timeout"
    assert outcome.message == f"no result within {HANG_TIMEOUT:g} s; process group killed"
    assert outcome.signal == signal.SIGTERM
    assert HANG_TIMEOUT <= outcome.duration_s < HANG_TIMEOUT + KILL_GRACE + 5
    (leader,) = map(int, (attempt.workdir / PID_FILE).read_text().split())
    assert _group_members(leader) == []


def test_fork_bomb_is_a_timeout_and_no_process_of_its_group_survives(batch: Batch) -> None:
    """Children ignoring SIGTERM hold the group past the grace; SIGKILL ends them all, none is left."""
    attempt = batch.attempts["fork_bomb"]
    outcome = attempt.outcome
    assert outcome.outcome == "timeout"
    assert outcome.signal == signal.SIGTERM  # the leader obeys; its children do not
    leader, *children = map(int, (attempt.workdir / PID_FILE).read_text().split())
    assert len(children) == BOMB_CHILDREN
    # The group outlived SIGTERM by the whole grace: the children really ignored it.
    assert outcome.duration_s >= HANG_TIMEOUT + KILL_GRACE * 0.9
    assert _group_members(leader) == []
    for pid in children:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue  # gone and reaped
        fields = stat[stat.rfind(")") + 2 :].split()
        assert fields[0] in "ZX" or int(fields[2]) != leader, f"child {pid} still runs"


def test_stderr_flood_finishes_with_a_bounded_tail(batch: Batch) -> None:
    """100 MiB on stderr: the attempt finishes ok, keeps only the last 64 KiB, and memory stays flat."""
    outcome = batch.attempts["stderr_flood"].outcome
    assert outcome.outcome == "ok"
    assert outcome.message == f"fault backend: wrote {FLOOD_BYTES} bytes to stderr"
    assert len(outcome.stderr_tail.encode()) == TAIL_BYTES
    assert outcome.stderr_tail.endswith(FLOOD_END)
    assert batch.rss_growth_bytes < MAX_GROWTH_BYTES


def test_exit_without_result_is_crashed(batch: Batch) -> None:
    """Exit status 0 without a result file is crashed "without a result", not a success."""
    attempt = batch.attempts["exit_without_result"]
    outcome = attempt.outcome
    assert (outcome.outcome, outcome.returncode, outcome.message) == (
        "crashed",
        0,
        "worker exited without a result",
    )
    assert not (attempt.workdir / RESULT_NAME).exists()


def test_truncated_result_is_crashed_unreadable(batch: Batch) -> None:
    """A half-written result file is crashed "unreadable result", never parsed as a partial success."""
    attempt = batch.attempts["truncated_result"]
    outcome = attempt.outcome
    assert (outcome.outcome, outcome.returncode) == ("crashed", 0)
    assert outcome.message.startswith("unreadable result: ")
    assert (attempt.workdir / RESULT_NAME).stat().st_size > 0


def test_exception_is_crashed_with_the_exception_in_the_stderr_tail(batch: Batch) -> None:
    """An exception in the backend is crashed with exit status 1; the traceback is in the tail."""
    attempt = batch.attempts["exception"]
    outcome = attempt.outcome
    text = f"RuntimeError: fault backend: injected failure for {attempt.workdir / 'model.onnx'}"
    assert (outcome.outcome, outcome.returncode) == ("crashed", 1)
    assert outcome.message == f"worker exited with status 1: {text}"
    assert (
        "Traceback (most recent call last)" in outcome.stderr_tail and text in outcome.stderr_tail
    )
