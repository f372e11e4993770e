"""run_attempt maps every way a worker can end to an AttemptOutcome (fake worker in tests/children/)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import pytest

from sharderd.backends.attempt import REQUEST_NAME, RESULT_NAME, run_attempt
from sharderd.backends.pool import AttemptPool
from sharderd.backends.protocol import AttemptOutcome, AttemptRequest, OomInfo

FAKE_WORKER = Path(__file__).parent.parent / "children" / "fake_worker.py"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def request_for(workdir: Path) -> AttemptRequest:
    return AttemptRequest(
        backend="fake",
        model=str(workdir / "model.onnx"),
        artifact=str(workdir / "model.popef"),
        num_devices=2,
    )


async def attempt(
    mode: str, workdir: Path, *, pool: AttemptPool | None = None, timeout: float = 30
) -> AttemptOutcome:
    return await run_attempt(
        request_for(workdir),
        workdir,
        pool=pool or AttemptPool(1),
        job_id="job-1",
        timeout=timeout,
        kill_grace=0.5,
        argv_prefix=[sys.executable, str(FAKE_WORKER), mode],
    )


@pytest.mark.anyio
async def test_valid_result_is_returned_with_process_facts(tmp_path: Path) -> None:
    """A worker's own result comes back, with duration, exit status and stderr tail filled in."""
    outcome = await attempt("ok", tmp_path)
    assert outcome.outcome == "ok"
    assert outcome.message == f"compiled {tmp_path / 'model.onnx'}"
    assert outcome.artifact == str(tmp_path / "model.popef")
    assert (outcome.returncode, outcome.signal) == (0, None)
    assert outcome.duration_s > 0
    assert outcome.stderr_tail == f"fake worker: ok for {tmp_path / 'model.onnx'}\n"
    assert AttemptRequest.read(tmp_path / REQUEST_NAME) == request_for(tmp_path)


@pytest.mark.anyio
async def test_oom_result_keeps_its_details(tmp_path: Path) -> None:
    """A compiler verdict with nested data (out of memory on a tile) survives the file boundary."""
    outcome = await attempt("oom", tmp_path)
    assert outcome.outcome == "oom"
    assert outcome.oom == OomInfo("tile", device=1, tile=17, bytes_used=700000, tile_bytes=638976)


@pytest.mark.parametrize(
    ("mode", "returncode", "signum", "message"),
    [
        ("no-result", 0, None, "worker exited without a result"),
        ("truncated", 0, None, "unreadable result: "),
        ("not-object", 0, None, "unreadable result: expected a JSON object, got list"),
        ("claim-timeout", 0, None, "unreadable result: a worker may not claim outcome 'timeout'"),
        ("exit3", 3, None, "worker exited with status 3: poprt: fatal: no IPU available"),
        ("segv", None, signal.SIGSEGV, "worker killed by SIGSEGV (11)"),
    ],
)
@pytest.mark.anyio
async def test_broken_worker_is_a_crashed_outcome(
    tmp_path: Path, mode: str, returncode: int | None, signum: int | None, message: str
) -> None:
    """Every way a worker can fail without a usable result is "crashed" with a reason, not raised."""
    outcome = await attempt(mode, tmp_path)
    assert outcome.outcome == "crashed"
    assert outcome.message.startswith(message)
    assert (outcome.returncode, outcome.signal) == (returncode, signum)
    assert f"fake worker: {mode}" in outcome.stderr_tail


@pytest.mark.anyio
async def test_hung_worker_is_a_timeout(tmp_path: Path) -> None:
    """A worker exceeding the timeout is killed and reported as "timeout"."""
    outcome = await attempt("hang", tmp_path, timeout=0.5)
    assert outcome.outcome == "timeout"
    assert outcome.message == "no result within 0.5 s; process group killed"
    assert outcome.signal == signal.SIGTERM
    assert 0.5 <= outcome.duration_s < 5


@pytest.mark.anyio
async def test_stale_result_from_earlier_attempt_is_ignored(tmp_path: Path) -> None:
    """A result.json left by an earlier attempt never passes for this one's."""
    AttemptOutcome("ok", "from last time").write(tmp_path / RESULT_NAME)
    outcome = await attempt("no-result", tmp_path)
    assert (outcome.outcome, outcome.message) == ("crashed", "worker exited without a result")


@pytest.mark.anyio
async def test_cancellation_propagates_and_frees_the_slot(tmp_path: Path) -> None:
    """Cancelling the caller kills the worker, re-raises, and returns the pool slot."""
    pool = AttemptPool(1)
    returned: list[AttemptOutcome] = []

    async def caller() -> None:
        returned.append(await attempt("hang", tmp_path, pool=pool, timeout=60))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            while not (tmp_path / "hanging").exists():
                await anyio.sleep(0.01)
            pid = int((tmp_path / "hanging").read_text())
            assert Path(f"/proc/{pid}").exists()
            assert pool.busy == 1
            tg.cancel_scope.cancel()
    assert returned == []
    assert not Path(f"/proc/{pid}").exists()
    assert (pool.busy, pool.waiting) == (0, 0)
